//! The commands in the README and the user docs are real: every `trident …` line of their
//! shell code blocks parses with the command line (subcommand, flags and values; nothing
//! runs), every run config it names (`--config`) exists and validates, and every file of
//! the repository a code block names (`examples/…`, `scripts/…`, `benches/…`, `crates/…`,
//! `docs/…`) exists.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The documents checked: the README and every user doc.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![root().join("README.md")];
    let mut more: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    more.sort();
    docs.extend(more);
    docs
}

/// The lines of a document's shell code blocks (```sh, ```bash, ```console), continuation
/// lines joined, each with its line number.
fn shell_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_shell = None::<bool>;
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(fence) = trimmed.strip_prefix("```") {
            in_shell = match in_shell {
                None => Some(matches!(fence.trim(), "sh" | "bash" | "console" | "shell")),
                Some(_) => None,
            };
            continue;
        }
        if in_shell != Some(true) {
            continue;
        }
        let (n, mut joined) = pending.take().unwrap_or((i + 1, String::new()));
        joined.push_str(line.trim_end().trim_end_matches('\\'));
        joined.push(' ');
        if line.trim_end().ends_with('\\') {
            pending = Some((n, joined));
        } else {
            out.push((n, joined));
        }
    }
    out
}

/// Shell words of `line` up to its comment, pipe, redirection or separator (quotes
/// respected; no expansion).
fn words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quote = None::<char>;
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '#') if !in_word => break,
            // `<a placeholder>`: one word, a template.
            (None, '<') if chars.peek().is_some_and(|n| !n.is_whitespace() && *n != '(') => {
                word.push('<');
                for c in chars.by_ref() {
                    word.push(c);
                    if c == '>' {
                        break;
                    }
                }
                in_word = true;
            }
            (None, '|' | ';' | '>' | '<' | '&') => break,
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        // A redirection's file descriptor (`2>`) is not a word.
        if !word.chars().all(|c| c.is_ascii_digit()) || word.is_empty() {
            words.push(word);
        }
    }
    words
}

/// The `trident` command of `words`: from the word that runs it on, when that word is the
/// line's command (`trident`, `target/release/trident`, after `VAR=value` assignments or
/// a launcher such as `mpirun -np 4`); `None` for other commands, which may name
/// `trident` as an argument.
fn trident_command(words: &[String]) -> Option<Vec<String>> {
    let is_trident = |w: &String| w == "trident" || w.ends_with("/trident");
    let is_assignment = |w: &String| {
        w.split_once('=').is_some_and(|(k, _)| {
            !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
    };
    let first = words.iter().position(|w| !is_assignment(w))?;
    if is_trident(&words[first]) {
        return Some(words[first..].to_vec());
    }
    let launchers = ["mpirun", "exec", "time", "nice", "env", "sudo", "timeout"];
    if !launchers.contains(&words[first].as_str()) {
        return None;
    }
    let at = first + words[first..].iter().position(is_trident)?;
    Some(words[at..].to_vec())
}

/// A path into the repository that should exist (not an output such as `runs/…`, nor
/// fetched data, nor a placeholder with `<…>`, `$…` or `…`).
fn repository_path(word: &str) -> Option<&str> {
    let word = word.trim_end_matches([',', ')', ':']);
    let prefixes = ["examples/", "scripts/", "benches/", "crates/", "docs/"];
    (prefixes.iter().any(|p| word.starts_with(p))
        && !word.contains(['<', '$', '*', '{'])
        && !word.contains('…'))
    .then_some(word)
}

#[test]
fn documented_commands_parse_and_name_real_files() {
    let mut problems = Vec::new();
    let mut commands = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).expect("a readable document");
        let name = doc.strip_prefix(root()).unwrap_or(&doc).display().to_string();
        for (line, shell) in shell_lines(&text) {
            let words = words(&shell);
            let at = format!("{name}:{line}");
            for w in &words {
                if let Some(path) = repository_path(w) {
                    if !root().join(path).exists() {
                        problems.push(format!("{at}: `{path}` does not exist"));
                    }
                }
            }
            let Some(command) = trident_command(&words) else {
                continue;
            };
            if command.iter().any(|w| w.contains(['<', '$', '…'])) {
                continue; // a template, not a command
            }
            commands += 1;
            if let Err(e) = trident_cli::check_args(&command) {
                let first = e.to_string().lines().next().unwrap_or_default().to_string();
                problems.push(format!("{at}: `{}`: {first}", command.join(" ")));
                continue;
            }
            if let Some(i) = command.iter().position(|w| w == "--config") {
                let Some(config) = command.get(i + 1) else {
                    continue;
                };
                let file = root().join(config);
                if config.starts_with("examples/") {
                    let checked = match command.get(1).map(String::as_str) {
                        Some("rl") => trident_rl::config::RlConfig::read(&file).map(|_| ()),
                        _ => trident_tasks::config::RunConfig::read(&file)
                            .map(|_| ())
                            .map_err(|e| format!("{e:#}")),
                    };
                    if let Err(e) = checked {
                        problems.push(format!("{at}: {config}: {e}"));
                    }
                }
            }
        }
    }
    assert!(
        commands >= 10,
        "only {commands} trident commands found: is the parser right?"
    );
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_line_parser_reads_shell_as_written() {
    let w = words(r#"trident predict --model runs/x/best "two words" 'x # y' # a comment"#);
    assert_eq!(
        w,
        [
            "trident",
            "predict",
            "--model",
            "runs/x/best",
            "two words",
            "x # y"
        ]
    );
    let w = words("trident train --config <a file + bf16>");
    assert_eq!(w, ["trident", "train", "--config", "<a file + bf16>"]);
    let w = words("python3 benches/cold_start.py trident");
    assert_eq!(trident_command(&w), None);
    let w = words("TRIDENT_BIN=target/release/trident benches/gan_epochs.sh 2");
    assert_eq!(trident_command(&w), None);
    let w = words("mpirun -np 4 target/release/trident train --config a.toml 2>&1 | tail");
    assert_eq!(
        trident_command(&w).unwrap(),
        ["target/release/trident", "train", "--config", "a.toml"]
    );
    let lines = shell_lines("```sh\ntrident bench -u h \\\n  -m simple\n```\n```toml\ntrident = 1\n```\n");
    assert_eq!(lines.len(), 1);
    assert_eq!(
        words(&lines[0].1),
        ["trident", "bench", "-u", "h", "-m", "simple"]
    );
    assert!(trident_cli::check_args(["trident", "train", "--no-such-flag"]).is_err());
    assert!(trident_cli::check_args(["trident", "serve", "--model-repository", "r"]).is_ok());
}

/// GitHub's anchor of a heading: lower case, punctuation dropped (but `-` and `_`), spaces
/// as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a markdown file's headings (outside code blocks).
fn anchors(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            out.push(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

#[test]
fn documented_links_reach_their_files_and_headings() {
    let mut problems = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).expect("a readable document");
        let name = doc.strip_prefix(root()).unwrap_or(&doc).display().to_string();
        let dir = doc.parent().expect("a folder");
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = &rest[..end];
            if target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
                continue;
            }
            let (file, fragment) = target.split_once('#').unwrap_or((target, ""));
            let path = if file.is_empty() {
                doc.clone()
            } else {
                dir.join(file)
            };
            if !path.exists() {
                problems.push(format!("{name}: link to `{target}`: no such file"));
                continue;
            }
            if !fragment.is_empty() && path.extension().is_some_and(|e| e == "md") {
                let linked = std::fs::read_to_string(&path).expect("a readable document");
                if !anchors(&linked).iter().any(|a| a == fragment) {
                    problems.push(format!("{name}: link to `{target}`: no such heading"));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} broken links:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn anchors_are_githubs() {
    assert_eq!(anchor(" Train, evaluate, predict"), "train-evaluate-predict");
    assert_eq!(
        anchor(" Load-test a server: `trident bench`"),
        "load-test-a-server-trident-bench"
    );
}
