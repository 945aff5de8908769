#!/usr/bin/env bash
# Check the container image's runtime layout without a container daemon.
#
# Assembles the file set of deploy/Dockerfile's final stage in a temporary directory
#   ROOT/usr/local/bin/trident
#   ROOT/opt/trident/lib/libonnxruntime.so.1.32.0
#   ROOT/models/simple             (tests/e2e/official/models/simple)
# then
#   1. checks that `ldd` of the binary and of the library resolves only to libraries that
#      gcr.io/distroless/cc-debian12 has (glibc's, libstdc++, libgcc_s, libgomp, libssl3),
#      listing anything else, and that neither asks for newer glibc / libstdc++ symbol
#      versions than Debian 12 has (GLIBC_2.36, GLIBCXX_3.4.30);
#   2. runs the binary from ROOT under `env -i` with only the image's environment (PATH,
#      ORT_DYLIB_PATH, ORT_DISABLE_TELEMETRY, HOME=ROOT/home), on free ports, forcing
#      ONNX Runtime (--onnx-engine=ort);
#   3. waits for GET /v2/health/ready == 200, checks /v2/health/live and /metrics, runs
#      one inference over HTTP (simple: INPUT0 + INPUT1, INPUT0 - INPUT1, INT32 [1,16]);
#   4. stops it with SIGTERM and checks exit status 0, and that nothing was written
#      under $HOME (ONNX Runtime's telemetry database is off).
#
# Usage: deploy/check_image_layout.sh [--bundle-extra-libs] [--keep] [BINARY [LIBONNXRUNTIME]]
#   BINARY          default target/release/trident, else target/debug/trident (must be
#                   built with `--features ort`)
#   LIBONNXRUNTIME  libonnxruntime.so.1.32.0, or an onnxruntime wheel (.whl) to take it
#                   from; default $ORT_LIB, else the installed `onnxruntime` Python package
#   --bundle-extra-libs  do what deploy/Dockerfile does: copy libraries missing from
#                   distroless into ROOT/opt/trident/lib (LD_LIBRARY_PATH) and go on,
#                   with a warning, instead of failing at step 1
#   --keep          keep the temporary directory (its path is printed)
# Exit status: 0 pass, 1 a check failed, 2 usage, 77 no ONNX Runtime library found (skip).
set -euo pipefail

ORT_VERSION=1.32.0
ORT_SO=libonnxruntime.so.${ORT_VERSION}
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STARTUP_TIMEOUT_S=${STARTUP_TIMEOUT_S:-60}
SHUTDOWN_TIMEOUT_S=${SHUTDOWN_TIMEOUT_S:-40}

# Sonames present in gcr.io/distroless/cc-debian12 (glibc 2.36, libgcc-s1, libstdc++6,
# libgomp1, libssl3), plus the vDSO and the dynamic loader.
ALLOWED='^(linux-vdso\.so\.1|linux-gate\.so\.1|ld-linux[-a-z0-9_.]*\.so\.[0-9]+|libc\.so\.6|libm\.so\.6|libdl\.so\.2|librt\.so\.1|libpthread\.so\.0|libresolv\.so\.2|libstdc\+\+\.so\.6|libgcc_s\.so\.1|libgomp\.so\.1|libssl\.so\.3|libcrypto\.so\.3)$'
MAX_GLIBC=2.36
MAX_GLIBCXX=3.4.30

bundle=0
keep=0
args=()
for a in "$@"; do
  case "$a" in
    --bundle-extra-libs) bundle=1 ;;
    --keep) keep=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "unknown option $a" >&2; exit 2 ;;
    *) args+=("$a") ;;
  esac
done

say() { printf '%s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

# --- inputs ---------------------------------------------------------------------------
binary=${args[0]:-}
if [[ -z $binary ]]; then
  if [[ -x $REPO_ROOT/target/release/trident ]]; then binary=$REPO_ROOT/target/release/trident
  else binary=$REPO_ROOT/target/debug/trident; fi
fi
[[ -x $binary ]] || fail "no trident binary at $binary (cargo build --release -p trident-cli --features ort)"

ort=${args[1]:-${ORT_LIB:-}}
if [[ -z $ort ]]; then
  py=$(command -v python3 || true)
  if [[ -n $py ]]; then
    ort=$("$py" -c "
import importlib.util, os
spec = importlib.util.find_spec('onnxruntime')
if spec and spec.submodule_search_locations:
    print(os.path.join(list(spec.submodule_search_locations)[0], 'capi', '$ORT_SO'))
" 2>/dev/null || true)
  fi
fi
if [[ -z $ort || ! -f $ort ]]; then
  say "SKIP: no $ORT_SO (pip install onnxruntime==$ORT_VERSION, or pass its path / a wheel as the 2nd argument)"
  exit 77
fi

root=$(mktemp -d "${TMPDIR:-/tmp}/trident-image.XXXXXX")
server_pid=
cleanup() {
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then kill -KILL "$server_pid" 2>/dev/null || true; fi
  if [[ $keep == 1 ]]; then say "kept $root"; else rm -rf "$root"; fi
}
trap cleanup EXIT

# --- the image's file set -------------------------------------------------------------
mkdir -p "$root/usr/local/bin" "$root/opt/trident/lib" "$root/models" "$root/home"
install -m 0755 "$binary" "$root/usr/local/bin/trident"
if [[ $ort == *.whl ]]; then
  python3 -c "import sys, zipfile; open(sys.argv[2], 'wb').write(zipfile.ZipFile(sys.argv[1]).read('onnxruntime/capi/$ORT_SO'))" \
    "$ort" "$root/opt/trident/lib/$ORT_SO"
else
  cp -L "$ort" "$root/opt/trident/lib/$ORT_SO"
fi
chmod 0644 "$root/opt/trident/lib/$ORT_SO"
cp -r "$REPO_ROOT/tests/e2e/official/models/simple" "$root/models/simple"
bin=$root/usr/local/bin/trident
lib=$root/opt/trident/lib/$ORT_SO
say "layout: $root"
say "  usr/local/bin/trident <- $binary"
say "  opt/trident/lib/$ORT_SO <- $ort"
say "  models/simple <- tests/e2e/official/models/simple"

# --- 1. shared libraries --------------------------------------------------------------
extras=()
check_ldd() {
  local file=$1 out name path
  out=$(ldd "$file" 2>&1) || fail "ldd $file: $out"
  while read -r line; do
    [[ -z $line ]] && continue
    name=${line%% *}
    name=${name##*/}               # /lib64/ld-linux-x86-64.so.2 (0x...) -> ld-linux-x86-64.so.2
    if [[ $line == *"not found"* ]]; then fail "$(basename "$file") needs $name, which is not found"; fi
    if [[ $name =~ $ALLOWED ]]; then continue; fi
    path=$(awk '{ print $3 }' <<<"$line")
    extras+=("$(basename "$file"): $name => $path")
  done <<<"$out"
}
check_ldd "$bin"
check_ldd "$lib"
if ((${#extras[@]})); then
  say "libraries not in gcr.io/distroless/cc-debian12:"
  printf '  %s\n' "${extras[@]}"
  if [[ $bundle == 0 ]]; then
    fail "${#extras[@]} shared libraries would be missing from the image (--bundle-extra-libs copies them in, as deploy/Dockerfile does)"
  fi
  for e in "${extras[@]}"; do
    path=${e##*=> }
    [[ $path == /* ]] || fail "cannot bundle $e"
    cp -L "$path" "$root/opt/trident/lib/"
  done
  resolved=$(env -i LD_LIBRARY_PATH="$root/opt/trident/lib" ldd "$bin")
  for e in "${extras[@]}"; do
    name=${e#*: }; name=${name%% =>*}
    grep -q "$name => $root/opt/trident/lib/$name" <<<"$resolved" || fail "$name does not resolve to the bundled copy: $resolved"
  done
  say "WARNING: bundled ${#extras[@]} libraries into opt/trident/lib (LD_LIBRARY_PATH), as deploy/Dockerfile does"
else
  say "ldd: trident and $ORT_SO need only distroless cc's libraries"
fi

# Symbol versions: nothing newer than Debian 12's glibc and libstdc++.
if command -v objdump >/dev/null; then
  for f in "$bin" "$lib"; do
    syms=$(objdump -T "$f" 2>/dev/null || true)
    g=$(grep -o 'GLIBC_[0-9][0-9.]*' <<<"$syms" | sed 's/GLIBC_//' | sort -uV | tail -1 || true)
    x=$(grep -o 'GLIBCXX_[0-9][0-9.]*' <<<"$syms" | sed 's/GLIBCXX_//' | sort -uV | tail -1 || true)
    if [[ -n $g && $(printf '%s\n%s\n' "$g" "$MAX_GLIBC" | sort -V | tail -1) != "$MAX_GLIBC" ]]; then
      fail "$(basename "$f") needs GLIBC_$g; distroless cc-debian12 has $MAX_GLIBC (build on bookworm)"
    fi
    if [[ -n $x && $(printf '%s\n%s\n' "$x" "$MAX_GLIBCXX" | sort -V | tail -1) != "$MAX_GLIBCXX" ]]; then
      fail "$(basename "$f") needs GLIBCXX_$x; distroless cc-debian12 has $MAX_GLIBCXX"
    fi
    say "symbol versions: $(basename "$f") needs GLIBC_${g:-none} GLIBCXX_${x:-none}"
  done
else
  say "objdump not found: symbol versions not checked"
fi

# --- 2. run it as the image would -----------------------------------------------------
env_args=(
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  HOME="$root/home"
  ORT_DYLIB_PATH="$lib"
  ORT_DISABLE_TELEMETRY=1
)
((${#extras[@]})) && env_args+=(LD_LIBRARY_PATH="$root/opt/trident/lib")
log=$root/server.log
(cd "$root" && exec env -i "${env_args[@]}" "$bin" serve \
  --model-repository="$root/models" --onnx-engine=ort \
  --http-address=127.0.0.1 --grpc-address=127.0.0.1 \
  --http-port=0 --grpc-port=0 --metrics-port=0) >"$log" 2>&1 &
server_pid=$!
say "started: env -i ${env_args[*]} $bin serve ... (pid $server_pid)"

port_of() { { sed 's/\x1b\[[0-9;]*[A-Za-z]//g' "$log" | grep -o "$1 service listening on [0-9.]*:[0-9]*" || true; } | head -1 | sed 's/.*://'; }
deadline=$((SECONDS + STARTUP_TIMEOUT_S))
http_port=
while [[ -z $http_port ]]; do
  kill -0 "$server_pid" 2>/dev/null || { cat "$log" >&2; fail "trident exited during start-up"; }
  ((SECONDS < deadline)) || { cat "$log" >&2; fail "no 'HTTP service listening on' line in ${STARTUP_TIMEOUT_S}s"; }
  sleep 0.2
  http_port=$(port_of HTTP)
done
metrics_port=$(port_of metrics)
base=http://127.0.0.1:$http_port
status() { curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$1" || true; }
until [[ $(status "$base/v2/health/ready") == 200 ]]; do
  kill -0 "$server_pid" 2>/dev/null || { cat "$log" >&2; fail "trident exited before it was ready"; }
  ((SECONDS < deadline)) || { cat "$log" >&2; fail "/v2/health/ready not 200 in ${STARTUP_TIMEOUT_S}s"; }
  sleep 0.2
done
say "ready: GET $base/v2/health/ready -> 200"
[[ $(status "$base/v2/health/live") == 200 ]] || fail "/v2/health/live is not 200"
if [[ -n $metrics_port ]]; then
  [[ $(status "http://127.0.0.1:$metrics_port/metrics") == 200 ]] || fail "GET /metrics is not 200"
  say "metrics: GET http://127.0.0.1:$metrics_port/metrics -> 200"
fi
grep -q "ONNX Runtime loaded from $lib" "$log" || { cat "$log" >&2; fail "the log does not say ONNX Runtime was loaded from $lib"; }
grep -q 'ready model=simple.*backend="onnxruntime"' "$log" || { cat "$log" >&2; fail "model simple is not served by onnxruntime"; }

# --- 3. one inference -----------------------------------------------------------------
body='{"inputs":[
 {"name":"INPUT0","datatype":"INT32","shape":[1,16],"data":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]},
 {"name":"INPUT1","datatype":"INT32","shape":[1,16],"data":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}]}'
resp=$(curl -sS --max-time 10 -H 'Content-Type: application/json' -d "$body" "$base/v2/models/simple/infer") \
  || fail "POST /v2/models/simple/infer failed"
python3 - "$resp" <<'EOF' || fail "unexpected inference response: $resp"
import json, sys
out = {o["name"]: o for o in json.loads(sys.argv[1])["outputs"]}
a, b = list(range(16)), [1] * 16
assert out["OUTPUT0"]["datatype"] == "INT32" and out["OUTPUT0"]["shape"] == [1, 16]
assert out["OUTPUT0"]["data"] == [x + y for x, y in zip(a, b)], out["OUTPUT0"]
assert out["OUTPUT1"]["data"] == [x - y for x, y in zip(a, b)], out["OUTPUT1"]
EOF
say "infer: POST /v2/models/simple/infer -> OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1"

# --- 4. SIGTERM -----------------------------------------------------------------------
kill -TERM "$server_pid"
deadline=$((SECONDS + SHUTDOWN_TIMEOUT_S))
while kill -0 "$server_pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
kill -0 "$server_pid" 2>/dev/null && fail "still running ${SHUTDOWN_TIMEOUT_S}s after SIGTERM"
rc=0
wait "$server_pid" || rc=$?
server_pid=
((rc == 0)) || { cat "$log" >&2; fail "exit status $rc after SIGTERM (want 0)"; }
say "SIGTERM: exit status 0"
written=$(find "$root/home" -mindepth 1 | head -5)
[[ -z $written ]] || fail "files written under \$HOME: $written"
say "HOME: nothing written"
say "PASS: image layout ($(basename "$binary"), $ORT_SO)"
