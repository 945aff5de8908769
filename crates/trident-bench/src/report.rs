//! Results as a terminal table, as CSV with perf_analyzer's column names (so existing
//! spreadsheets and scripts read them), and as JSON.

use crate::run::{Report, Row};
use anyhow::{Context, Result};
use std::path::Path;

/// perf_analyzer's CSV columns (values in µs, throughput in inferences per second), in its
/// order; the first is `Concurrency` or `Request Rate`. Trident's extra columns follow.
pub const PERF_ANALYZER_COLUMNS: [&str; 13] = [
    "Concurrency",
    "Inferences/Second",
    "Client Send",
    "Network+Server Send/Recv",
    "Server Queue",
    "Server Compute Input",
    "Server Compute Infer",
    "Server Compute Output",
    "Client Recv",
    "p50 latency",
    "p90 latency",
    "p95 latency",
    "p99 latency",
];

/// Columns after perf_analyzer's.
pub const EXTRA_COLUMNS: [&str; 12] = [
    "Avg latency",
    "p99.9 latency",
    "Max latency",
    "Requests/Second",
    "Errors",
    "Server Request",
    "Server Overhead",
    "Phase",
    "Time (s)",
    "Stable",
    "Client CPU %",
    "Machine CPU %",
];

fn server_or_zero(row: &Row, f: fn(&crate::run::ServerTimes) -> f64) -> String {
    row.server
        .as_ref()
        .map(|s| format!("{:.0}", f(s)))
        .unwrap_or_else(|| "0".into())
}

/// Writes the rows (windows for phases, levels for sweeps) as CSV, atomically.
pub fn write_csv(report: &Report, path: &Path) -> Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let mut header: Vec<&str> = PERF_ANALYZER_COLUMNS.to_vec();
    if report.mode == "request-rate" {
        header[0] = "Request Rate";
    }
    header.extend(EXTRA_COLUMNS);
    w.write_record(&header)?;
    for r in &report.rows {
        let l = &r.latency;
        let record = vec![
            format!("{}", r.level),
            format!("{:.1}", r.inferences_per_s),
            format!("{:.0}", r.client_send_us),
            format!("{:.0}", r.network_us()),
            server_or_zero(r, |s| s.queue_us),
            server_or_zero(r, |s| s.compute_input_us),
            server_or_zero(r, |s| s.compute_infer_us),
            server_or_zero(r, |s| s.compute_output_us),
            format!("{:.0}", r.client_recv_us),
            l.p50_us.to_string(),
            l.p90_us.to_string(),
            l.p95_us.to_string(),
            l.p99_us.to_string(),
            format!("{:.0}", l.mean_us),
            l.p999_us.to_string(),
            l.max_us.to_string(),
            format!("{:.1}", l.throughput),
            l.errors.to_string(),
            server_or_zero(r, |s| s.request_us),
            server_or_zero(r, |s| s.overhead_us),
            r.phase.map(|p| (p + 1).to_string()).unwrap_or_default(),
            format!("{:.1}", r.t_s),
            r.stable.to_string(),
            format!("{:.0}", r.client_cpu_pct),
            format!("{:.0}", r.machine_cpu_pct),
        ];
        w.write_record(&record)?;
    }
    let bytes = w.into_inner().context("CSV buffer")?;
    write_atomically(path, &bytes)
}

/// Writes the whole report as JSON, atomically.
pub fn write_json(report: &Report, path: &Path) -> Result<()> {
    write_atomically(path, &serde_json::to_vec_pretty(report)?)
}

/// Writes `bytes` to `path` through a temporary file in the same directory, renamed
/// into place: a reader never sees a partial file.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp =
        tempfile::NamedTempFile::new_in(dir).with_context(|| format!("cannot write in {}", dir.display()))?;
    std::io::Write::write_all(&mut tmp, bytes).with_context(|| format!("writing {}", path.display()))?;
    #[cfg(unix)]
    {
        // NamedTempFile is private (0600); reports are ordinary, shareable files.
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    tmp.persist(path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// A table for the terminal: one line per row, then the phases' summaries, the
/// latencies' meaning, the stop reason and the warnings.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let level = match report.mode {
        "phases" => "users",
        "concurrency" => "concurrency",
        _ => "rate/s",
    };
    let line = |out: &mut String, label: String, r: &Row| {
        let l = &r.latency;
        let ms = |us: u64| us as f64 / 1000.0;
        let server = r
            .server
            .map(|s| {
                format!(
                    "{:>9.2} {:>8.2} {:>8.2} {:>8.2}",
                    s.request_us / 1000.0,
                    s.overhead_us / 1000.0,
                    s.queue_us / 1000.0,
                    s.compute_infer_us / 1000.0
                )
            })
            .unwrap_or_else(|| format!("{:>9} {:>8} {:>8} {:>8}", "–", "–", "–", "–"));
        out.push_str(&format!(
            "{label:>14} {:>10.1} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {server} {:>6} {:>5.0}{}\n",
            r.inferences_per_s,
            l.mean_us / 1000.0,
            ms(l.p50_us),
            ms(l.p95_us),
            ms(l.p99_us),
            ms(l.max_us),
            l.errors,
            r.client_cpu_pct,
            if r.phase.is_none() && !r.stable {
                "  unstable"
            } else {
                ""
            },
        ));
    };
    let header = format!(
        "{level:>14} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8} {:>8} {:>8} {:>6} {:>5}\n",
        "infer/s",
        "mean ms",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "max ms",
        "server ms",
        "ovh ms",
        "queue ms",
        "model ms",
        "errors",
        "cli%"
    );
    out.push_str(&format!(
        "model {} at {} ({}, batch {})\n",
        report.model, report.url, report.mode, report.batch
    ));
    out.push_str(&header);
    for r in &report.rows {
        let label = match r.phase {
            Some(p) => format!("{}@{:.0}s p{}", r.level, r.t_s, p + 1),
            None => format!("{}", r.level),
        };
        line(&mut out, label, r);
    }
    if !report.phases.is_empty() {
        out.push_str("phases (measured windows merged):\n");
        out.push_str(&header);
        for r in &report.phases {
            line(&mut out, format!("phase {}", r.phase.map_or(0, |p| p + 1)), r);
        }
    }
    out.push_str(
        "latencies: mean..max = end to end (client); server = container (the request's time in the server); \
         ovh = server overhead (container − queue − compute); model = compute infer\n",
    );
    if let Some(s) = &report.stopped {
        out.push_str(&format!("stopped: {s}\n"));
    }
    if let Some(e) = &report.first_error {
        out.push_str(&format!("first error: {e}\n"));
    }
    for w in &report.warnings {
        out.push_str(&format!("warning: {w}\n"));
    }
    out
}
