//! The load engine: closed-loop users (traffic phases, concurrency sweeps) and open-loop
//! arrivals (request rates), measured in windows with perf_analyzer's stability criterion,
//! with stop conditions, server-side statistics and the generator's own CPU use.

use crate::client::{Body, Client, ServerStats, Timing};
use crate::schedule::{Arrivals, Distribution, Phases};
use crate::stats::{new_histogram, plateaued, stable, Latency};
use hdrhistogram::Histogram;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What to load.
#[derive(Clone)]
pub struct Target {
    /// The server.
    pub client: Client,
    /// The model.
    pub model: String,
    /// Request bodies, used in turn.
    pub bodies: Arc<Vec<Body>>,
    /// Inferences per request (the batch size).
    pub batch: u64,
}

/// The shape of the load.
#[derive(Debug, Clone)]
pub enum Load {
    /// Closed-loop users following traffic phases; one row per window.
    Phases(Phases),
    /// Closed-loop sweep: this many concurrent users per level; one row per level.
    Concurrency(Vec<u32>),
    /// Open-loop sweep: these request rates (per second); one row per level.
    Rate(Vec<f64>, Distribution),
}

/// How to measure and when to stop.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Length of a measurement window.
    pub window: Duration,
    /// Excluded at the start of the run (phases) or of each level (sweeps).
    pub warmup: Duration,
    /// Windows that must agree for a level to count as stable.
    pub stable_windows: usize,
    /// Their allowed spread (0.1: ±10 %).
    pub tolerance: f64,
    /// A level ends, stable or not, after this many measured windows.
    pub max_windows: usize,
    /// The latency percentile the stability criterion compares (0: mean).
    pub percentile: f64,
    /// Stop when a window's (phases) or level's (sweeps) latency at `stop_percentile`
    /// exceeds this (µs).
    pub stop_latency_us: Option<f64>,
    /// The percentile of the latency stop (0: mean).
    pub stop_percentile: f64,
    /// Stop when a window's throughput reaches this many inferences per minute.
    pub max_invocations_per_minute: Option<f64>,
    /// Stop when throughput stops growing (phases: over windows; sweeps: across levels).
    pub stop_on_plateau: bool,
    /// Open loop: requests in flight beyond this count as errors (the client is overrun).
    pub max_outstanding: usize,
    /// Seed of Poisson arrivals.
    pub seed: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            window: Duration::from_secs(5),
            warmup: Duration::from_secs(2),
            stable_windows: 3,
            tolerance: 0.1,
            max_windows: 10,
            percentile: 99.0,
            stop_latency_us: None,
            stop_percentile: 99.0,
            max_invocations_per_minute: None,
            stop_on_plateau: false,
            max_outstanding: 10_000,
            seed: 0,
        }
    }
}

/// Average server-side times per successful request (µs), from the statistics API: the
/// "container" latency is the request's whole time in the server; "model" is compute
/// infer; overhead is what the server spent outside queue and compute.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ServerTimes {
    /// Requests the server completed in the interval.
    pub requests: u64,
    /// Model executions (batches) in the interval.
    pub executions: u64,
    /// Whole request in the server (container latency).
    pub request_us: f64,
    /// Waiting in the scheduler / batcher queue.
    pub queue_us: f64,
    /// Preparing inputs.
    pub compute_input_us: f64,
    /// The model itself.
    pub compute_infer_us: f64,
    /// Extracting outputs.
    pub compute_output_us: f64,
    /// request − (queue + compute): HTTP parsing, encoding, scheduling.
    pub overhead_us: f64,
}

impl ServerTimes {
    fn from_delta(d: &ServerStats) -> Option<Self> {
        if d.success_count == 0 {
            return None;
        }
        let per = |ns: u64| ns as f64 / d.success_count as f64 / 1000.0;
        let (request, queue) = (per(d.success_ns), per(d.queue_ns));
        let (input, infer, output) = (
            per(d.compute_input_ns),
            per(d.compute_infer_ns),
            per(d.compute_output_ns),
        );
        Some(ServerTimes {
            requests: d.success_count,
            executions: d.execution_count,
            request_us: request,
            queue_us: queue,
            compute_input_us: input,
            compute_infer_us: infer,
            compute_output_us: output,
            overhead_us: (request - queue - input - infer - output).max(0.0),
        })
    }
}

/// One row of results: a window (phases) or a level (sweeps).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Row {
    /// Users (phases), concurrency, or request rate per second.
    pub level: f64,
    /// Phase index (phases only).
    pub phase: Option<usize>,
    /// End of the interval, seconds since the start of the run.
    pub t_s: f64,
    /// Measured seconds.
    pub seconds: f64,
    /// Client-side latency and throughput (requests; multiply by the batch size for
    /// inferences).
    pub latency: Latency,
    /// Inferences per second.
    pub inferences_per_s: f64,
    /// Mean time building and handing over a request (µs); bodies are pre-encoded.
    pub client_send_us: f64,
    /// Mean time reading the response body after its headers (µs).
    pub client_recv_us: f64,
    /// Server-side breakdown, when the server has the statistics API.
    pub server: Option<ServerTimes>,
    /// CPU used by this process, % of one core.
    pub client_cpu_pct: f64,
    /// CPU used by the whole machine, % of all cores.
    pub machine_cpu_pct: f64,
    /// Sweeps: whether the level met the stability criterion. Phases: false for warm-up
    /// windows (excluded from the phase summaries and stop conditions).
    pub stable: bool,
    /// Windows merged into this row.
    pub windows: usize,
    /// Open loop: requests sent more than 1 ms after their intended time.
    pub late_sends: u64,
}

impl Row {
    /// Network + server send/receive as perf_analyzer defines it: client mean latency
    /// minus client send/receive and the server's queue and compute times (µs).
    pub fn network_us(&self) -> f64 {
        let server = self
            .server
            .map(|s| s.queue_us + s.compute_input_us + s.compute_infer_us + s.compute_output_us)
            .unwrap_or(0.0);
        (self.latency.mean_us - self.client_send_us - self.client_recv_us - server).max(0.0)
    }
}

/// Everything a run measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// Server URL.
    pub url: String,
    /// The protocol the requests used.
    pub protocol: crate::client::Protocol,
    /// Model.
    pub model: String,
    /// `phases`, `concurrency` or `request-rate`.
    pub mode: &'static str,
    /// Inferences per request.
    pub batch: u64,
    /// Windows (phases) or levels (sweeps), in order.
    pub rows: Vec<Row>,
    /// Phases: each phase's measured windows merged (warm-up excluded).
    pub phases: Vec<Row>,
    /// Why the run ended early, if it did.
    pub stopped: Option<String>,
    /// Whether Ctrl-C ended it.
    pub interrupted: bool,
    /// The first error message the server or the network gave, if any.
    pub first_error: Option<String>,
    /// Doubts about the measurement (a saturated client, unstable levels, …).
    pub warnings: Vec<String>,
}

// ------------------------------------------------------------------ recording

/// An open-loop send this far behind its schedule counts as late.
const LATE: Duration = Duration::from_millis(1);

/// What the requests of the current interval add up to.
struct Acc {
    hist: Histogram<u64>,
    errors: u64,
    send_us: u64,
    recv_us: u64,
    late: u64,
}

impl Acc {
    fn new() -> Self {
        Acc {
            hist: new_histogram(),
            errors: 0,
            send_us: 0,
            recv_us: 0,
            late: 0,
        }
    }
}

struct Recorder {
    acc: Mutex<Acc>,
    /// Requests started under an older level are not counted in the new one.
    level: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl Recorder {
    fn record(&self, level: u64, result: anyhow::Result<(Duration, Timing)>) {
        if self.level.load(Ordering::Acquire) != level {
            return;
        }
        let mut acc = self.acc.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok((latency, timing)) => {
                let high = acc.hist.high();
                let _ = acc.hist.record((latency.as_micros() as u64).clamp(1, high));
                acc.send_us += timing.prepare.as_micros() as u64;
                acc.recv_us += timing.receive.as_micros() as u64;
            }
            Err(e) => {
                acc.errors += 1;
                drop(acc);
                let mut first = self.first_error.lock().unwrap_or_else(|e| e.into_inner());
                first.get_or_insert_with(|| format!("{e:#}"));
            }
        }
    }

    fn take(&self) -> Acc {
        std::mem::replace(
            &mut *self.acc.lock().unwrap_or_else(|e| e.into_inner()),
            Acc::new(),
        )
    }

    /// Starts a new level: later completions of requests begun before are dropped.
    fn next_level(&self) -> u64 {
        let l = self.level.fetch_add(1, Ordering::AcqRel) + 1;
        self.take();
        l
    }
}

/// One request, timed from `intended` (open loop: the scheduled send time, so that a
/// client falling behind shows as latency instead of hiding it).
async fn one_request(target: &Target, i: usize, intended: Instant) -> anyhow::Result<(Duration, Timing)> {
    let body = &target.bodies[i % target.bodies.len()];
    let timing = target.client.infer(&target.model, body).await?;
    Ok((intended.elapsed(), timing))
}

// ------------------------------------------------------------------ CPU

/// User + system CPU time of process `pid` (`self` for this one) in clock ticks, from
/// /proc (Linux).
pub(crate) fn process_cpu_ticks(pid: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): state is the first, utime
    // the 12th, stime the 13th.
    let rest: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
    Some(rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?)
}

/// Process and machine CPU counters from /proc (Linux; zeros elsewhere).
#[derive(Clone, Copy, Default)]
struct Cpu {
    process_ticks: u64,
    machine_busy: u64,
    machine_total: u64,
}

impl Cpu {
    fn sample() -> Self {
        let process_ticks = process_cpu_ticks("self").unwrap_or(0);
        let (machine_busy, machine_total) = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| {
                let v: Vec<u64> = s
                    .lines()
                    .next()?
                    .split_whitespace()
                    .skip(1)
                    .filter_map(|x| x.parse().ok())
                    .collect();
                let total: u64 = v.iter().take(8).sum();
                let idle = v.get(3)? + v.get(4).unwrap_or(&0);
                Some((total - idle, total))
            })
            .unwrap_or((0, 0));
        Cpu {
            process_ticks,
            machine_busy,
            machine_total,
        }
    }

    /// (% of one core used by this process, % of the machine busy) since `before`.
    fn since(&self, before: &Cpu, elapsed: Duration) -> (f64, f64) {
        // Linux reports both in USER_HZ, which is 100 on every mainstream platform.
        const TICKS_PER_S: f64 = 100.0;
        let process = (self.process_ticks - before.process_ticks.min(self.process_ticks)) as f64
            / TICKS_PER_S
            / elapsed.as_secs_f64().max(1e-9)
            * 100.0;
        let total = self.machine_total.saturating_sub(before.machine_total);
        let machine = match total {
            0 => 0.0,
            t => self.machine_busy.saturating_sub(before.machine_busy) as f64 / t as f64 * 100.0,
        };
        (process, machine)
    }
}

// ------------------------------------------------------------------ the run

/// Runs `load` against `target` until done, a stop condition, or `interrupt` resolving
/// (Ctrl-C); returns what was measured. `progress` receives one line per window.
pub async fn run(
    target: Target,
    load: Load,
    settings: Settings,
    interrupt: impl std::future::Future<Output = ()>,
    mut progress: impl FnMut(&str),
) -> Report {
    let mode = match &load {
        Load::Phases(_) => "phases",
        Load::Concurrency(_) => "concurrency",
        Load::Rate(..) => "request-rate",
    };
    let mut report = Report {
        url: target.client.base.clone(),
        protocol: target.client.protocol(),
        model: target.model.clone(),
        mode,
        batch: target.batch,
        rows: Vec::new(),
        phases: Vec::new(),
        stopped: None,
        interrupted: false,
        first_error: None,
        warnings: Vec::new(),
    };
    let recorder = Arc::new(Recorder {
        acc: Mutex::new(Acc::new()),
        level: AtomicU64::new(0),
        first_error: Mutex::new(None),
    });
    let engine = Engine {
        target,
        settings,
        recorder: recorder.clone(),
        users: Arc::new(AtomicU32::new(0)),
        spawned: 0,
        running: Arc::new(AtomicBool::new(true)),
        tasks: Vec::new(),
        start: Instant::now(),
        last_end: None,
    };
    tokio::pin!(interrupt);
    let body = async {
        let mut engine = engine;
        engine.drive(load, &mut report, &mut progress).await;
        engine.shutdown();
    };
    tokio::select! {
        _ = body => {}
        _ = &mut interrupt => {
            report.interrupted = true;
            report.stopped.get_or_insert_with(|| "interrupted (Ctrl-C): partial results".into());
        }
    }
    report.first_error = recorder
        .first_error
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    report
}

struct Engine {
    target: Target,
    settings: Settings,
    recorder: Arc<Recorder>,
    /// Closed loop: how many users should be sending.
    users: Arc<AtomicU32>,
    spawned: u32,
    running: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    start: Instant,
    /// Where the last window ended.
    last_end: Option<Boundary>,
}

/// A window's edge: when, the server's statistics and the CPU counters.
struct Boundary {
    at: Instant,
    stats: Option<ServerStats>,
    cpu: Cpu,
}

/// A window's measurement before it becomes a row.
struct Window {
    acc: Acc,
    seconds: f64,
    server: Option<ServerTimes>,
    cpu: (f64, f64),
}

impl Engine {
    /// Makes sure `n` closed-loop users exist; users above the target idle.
    fn ensure_users(&mut self, n: u32) {
        while self.spawned < n {
            let (id, target, users) = (self.spawned, self.target.clone(), self.users.clone());
            let (recorder, running) = (self.recorder.clone(), self.running.clone());
            self.tasks.push(tokio::spawn(async move {
                let mut i = id as usize * 7919;
                while running.load(Ordering::Acquire) {
                    if id >= users.load(Ordering::Acquire) {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        continue;
                    }
                    let level = recorder.level.load(Ordering::Acquire);
                    let result = one_request(&target, i, Instant::now()).await;
                    recorder.record(level, result);
                    i += 1;
                }
            }));
            self.spawned += 1;
        }
    }

    fn shutdown(&mut self) {
        self.running.store(false, Ordering::Release);
        for t in self.tasks.drain(..) {
            t.abort();
        }
    }

    async fn server_stats(&self) -> Option<ServerStats> {
        self.target.client.stats(&self.target.model).await.ok()
    }

    /// Waits one window and collects it.
    /// Waits one window and collects it. A window that directly follows another starts
    /// from that one's end (its statistics and CPU sample), so back-to-back windows ask
    /// the server for statistics once per boundary and lose no request between them.
    async fn window(&mut self, len: Duration) -> Window {
        let start = match self.last_end.take() {
            Some(end) if end.at.elapsed() < Duration::from_millis(20) => end,
            _ => {
                let stats = self.server_stats().await;
                self.recorder.take();
                Boundary {
                    at: Instant::now(),
                    stats,
                    cpu: Cpu::sample(),
                }
            }
        };
        tokio::time::sleep(len.saturating_sub(start.at.elapsed())).await;
        let acc = self.recorder.take();
        let at = Instant::now();
        let elapsed = at - start.at;
        let end = Boundary {
            at,
            stats: self.server_stats().await,
            cpu: Cpu::sample(),
        };
        let server = match (start.stats, end.stats) {
            (Some(a), Some(b)) => ServerTimes::from_delta(&b.since(&a)),
            _ => None,
        };
        let cpu = end.cpu.since(&start.cpu, elapsed);
        self.last_end = Some(end);
        Window {
            acc,
            seconds: elapsed.as_secs_f64(),
            server,
            cpu,
        }
    }

    fn row(&self, level: f64, phase: Option<usize>, windows: &[&Window], stable: bool) -> Row {
        let mut hist = new_histogram();
        let (mut errors, mut send, mut recv, mut late, mut seconds) = (0, 0, 0, 0, 0.0);
        for w in windows {
            let _ = hist.add(&w.acc.hist);
            errors += w.acc.errors;
            send += w.acc.send_us;
            recv += w.acc.recv_us;
            late += w.acc.late;
            seconds += w.seconds;
        }
        let latency = Latency::of(&hist, errors, Duration::from_secs_f64(seconds));
        let n = latency.count.max(1) as f64;
        let server = merge_server(windows.iter().filter_map(|w| w.server));
        let weight =
            |f: fn(&Window) -> f64| windows.iter().map(|w| f(w) * w.seconds).sum::<f64>() / seconds.max(1e-9);
        Row {
            level,
            phase,
            t_s: self.start.elapsed().as_secs_f64(),
            seconds,
            inferences_per_s: latency.throughput * self.target.batch as f64,
            latency,
            client_send_us: send as f64 / n,
            client_recv_us: recv as f64 / n,
            server,
            client_cpu_pct: weight(|w| w.cpu.0),
            machine_cpu_pct: weight(|w| w.cpu.1),
            stable,
            windows: windows.len(),
            late_sends: late,
        }
    }

    /// A stop condition met by `row`, if any.
    fn stop_reason(&self, row: &Row) -> Option<String> {
        let s = &self.settings;
        let name = if s.stop_percentile == 0.0 {
            "mean".to_string()
        } else {
            format!("p{}", s.stop_percentile)
        };
        if let Some(limit) = s.stop_latency_us {
            let got = row.latency.at(s.stop_percentile);
            if got > limit {
                return Some(format!(
                    "{name} latency {:.2} ms exceeded the limit of {:.2} ms at level {}",
                    got / 1000.0,
                    limit / 1000.0,
                    row.level
                ));
            }
        }
        if let Some(max) = s.max_invocations_per_minute {
            if row.inferences_per_s * 60.0 >= max {
                return Some(format!(
                    "{:.0} inferences per minute reached the maximum of {max:.0} at level {}",
                    row.inferences_per_s * 60.0,
                    row.level
                ));
            }
        }
        None
    }

    fn progress_line(row: &Row, what: &str) -> String {
        let server = row
            .server
            .map(|s| {
                format!(
                    "  server {:.0} µs (queue {:.0}, model {:.0})",
                    s.request_us, s.queue_us, s.compute_infer_us
                )
            })
            .unwrap_or_default();
        format!(
            "{what}  {:.1} infer/s  p50 {:.2} ms  p99 {:.2} ms  errors {}  client CPU {:.0} %{server}",
            row.inferences_per_s,
            row.latency.p50_us as f64 / 1000.0,
            row.latency.p99_us as f64 / 1000.0,
            row.latency.errors,
            row.client_cpu_pct
        )
    }

    async fn drive(&mut self, load: Load, report: &mut Report, progress: &mut impl FnMut(&str)) {
        match load {
            Load::Phases(phases) => self.drive_phases(phases, report, progress).await,
            Load::Concurrency(levels) => {
                let levels = levels.into_iter().map(|c| c as f64).collect();
                self.drive_sweep(levels, None, report, progress).await
            }
            Load::Rate(rates, dist) => self.drive_sweep(rates, Some(dist), report, progress).await,
        }
        self.warn(report);
    }

    async fn drive_phases(&mut self, phases: Phases, report: &mut Report, progress: &mut impl FnMut(&str)) {
        self.ensure_users(phases.at(Duration::ZERO).map_or(0, |p| p.1));
        let (users, start) = (self.users.clone(), Instant::now());
        // Follows the schedule every 50 ms; users are spawned by the window loop below
        // (this task only moves the target).
        let schedule = phases.clone();
        let ticker = tokio::spawn(async move {
            while let Some((_, n)) = schedule.at(start.elapsed()) {
                users.store(n, Ordering::Release);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            users.store(0, Ordering::Release);
        });
        self.recorder.next_level();
        let total = phases.total();
        let mut per_phase: Vec<Vec<Window>> = (0..phases.0.len()).map(|_| Vec::new()).collect();
        let mut summaries: Vec<Latency> = Vec::new();
        loop {
            let elapsed = start.elapsed();
            let Some((phase, now)) = phases.at(elapsed) else {
                break;
            };
            // Users for the whole coming window exist before it starts.
            let ahead = phases.at(elapsed + self.settings.window).map_or(0, |p| p.1);
            self.ensure_users(now.max(ahead));
            let len = self.settings.window.min(total - elapsed);
            if len < Duration::from_millis(50) {
                tokio::time::sleep(len).await;
                continue;
            }
            let w = self.window(len).await;
            let users_now = self.users.load(Ordering::Acquire) as f64;
            let warm = elapsed < self.settings.warmup;
            let row = self.row(users_now, Some(phase), &[&w], !warm);
            progress(&Self::progress_line(
                &row,
                &format!(
                    "t {:>5.1} s  phase {}  users {:>3}{}",
                    row.t_s,
                    phase + 1,
                    users_now,
                    if warm { " (warm-up)" } else { "" }
                ),
            ));
            let reason = (!warm).then(|| self.stop_reason(&row)).flatten();
            if !warm {
                summaries.push(row.latency.clone());
                per_phase[phase].push(w);
            }
            report.rows.push(row);
            if let Some(r) = reason {
                report.stopped = Some(r);
                break;
            }
            if self.settings.stop_on_plateau && plateaued(&summaries, self.settings.stable_windows, 0.05) {
                report.stopped = Some(format!(
                    "throughput plateaued: the last {} windows were less than 5 % above the {} before",
                    self.settings.stable_windows, self.settings.stable_windows
                ));
                break;
            }
        }
        ticker.abort();
        for (i, ws) in per_phase.iter().enumerate() {
            if ws.is_empty() {
                continue;
            }
            let refs: Vec<&Window> = ws.iter().collect();
            let users = phases.0[i].initial_users as f64;
            report.phases.push(self.row(users, Some(i), &refs, true));
        }
    }

    async fn drive_sweep(
        &mut self,
        levels: Vec<f64>,
        open_loop: Option<Distribution>,
        report: &mut Report,
        progress: &mut impl FnMut(&str),
    ) {
        let s = self.settings.clone();
        let mut level_rows: Vec<Latency> = Vec::new();
        for level in levels {
            let generation = self.recorder.next_level();
            // A new level's first window starts afresh, not at the last level's end.
            self.last_end = None;
            let arrivals = match open_loop {
                None => {
                    self.ensure_users(level as u32);
                    self.users.store(level as u32, Ordering::Release);
                    None
                }
                Some(dist) => Some(self.start_arrivals(level, dist, generation)),
            };
            let label = |w: usize| match open_loop {
                None => format!("concurrency {level:>3}  window {w:>2}"),
                Some(_) => format!("rate {level:>7.1}/s  window {w:>2}"),
            };
            tokio::time::sleep(s.warmup).await;
            let mut windows: VecDeque<Window> = VecDeque::new();
            let mut summaries: Vec<Latency> = Vec::new();
            let mut measured = 0;
            let is_stable = loop {
                let w = self.window(s.window).await;
                measured += 1;
                let one = self.row(level, None, &[&w], false);
                progress(&Self::progress_line(&one, &label(measured)));
                summaries.push(one.latency);
                windows.push_back(w);
                if windows.len() > s.stable_windows.max(1) {
                    windows.pop_front();
                }
                if stable(&summaries, s.stable_windows, s.tolerance, s.percentile) {
                    break true;
                }
                if measured >= s.max_windows {
                    break false;
                }
            };
            if let Some(stop) = arrivals {
                stop.store(true, Ordering::Release);
            }
            let refs: Vec<&Window> = windows.iter().collect();
            let row = self.row(level, None, &refs, is_stable);
            progress(&Self::progress_line(
                &row,
                &format!(
                    "=> {} {level}{}",
                    if open_loop.is_some() {
                        "rate"
                    } else {
                        "concurrency"
                    },
                    if is_stable { "" } else { " (unstable)" }
                ),
            ));
            let reason = self.stop_reason(&row);
            level_rows.push(row.latency.clone());
            report.rows.push(row);
            if let Some(r) = reason {
                report.stopped = Some(r);
                break;
            }
            if s.stop_on_plateau && plateaued(&level_rows, 1, 0.05) {
                report.stopped = Some(format!("throughput plateaued: level {level} added less than 5 %"));
                break;
            }
        }
        self.users.store(0, Ordering::Release);
    }

    /// Sends at `rate` per second until the returned flag is set, each request timed from
    /// its intended send time. The schedule runs on its own thread with the OS's sleep
    /// (tens of µs precise), not on tokio's timer, whose 1 ms ticks would make most sends
    /// late and add up to a millisecond to every latency.
    fn start_arrivals(&self, rate: f64, dist: Distribution, generation: u64) -> Arc<AtomicBool> {
        let (target, recorder) = (self.target.clone(), self.recorder.clone());
        let (max_outstanding, seed) = (self.settings.max_outstanding, self.settings.seed ^ generation);
        let stop = Arc::new(AtomicBool::new(false));
        let (stop_flag, handle) = (stop.clone(), tokio::runtime::Handle::current());
        std::thread::spawn(move || {
            let start = Instant::now();
            let outstanding = Arc::new(AtomicUsize::new(0));
            for (i, offset) in Arrivals::new(rate, dist, seed).enumerate() {
                let intended = start + Duration::from_secs_f64(offset);
                loop {
                    if stop_flag.load(Ordering::Acquire) {
                        return;
                    }
                    let now = Instant::now();
                    if now >= intended {
                        break;
                    }
                    // In slices, so that a stop is seen within 20 ms at low rates.
                    std::thread::sleep((intended - now).min(Duration::from_millis(20)));
                }
                if intended.elapsed() > LATE {
                    let mut acc = recorder.acc.lock().unwrap_or_else(|e| e.into_inner());
                    if recorder.level.load(Ordering::Acquire) == generation {
                        acc.late += 1;
                    }
                }
                if outstanding.load(Ordering::Acquire) >= max_outstanding {
                    recorder.record(
                        generation,
                        Err(anyhow::anyhow!(
                            "client overrun: {max_outstanding} requests already in flight"
                        )),
                    );
                    continue;
                }
                outstanding.fetch_add(1, Ordering::AcqRel);
                let (target, recorder, outstanding) = (target.clone(), recorder.clone(), outstanding.clone());
                handle.spawn(async move {
                    let result = one_request(&target, i, intended).await;
                    recorder.record(generation, result);
                    outstanding.fetch_sub(1, Ordering::AcqRel);
                });
            }
        });
        stop
    }

    fn warn(&self, report: &mut Report) {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if let Some(r) = report.rows.iter().find(|r| r.client_cpu_pct >= 90.0) {
            report.warnings.push(format!(
                "the load generator used {:.0} % of a core at level {}: it may be the bottleneck, and the figures then measure the client",
                r.client_cpu_pct, r.level
            ));
        }
        if let Some(r) = report.rows.iter().find(|r| r.machine_cpu_pct >= 95.0) {
            report.warnings.push(format!(
                "the machine's {cores} cores were {:.0} % busy at level {}: client and server compete for CPU",
                r.machine_cpu_pct, r.level
            ));
        }
        let unstable: Vec<String> = report
            .rows
            .iter()
            .filter(|r| r.phase.is_none() && !r.stable)
            .map(|r| r.level.to_string())
            .collect();
        if !unstable.is_empty() {
            report.warnings.push(format!(
                "levels {} did not meet the stability criterion (last {} windows within ±{:.0} %) in {} windows",
                unstable.join(", "),
                self.settings.stable_windows,
                self.settings.tolerance * 100.0,
                self.settings.max_windows
            ));
        }
        let late: u64 = report.rows.iter().map(|r| r.late_sends).sum();
        let sent: u64 = report
            .rows
            .iter()
            .map(|r| r.latency.count + r.latency.errors)
            .sum();
        if sent > 0 && late * 10 > sent {
            report.warnings.push(format!(
                "{late} of {sent} requests left more than {} ms after their scheduled time: the client could not keep up (their latency includes the delay)",
                LATE.as_millis()
            ));
        }
    }
}

/// Request-weighted average of server times over windows.
fn merge_server(items: impl Iterator<Item = ServerTimes>) -> Option<ServerTimes> {
    let items: Vec<ServerTimes> = items.collect();
    let total: u64 = items.iter().map(|s| s.requests).sum();
    if total == 0 {
        return None;
    }
    let avg = |f: fn(&ServerTimes) -> f64| {
        items.iter().map(|s| f(s) * s.requests as f64).sum::<f64>() / total as f64
    };
    Some(ServerTimes {
        requests: total,
        executions: items.iter().map(|s| s.executions).sum(),
        request_us: avg(|s| s.request_us),
        queue_us: avg(|s| s.queue_us),
        compute_input_us: avg(|s| s.compute_input_us),
        compute_infer_us: avg(|s| s.compute_infer_us),
        compute_output_us: avg(|s| s.compute_output_us),
        overhead_us: avg(|s| s.overhead_us),
    })
}
