//! The system monitor (PR-2): a background thread that samples, every `interval`, each
//! core's utilisation (`/proc/stat`), the process's resident memory and thread count
//! (`/proc/self/status`) and how many of its threads are runnable (`/proc/self/task/*/stat`,
//! state `R`). Written as `monitor.csv` and a per-core heat map `cpu_heatmap.png`; the
//! runnable-thread count against the cores is the evidence of oversubscription.
//!
//! Linux only: elsewhere the monitor records nothing and says so.

use plotters::prelude::*;
use serde::Serialize;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One sample.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds since the monitor started.
    pub t: f64,
    /// Busy share of each core over the last interval, 0–1.
    pub cores: Vec<f64>,
    /// Resident memory, bytes.
    pub rss: u64,
    /// The process's threads.
    pub threads: u64,
    /// Of them, runnable (running or waiting for a core), the monitor's own excluded.
    pub runnable: u64,
}

/// A running monitor; [`Monitor::finish`] stops it and returns the samples.
pub struct Monitor {
    stop: Arc<AtomicBool>,
    paused: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    handle: Option<JoinHandle<()>>,
}

/// Per-core (busy, total) jiffies from `/proc/stat`.
fn core_times() -> Option<Vec<(u64, u64)>> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let cores: Vec<(u64, u64)> = s
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .map(|l| {
            let v: Vec<u64> = l
                .split_whitespace()
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect();
            // user nice system idle iowait irq softirq steal …
            let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
            let total: u64 = v.iter().take(8).sum();
            (total - idle, total)
        })
        .collect();
    (!cores.is_empty()).then_some(cores)
}

fn status_field(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// This process's peak resident memory so far (`VmHWM`), where /proc has it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status_field(&status, "VmHWM:").map(|kb| kb * 1024)
}

fn runnable_threads() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    dir.filter_map(Result::ok)
        .filter(|e| {
            std::fs::read_to_string(e.path().join("stat"))
                .ok()
                // "pid (comm) S …": the state follows the last ')'.
                .and_then(|s| {
                    s.rsplit_once(')')
                        .map(|(_, rest)| rest.trim_start().starts_with('R'))
                })
                .unwrap_or(false)
        })
        .count() as u64
}

impl Monitor {
    /// Starts sampling every `interval`.
    pub fn start(interval: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let paused = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let handle = {
            let (stop, paused, samples) = (stop.clone(), paused.clone(), samples.clone());
            std::thread::Builder::new()
                .name("trident-monitor".into())
                .spawn(move || {
                    let t0 = Instant::now();
                    let mut prev = core_times();
                    // At least one sample, even for a run shorter than the interval.
                    loop {
                        std::thread::sleep(interval);
                        let now = core_times();
                        let (Some(p), Some(n)) = (&prev, &now) else { break };
                        let cores = p
                            .iter()
                            .zip(n)
                            .map(|(&(b0, t0), &(b1, t1))| {
                                let dt = t1.saturating_sub(t0);
                                if dt == 0 {
                                    0.0
                                } else {
                                    b1.saturating_sub(b0) as f64 / dt as f64
                                }
                            })
                            .collect();
                        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
                        if paused.load(Ordering::Relaxed) {
                            prev = now;
                            continue;
                        }
                        samples.lock().expect("monitor lock").push(Sample {
                            t: t0.elapsed().as_secs_f64(),
                            cores,
                            rss: status_field(&status, "VmRSS:").unwrap_or(0) * 1024,
                            threads: status_field(&status, "Threads:").unwrap_or(0),
                            // Less the monitor itself, running as it looks.
                            runnable: runnable_threads().saturating_sub(1),
                        });
                        prev = now;
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                    }
                })
                .ok()
        };
        Monitor {
            stop,
            paused,
            samples,
            handle,
        }
    }

    /// Pauses (`true`) or resumes sampling: the profiler's own work after the profiled
    /// steps (resolving the sampled stacks' symbols reads the binary's line tables, a few
    /// hundred MiB for a debug-info build) is not the training run's.
    pub fn pause(&self, on: bool) {
        self.paused.store(on, Ordering::Relaxed);
    }

    /// Stops the thread (after its current interval and one last sample) and returns what
    /// it sampled.
    pub fn finish(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        std::mem::take(&mut *self.samples.lock().expect("monitor lock"))
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What the samples say about the machine.
#[derive(Debug, Clone, Serialize)]
pub struct MonitorSummary {
    /// Samples taken.
    pub samples: usize,
    /// Cores seen.
    pub cores: usize,
    /// Mean busy share per core.
    pub mean_core_busy: Vec<f64>,
    /// Peak resident memory seen, bytes.
    pub peak_rss: u64,
    /// Most threads seen.
    pub max_threads: u64,
    /// Mean runnable threads of this process.
    pub mean_runnable: f64,
}

/// Summarises `samples`.
pub fn summarise(samples: &[Sample]) -> MonitorSummary {
    let cores = samples.first().map_or(0, |s| s.cores.len());
    let n = samples.len().max(1) as f64;
    MonitorSummary {
        samples: samples.len(),
        cores,
        mean_core_busy: (0..cores)
            .map(|c| samples.iter().map(|s| s.cores[c]).sum::<f64>() / n)
            .collect(),
        peak_rss: samples.iter().map(|s| s.rss).max().unwrap_or(0),
        max_threads: samples.iter().map(|s| s.threads).max().unwrap_or(0),
        mean_runnable: samples.iter().map(|s| s.runnable as f64).sum::<f64>() / n,
    }
}

/// Writes `monitor.csv` and `cpu_heatmap.png` into `dir`.
pub fn write(dir: &Path, samples: &[Sample]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let cores = samples.first().map_or(0, |s| s.cores.len());
    let mut csv = format!(
        "t_s,{},rss_bytes,threads,runnable\n",
        (0..cores)
            .map(|c| format!("cpu{c}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    for s in samples {
        csv += &format!(
            "{:.3},{},{},{},{}\n",
            s.t,
            s.cores
                .iter()
                .map(|v| format!("{v:.3}"))
                .collect::<Vec<_>>()
                .join(","),
            s.rss,
            s.threads,
            s.runnable
        );
    }
    crate::write_atomic(&dir.join("monitor.csv"), csv.as_bytes())?;
    if cores > 0 && !samples.is_empty() {
        heatmap(&dir.join("cpu_heatmap.png"), samples, cores).map_err(std::io::Error::other)?;
    }
    Ok(())
}

/// Cores (rows) × time (columns), white = idle, dark red = busy.
fn heatmap(path: &Path, samples: &[Sample], cores: usize) -> Result<(), String> {
    let tmp = path.with_extension("tmp.png");
    {
        let root = BitMapBackend::new(&tmp, (900, 120 + 40 * cores as u32)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let t_max = samples.last().map_or(1.0, |s| s.t).max(1e-3);
        let mut chart = ChartBuilder::on(&root)
            .caption("CPU busy per core", ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..t_max, 0f64..cores as f64)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("seconds")
            .y_desc("core")
            .y_labels(cores + 1)
            .disable_mesh()
            .draw()
            .map_err(|e| e.to_string())?;
        let mut prev_t = 0.0;
        for s in samples {
            for (c, &busy) in s.cores.iter().enumerate() {
                let v = busy.clamp(0.0, 1.0);
                let shade = RGBColor(255, (255.0 * (1.0 - v)) as u8, (255.0 * (1.0 - v)) as u8);
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(prev_t, c as f64), (s.t, c as f64 + 1.0)],
                        shade.filled(),
                    )))
                    .map_err(|e| e.to_string())?;
            }
            prev_t = s.t;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    std::fs::rename(&tmp, path).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_monitor_sees_a_busy_core_and_its_own_threads() {
        if core_times().is_none() {
            return; // not Linux: nothing to sample
        }
        let m = Monitor::start(Duration::from_millis(20));
        let spin = std::thread::spawn(|| {
            let t = Instant::now();
            let mut x = 0u64;
            while t.elapsed() < Duration::from_millis(300) {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
            x
        });
        let _ = spin.join();
        let samples = m.finish();
        assert!(samples.len() >= 5, "{} samples", samples.len());
        let s = summarise(&samples);
        assert!(s.cores >= 1);
        // A spinning thread keeps at least one core busy (other load may add to it).
        let busiest = samples
            .iter()
            .map(|x| x.cores.iter().sum::<f64>())
            .fold(0.0, f64::max);
        assert!(busiest >= 0.5, "cores busy {busiest}");
        assert!(s.max_threads >= 3 && s.peak_rss > 0, "{s:?}");
        assert!(samples.iter().any(|x| x.runnable >= 1));
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &samples).unwrap();
        let csv = std::fs::read_to_string(dir.path().join("monitor.csv")).unwrap();
        assert_eq!(csv.lines().count(), samples.len() + 1);
        assert!(csv.starts_with("t_s,cpu0,"));
        let png = std::fs::read(dir.path().join("cpu_heatmap.png")).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    }
}
