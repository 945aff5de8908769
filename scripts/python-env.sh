# Sourced by the scripts that need Python (quickstart, test, demo, fetch-data.sh, .ci/run):
# puts the project's virtual environment first on PATH, creating it on first use, so
# `python3 -m pip install` works on a distribution whose own Python refuses it (Debian 12,
# Ubuntu 24.04: PEP 668's "externally-managed-environment") and nothing is installed into
# the system's or the user's site. `trident` finds ONNX Runtime's library there through
# VIRTUAL_ENV (and, for the binary scripts/quickstart installs, the path built into it).
#
# TRIDENT_VENV=DIR uses another environment (created if absent); the default is .venv at
# the repository's root.
trident_venv="${TRIDENT_VENV:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv}"
if [ ! -x "$trident_venv/bin/python3" ] || ! "$trident_venv/bin/python3" -m pip --version >/dev/null 2>&1; then
  rm -rf "$trident_venv"
  if ! python3 -m venv "$trident_venv" >/dev/null 2>&1; then
    # Debian and Ubuntu split the venv module's pip bootstrap into python3-venv.
    rm -rf "$trident_venv"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "== installing python3-venv (apt): the project's Python packages go into $trident_venv"
      (apt-get install -y -q python3-venv >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >/dev/null; })
      python3 -m venv "$trident_venv"
    else
      echo "error: 'python3 -m venv $trident_venv' failed: install python3-venv (sudo apt-get install python3-venv)," >&2
      echo "       or set TRIDENT_VENV to an existing virtual environment" >&2
      exit 1
    fi
  fi
  "$trident_venv/bin/python3" -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
fi
export VIRTUAL_ENV="$trident_venv"
case ":$PATH:" in
  *":$trident_venv/bin:"*) ;;
  *) export PATH="$trident_venv/bin:$PATH" ;;
esac
hash -r
