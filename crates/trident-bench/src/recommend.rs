//! `trident recommend`: measure candidate serving configurations of one model and rank
//! them by throughput within a latency SLO.
//!
//! Each candidate is the model's `config.pbtxt` with its `dynamic_batching` and
//! `instance_group` blocks replaced, written into a temporary copy of the model's
//! directory and served by a `trident serve` process started for it. Each is loaded with
//! the same closed-loop concurrency ladder (1, 2, 4, … up to `max_concurrency`), which
//! stops at the first level whose p99 exceeds the SLO or whose throughput grows less than
//! 5 % over the previous level; a candidate's result is its best level within the SLO.
//!
//! The search: first batching (off, then on with each queue delay) at one instance; then
//! more instances only for the batching settings not dominated at one instance (another
//! setting had both more throughput within the SLO and lower p99 there). Every measured
//! candidate is reported.

use crate::client::{Client, Protocol};
use crate::inputs::{prepare, Encoding, Source};
use crate::run::{Load, Row, Settings, Target};
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One configuration to try.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Candidate {
    /// ONNX engine (`ort` or `tract`, the `trident.onnx_engine` parameter); `None`: as
    /// the model's configuration and the server decide.
    pub engine: Option<String>,
    /// Dynamic batching's `max_queue_delay_microseconds`; `None`: batching off.
    pub queue_delay_us: Option<u64>,
    /// Dynamic batching's `preferred_batch_size` (one size); `None`: not set.
    pub preferred_batch_size: Option<u32>,
    /// `instance_group` count (KIND_CPU).
    pub instances: u32,
    /// The protocol clients use (HTTP/REST or Triton's gRPC).
    pub protocol: Protocol,
}

impl Candidate {
    /// Short name, e.g. `ort, batching 500us (preferred 8), 2 instance(s)`.
    pub fn name(&self) -> String {
        let engine = self.engine.as_ref().map_or(String::new(), |e| format!("{e}, "));
        let batching = match (self.queue_delay_us, self.preferred_batch_size) {
            (Some(d), Some(p)) => format!("batching {d}us (preferred {p})"),
            (Some(d), None) => format!("batching {d}us"),
            (None, _) => "no batching".to_string(),
        };
        let protocol = match self.protocol {
            Protocol::Http => "",
            Protocol::Grpc => ", over gRPC",
        };
        format!("{engine}{batching}, {} instance(s){protocol}", self.instances)
    }
}

/// What the search measured for one candidate.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Outcome {
    /// The configuration.
    pub candidate: Candidate,
    /// The best level within the SLO, if any.
    pub best: Option<Row>,
    /// Every level measured.
    pub levels: Vec<Row>,
    /// Peak resident memory of the server process, MiB.
    pub server_peak_rss_mib: f64,
    /// Server CPU over the candidate's measurement, % of one core.
    pub server_cpu_pct: f64,
    /// Price of a million inferences at the best level, from the hourly price.
    pub cost_per_million: Option<f64>,
    /// Servers needed for the target rate at the best level's throughput.
    pub instances_for_target: Option<u64>,
}

/// Search settings.
#[derive(Debug, Clone)]
pub struct Search {
    /// The `trident` binary to start servers with.
    pub trident: PathBuf,
    /// Repository holding the model.
    pub repository: PathBuf,
    /// Model name.
    pub model: String,
    /// p99 SLO, µs.
    pub p99_us: f64,
    /// Queue delays to try with batching on (µs).
    pub queue_delays_us: Vec<u64>,
    /// Preferred batch sizes to try with batching on (each alone).
    pub preferred_batch_sizes: Vec<u32>,
    /// Instance counts to try.
    pub instances: Vec<u32>,
    /// ONNX engines to try; empty: the configured one only.
    pub engines: Vec<String>,
    /// Protocols to try (the first for every stage, the others for the settings kept);
    /// empty: HTTP.
    pub protocols: Vec<Protocol>,
    /// Highest concurrency of the ladder.
    pub max_concurrency: u32,
    /// Measurement windows.
    pub settings: Settings,
    /// Inputs.
    pub source: Source,
    /// Cost of one server per hour.
    pub price_per_hour: Option<f64>,
    /// Rate to provision for, inferences per second.
    pub target_rps: Option<f64>,
}

/// Replaces the `dynamic_batching` and `instance_group` blocks of a `config.pbtxt`, and
/// the `trident.onnx_engine` parameter when the candidate names an engine.
pub fn rewrite_config(text: &str, c: &Candidate) -> Result<String> {
    let mut out = remove_blocks(text, "dynamic_batching", |_| true)?;
    out = remove_blocks(&out, "instance_group", |_| true)?;
    if c.engine.is_some() {
        out = remove_blocks(&out, "parameters", |block| block.contains(ENGINE_KEY))?;
    }
    let mut s = out.trim_end().to_string();
    s.push('\n');
    if let Some(d) = c.queue_delay_us {
        s.push_str("dynamic_batching {\n");
        if let Some(p) = c.preferred_batch_size {
            s.push_str(&format!("  preferred_batch_size: [ {p} ]\n"));
        }
        s.push_str(&format!("  max_queue_delay_microseconds: {d}\n}}\n"));
    }
    s.push_str(&format!(
        "instance_group [\n  {{\n    count: {}\n    kind: KIND_CPU\n  }}\n]\n",
        c.instances
    ));
    if let Some(e) = &c.engine {
        s.push_str(&format!(
            "parameters {{\n  key: \"{ENGINE_KEY}\"\n  value: {{ string_value: \"{e}\" }}\n}}\n"
        ));
    }
    Ok(s)
}

const ENGINE_KEY: &str = "trident.onnx_engine";

/// Removes each top-level `key { … }` or `key [ … ]` block (nested brackets; `#` comments
/// and strings respected) for which `select(block text)` is true.
fn remove_blocks(text: &str, key: &str, select: impl Fn(&str) -> bool) -> Result<String> {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let (mut i, mut depth) = (0, 0i32);
    while i < bytes.len() {
        let c = bytes[i] as char;
        match c {
            '#' => {
                let end = text[i..].find('\n').map_or(bytes.len(), |e| i + e);
                out.push_str(&text[i..end]);
                i = end;
                continue;
            }
            '"' | '\'' => {
                let mut j = i + 1;
                while j < bytes.len() && bytes[j] as char != c {
                    j += if bytes[j] == b'\\' { 2 } else { 1 };
                }
                let end = (j + 1).min(bytes.len());
                out.push_str(&text[i..end]);
                i = end;
                continue;
            }
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            _ => {}
        }
        let at_word = depth == 0
            && text[i..].starts_with(key)
            && (i == 0 || !(bytes[i - 1] as char).is_alphanumeric() && bytes[i - 1] != b'_');
        if at_word {
            let rest = text[i + key.len()..].trim_start();
            let rest = rest.strip_prefix(':').map(str::trim_start).unwrap_or(rest);
            if let Some(open) = rest.chars().next().filter(|c| *c == '{' || *c == '[') {
                let start = text.len() - rest.len();
                let close = if open == '{' { '}' } else { ']' };
                let mut d = 0;
                let mut end = None;
                for (k, ch) in text[start..].char_indices() {
                    if ch == open || ch == '{' || ch == '[' {
                        d += 1;
                    } else if ch == close || ch == '}' || ch == ']' {
                        d -= 1;
                        if d == 0 {
                            end = Some(start + k + 1);
                            break;
                        }
                    }
                }
                let Some(end) = end else {
                    bail!("config.pbtxt: `{key}` block is not closed")
                };
                if select(&text[start..end]) {
                    i = end;
                    continue;
                }
                out.push_str(&text[i..end]);
                i = end;
                continue;
            }
        }
        out.push(c);
        i += c.len_utf8();
    }
    Ok(out)
}

/// A `trident serve` process listening on an ephemeral loopback port (metrics off), killed
/// when dropped.
pub struct ServeProcess {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// `127.0.0.1:PORT` of the gRPC service.
    pub grpc_url: String,
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ServeProcess {
    /// Starts `trident serve` from the binary `trident` on `repository` and waits (60 s at
    /// most) for its HTTP address; an early exit returns the server's log as the error.
    pub fn spawn(trident: &Path, repository: &Path) -> Result<Self> {
        let mut child = Command::new(trident)
            .args(["serve", "--model-repository"])
            .arg(repository)
            .args([
                "--http-address",
                "127.0.0.1",
                "--http-port",
                "0",
                "--grpc-address",
                "127.0.0.1",
                "--grpc-port",
                "0",
                "--allow-metrics",
                "false",
            ])
            .env("NO_COLOR", "1")
            .env("TRIDENT_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", trident.display()))?;
        let stderr = child.stderr.take().context("server stderr")?;
        // From here on, dropping `server` stops the process.
        let mut server = ServeProcess {
            child,
            url: String::new(),
            grpc_url: String::new(),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        // Reads the log to the end, so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut log = Vec::new();
            for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
                if let Some(addr) = line.split("gRPC service listening on ").nth(1) {
                    let _ = tx.send(Ok((
                        "gRPC",
                        addr.split_whitespace().next().unwrap_or("").to_string(),
                    )));
                }
                if let Some(addr) = line.split("HTTP service listening on ").nth(1) {
                    let _ = tx.send(Ok((
                        "HTTP",
                        addr.split_whitespace().next().unwrap_or("").to_string(),
                    )));
                }
                log.push(line);
            }
            let _ = tx.send(Err(log.join("\n")));
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        while server.url.is_empty() || server.grpc_url.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(Ok(("HTTP", addr))) => server.url = format!("http://{addr}"),
                Ok(Ok((_, addr))) => server.grpc_url = addr,
                Ok(Err(log)) => bail!("trident serve exited: {log}"),
                Err(_) => bail!("trident serve did not start within 60 s"),
            }
        }
        Ok(server)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The server's peak resident memory so far (`VmHWM`), bytes.
    pub fn peak_rss_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
    }

    /// Stops the server as an operator would (SIGTERM, a graceful shutdown) and waits
    /// for it; an unclean exit is an error.
    pub fn stop(mut self) -> Result<()> {
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(self.pid() as libc::pid_t, libc::SIGTERM) };
        let status = self.child.wait().context("waiting for trident serve")?;
        if !status.success() {
            bail!("trident serve did not stop cleanly ({status})");
        }
        Ok(())
    }
}

/// A `trident serve` process for one candidate, on its own copy of the model.
struct Server {
    process: ServeProcess,
    _dir: tempfile::TempDir,
}

fn start_server(search: &Search, c: &Candidate, config: &str) -> Result<Server> {
    let dir = tempfile::tempdir()?;
    let src = search.repository.join(&search.model);
    copy_dir(&src, &dir.path().join(&search.model))?;
    std::fs::write(
        dir.path().join(&search.model).join("config.pbtxt"),
        rewrite_config(config, c)?,
    )?;
    let process = ServeProcess::spawn(&search.trident, dir.path())
        .with_context(|| format!("the server for `{}`", c.name()))?;
    Ok(Server { process, _dir: dir })
}

/// Copies a directory tree (a model's files into a candidate repository).
pub fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from).with_context(|| format!("model directory {}", from.display()))? {
        let e = e?;
        let dest = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &dest)?;
        } else {
            std::fs::copy(e.path(), dest)?;
        }
    }
    Ok(())
}

/// (CPU ticks, peak RSS MiB) of a process, from /proc.
fn process_usage(server: &ServeProcess) -> (u64, f64) {
    let ticks = crate::run::process_cpu_ticks(&server.pid().to_string()).unwrap_or(0);
    let hwm = server.peak_rss_bytes().unwrap_or(0) as f64;
    (ticks, hwm / (1024.0 * 1024.0))
}

async fn measure(
    search: &Search,
    c: &Candidate,
    config: &str,
    progress: &mut impl FnMut(&str),
) -> Result<Outcome> {
    let server = start_server(search, c, config)?;
    let client = match c.protocol {
        Protocol::Http => Client::new(&server.process.url, Duration::from_secs(30))?,
        Protocol::Grpc => Client::grpc(&server.process.grpc_url, Duration::from_secs(30))?,
    };
    // Wait until the model is ready.
    let deadline = Instant::now() + Duration::from_secs(60);
    let model = loop {
        match client.model(&search.model).await {
            Ok(m) => break m,
            Err(e) if Instant::now() > deadline => return Err(e.context(format!("candidate `{}`", c.name()))),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let bodies = prepare(&model, &search.source, Encoding::Binary, 1, &HashMap::new())?;
    let target = Target {
        client,
        model: search.model.clone(),
        bodies: Arc::new(bodies),
        batch: 1,
    };
    let (ticks0, t0) = (process_usage(&server.process).0, Instant::now());
    let mut levels: Vec<Row> = Vec::new();
    let mut concurrency = 1;
    while concurrency <= search.max_concurrency {
        let r = crate::run::run(
            target.clone(),
            Load::Concurrency(vec![concurrency]),
            search.settings.clone(),
            std::future::pending(),
            |_| {},
        )
        .await;
        let Some(row) = r.rows.into_iter().next() else {
            break;
        };
        progress(&format!(
            "  {}: concurrency {concurrency}: {:.1} infer/s, p99 {:.2} ms{}",
            c.name(),
            row.inferences_per_s,
            row.latency.p99_us as f64 / 1000.0,
            if row.latency.errors > 0 {
                format!(", {} errors", row.latency.errors)
            } else {
                String::new()
            }
        ));
        let over = row.latency.p99_us as f64 > search.p99_us || row.latency.errors > 0;
        let flat = levels
            .last()
            .is_some_and(|p| row.inferences_per_s < p.inferences_per_s * 1.05);
        levels.push(row);
        if over || flat {
            break;
        }
        concurrency *= 2;
    }
    let (ticks1, rss) = process_usage(&server.process);
    let best = best_within(&levels, search.p99_us).cloned();
    let throughput = best.as_ref().map(|b| b.inferences_per_s).filter(|t| *t > 0.0);
    Ok(Outcome {
        candidate: c.clone(),
        cost_per_million: search
            .price_per_hour
            .zip(throughput)
            .map(|(p, t)| cost_per_million(p, t)),
        instances_for_target: search
            .target_rps
            .zip(throughput)
            .map(|(r, t)| (r / t).ceil() as u64),
        best,
        levels,
        server_peak_rss_mib: rss,
        server_cpu_pct: (ticks1 - ticks0.min(ticks1)) as f64 / 100.0 / t0.elapsed().as_secs_f64() * 100.0,
    })
}

/// The candidates among `outcomes` that no other outcome dominates: none had more than 5 %
/// more throughput within the SLO and a lower p99 at it. Those that never met the SLO are
/// dominated by any that did.
pub fn undominated(outcomes: &[&Outcome]) -> Vec<Candidate> {
    let any_met = outcomes.iter().any(|o| o.best.is_some());
    outcomes
        .iter()
        .filter(|o| match &o.best {
            None => !any_met,
            Some(b) => !outcomes.iter().any(|p| {
                p.best.as_ref().is_some_and(|q| {
                    q.inferences_per_s > b.inferences_per_s * 1.05 && q.latency.p99_us < b.latency.p99_us
                })
            }),
        })
        .map(|o| o.candidate.clone())
        .collect()
}

/// Each of `kept` that `pick` selects, varied by each of `values` through `set`.
fn variants<V: Copy>(
    kept: &[Candidate],
    pick: impl Fn(&Candidate) -> bool,
    values: &[V],
    set: impl Fn(&Candidate, V) -> Candidate,
) -> Vec<Candidate> {
    kept.iter()
        .filter(|k| pick(k))
        .flat_map(|k| values.iter().map(|&v| set(k, v)))
        .collect()
}

/// Runs the search; outcomes in measurement order.
///
/// Stages, each measured at the first instance count and pruned to its undominated
/// candidates before the next: (1) each engine with batching off; (2) batching with each
/// queue delay; (3) each preferred batch size with the batching settings kept; (4) the
/// settings kept, at the other instance counts. Batching is skipped when the model's
/// `max_batch_size` is 0, and preferred sizes above `max_batch_size` are not tried.
pub async fn search(search: &Search, mut progress: impl FnMut(&str)) -> Result<Vec<Outcome>> {
    if search.p99_us.is_nan() || search.p99_us <= 0.0 {
        bail!("the p99 SLO must be a positive number of milliseconds")
    }
    let config_path = search.repository.join(&search.model).join("config.pbtxt");
    let config = std::fs::read_to_string(&config_path)
        .with_context(|| format!("model `{}`: {}", search.model, config_path.display()))?;
    let parsed = trident_core::config::parse_config(&config, &config_path)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .config;
    let max_batch = parsed.max_batch_size.max(0) as u32;
    if max_batch == 0 && !(search.queue_delays_us.is_empty() && search.preferred_batch_sizes.is_empty()) {
        progress(&format!(
            "model `{}` has max_batch_size 0: dynamic batching is not possible, only instances and engines are searched",
            search.model
        ));
    }
    let first = search.instances.first().copied().unwrap_or(1);
    let mut outcomes: Vec<Outcome> = Vec::new();
    let mut measure_all =
        async |cands: Vec<Candidate>, outcomes: &mut Vec<Outcome>| -> Result<Vec<Candidate>> {
            let mut stage = Vec::new();
            for c in cands {
                if !outcomes.iter().any(|o| o.candidate == c) {
                    progress(&format!("measuring {}", c.name()));
                    outcomes.push(measure(search, &c, &config, &mut progress).await?);
                }
                stage.push(c);
            }
            let stage: Vec<&Outcome> = outcomes.iter().filter(|o| stage.contains(&o.candidate)).collect();
            Ok(undominated(&stage))
        };
    // (1) engines, batching off.
    let engines: Vec<Option<String>> = if search.engines.is_empty() {
        vec![None]
    } else {
        search.engines.iter().cloned().map(Some).collect()
    };
    let first_protocol = search.protocols.first().copied().unwrap_or(Protocol::Http);
    let base = |engine: Option<String>| Candidate {
        engine,
        queue_delay_us: None,
        preferred_batch_size: None,
        instances: first,
        protocol: first_protocol,
    };
    let mut kept = measure_all(engines.into_iter().map(base).collect(), &mut outcomes).await?;
    // (2) batching with each queue delay, for the engines kept.
    if max_batch > 0 {
        let delays = variants(
            &kept,
            |_| true,
            &search.queue_delays_us,
            |k, d| Candidate {
                queue_delay_us: Some(d),
                ..k.clone()
            },
        );
        kept = measure_all([kept, delays].concat(), &mut outcomes).await?;
        // (3) preferred batch sizes for the batching settings kept.
        let sizes: Vec<u32> = search
            .preferred_batch_sizes
            .iter()
            .copied()
            .filter(|&p| p >= 1 && p <= max_batch)
            .collect();
        let batching = |k: &Candidate| k.queue_delay_us.is_some();
        if !sizes.is_empty() && kept.iter().any(batching) {
            let preferred = variants(&kept, batching, &sizes, |k, p| Candidate {
                preferred_batch_size: Some(p),
                ..k.clone()
            });
            kept = measure_all([kept, preferred].concat(), &mut outcomes).await?;
        }
    }
    // (4) more instances for the settings kept.
    let more = variants(
        &kept,
        |_| true,
        search.instances.get(1..).unwrap_or(&[]),
        |k, n| Candidate {
            instances: n,
            ..k.clone()
        },
    );
    let kept = measure_all([kept, more].concat(), &mut outcomes).await?;
    // (5) the settings kept, over the other protocols.
    let protocols: Vec<Protocol> = search.protocols.iter().skip(1).copied().collect();
    let others = variants(
        &kept,
        |_| true,
        &protocols,
        |k, p| Candidate {
            protocol: p,
            ..k.clone()
        },
    );
    measure_all(others, &mut outcomes).await?;
    Ok(outcomes)
}

/// The level with the highest throughput whose p99 is within `p99_us` and that had no
/// errors.
pub fn best_within(levels: &[Row], p99_us: f64) -> Option<&Row> {
    levels
        .iter()
        .filter(|r| r.latency.p99_us as f64 <= p99_us && r.latency.errors == 0 && r.latency.count > 0)
        .max_by(|a, b| a.inferences_per_s.total_cmp(&b.inferences_per_s))
}

/// What a million inferences cost on a server of `price_per_hour` that sustains
/// `inferences_per_s`.
pub fn cost_per_million(price_per_hour: f64, inferences_per_s: f64) -> f64 {
    price_per_hour / (inferences_per_s * 3600.0) * 1e6
}

/// The outcomes ranked: best throughput within the SLO first; those that never met it last.
pub fn ranked(outcomes: &[Outcome]) -> Vec<&Outcome> {
    let mut v: Vec<&Outcome> = outcomes.iter().collect();
    v.sort_by(|a, b| {
        let t = |o: &Outcome| o.best.as_ref().map_or(-1.0, |r| r.inferences_per_s);
        t(b).total_cmp(&t(a))
    });
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(queue_delay_us: Option<u64>, instances: u32) -> Candidate {
        Candidate {
            engine: None,
            queue_delay_us,
            preferred_batch_size: None,
            instances,
            protocol: Protocol::Http,
        }
    }

    #[test]
    fn config_blocks_are_replaced() {
        let text = "name: \"m\" # dynamic_batching { in a comment }\nmax_batch_size: 8\n\
                    dynamic_batching {\n  preferred_batch_size: [ 4, 8 ]\n  max_queue_delay_microseconds: 100\n}\n\
                    instance_group [ { count: 3 kind: KIND_CPU } ]\noutput [ { name: \"instance_group\" } ]\n\
                    parameters { key: \"intra_op_thread_count\" value: { string_value: \"1\" } }\n\
                    parameters { key: \"trident.onnx_engine\" value: { string_value: \"tract\" } }\n";
        let out = rewrite_config(text, &candidate(Some(500), 2)).unwrap();
        assert!(out.contains("# dynamic_batching { in a comment }"), "{out}");
        assert!(out.contains("output [ { name: \"instance_group\" } ]"), "{out}");
        assert!(
            !out.contains("preferred_batch_size") && !out.contains("count: 3"),
            "{out}"
        );
        assert!(
            out.contains("max_queue_delay_microseconds: 500") && out.contains("count: 2"),
            "{out}"
        );
        // Without an engine in the candidate, the configured one stays.
        assert!(out.contains("string_value: \"tract\""), "{out}");
        let off = rewrite_config(text, &candidate(None, 1)).unwrap();
        assert!(!off.contains("dynamic_batching {\n"), "{off}");
        assert!(remove_blocks("dynamic_batching { x: 1", "dynamic_batching", |_| true).is_err());

        // An engine replaces only its own parameter; a preferred size goes into batching.
        let c = Candidate {
            engine: Some("ort".into()),
            preferred_batch_size: Some(4),
            ..candidate(Some(100), 1)
        };
        let out = rewrite_config(text, &c).unwrap();
        assert!(out.contains("intra_op_thread_count"), "{out}");
        assert!(!out.contains("\"tract\""), "{out}");
        assert_eq!(out.matches("trident.onnx_engine").count(), 1, "{out}");
        assert!(out.contains("string_value: \"ort\""), "{out}");
        assert!(out.contains("preferred_batch_size: [ 4 ]"), "{out}");
        // Every rewrite is a valid configuration with the fields we meant.
        let parsed = trident_core::config::parse_config(&out, Path::new("config.pbtxt"))
            .unwrap()
            .config;
        use trident_core::config::pb::model_config::SchedulingChoice;
        let Some(SchedulingChoice::DynamicBatching(db)) = parsed.scheduling_choice else {
            panic!("no dynamic_batching in {out}")
        };
        assert_eq!(
            (db.preferred_batch_size, db.max_queue_delay_microseconds),
            (vec![4], 100)
        );
        assert_eq!(parsed.instance_group.len(), 1);
        assert_eq!(parsed.parameters["trident.onnx_engine"].string_value, "ort");
        assert_eq!(parsed.parameters["intra_op_thread_count"].string_value, "1");
    }

    fn outcome(c: Candidate, best: Option<(f64, u64)>) -> Outcome {
        let best = best.map(|(t, p99)| Row {
            level: 1.0,
            phase: None,
            t_s: 1.0,
            seconds: 1.0,
            latency: crate::stats::Latency {
                count: 10,
                throughput: t,
                p99_us: p99,
                ..Default::default()
            },
            inferences_per_s: t,
            client_send_us: 0.0,
            client_recv_us: 0.0,
            server: None,
            client_cpu_pct: 0.0,
            machine_cpu_pct: 0.0,
            stable: true,
            windows: 1,
            late_sends: 0,
        });
        Outcome {
            candidate: c,
            best,
            levels: vec![],
            server_peak_rss_mib: 0.0,
            server_cpu_pct: 0.0,
            cost_per_million: None,
            instances_for_target: None,
        }
    }

    #[test]
    fn dominated_candidates_are_pruned() {
        let a = outcome(candidate(None, 1), Some((1000.0, 900)));
        // More throughput and lower p99 than c: c is dominated.
        let b = outcome(candidate(Some(100), 1), Some((2000.0, 800)));
        let c = outcome(candidate(Some(1000), 1), Some((1500.0, 1000)));
        // Less throughput but lower p99 than b: kept (a different trade-off).
        let d = outcome(candidate(Some(50), 1), Some((1900.0, 700)));
        // Within 5 % of b's throughput: not dominated by it.
        let e = outcome(candidate(Some(200), 1), Some((1950.0, 850)));
        // Never met the SLO.
        let f = outcome(candidate(Some(5000), 1), None);
        let all = [&a, &b, &c, &d, &e, &f];
        let kept = undominated(&all);
        // a is dominated by b (2x the throughput at a lower p99), c by b and d.
        assert_eq!(
            kept,
            vec![b.candidate.clone(), d.candidate.clone(), e.candidate.clone()]
        );
        // When none met the SLO, none is preferred over another.
        assert_eq!(undominated(&[&f]), vec![f.candidate.clone()]);
    }
}
