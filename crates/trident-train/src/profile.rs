//! The training profiler (PR-1, PR-3, PR-4): where each optimizer step's time goes, which
//! operators take it, and a diagnosis of the bottleneck.
//!
//! How each figure is measured:
//! - **Step phases** (`steps.csv`): wall-clock intervals of the training loop itself,
//!   measured by [`PhaseTimer`] marks that tile the step: `data` (waiting for the loader),
//!   `forward`, `backward` (autograd and gathering gradients into flat buffers),
//!   `optimizer` (averaging, clipping, the AdamW/SGD pass), `comm` (gradient exchange;
//!   0 without data parallelism) and `other` (metrics, logging, checkpoints). Their sum
//!   is the step time by construction; `other` says how much the named phases miss.
//! - **Operators** (`ops.csv`): spans around Trident's own kernels (`trident_nn::trace`),
//!   forward and backward, with FLOPs for matrix products; *self* time excludes kernels
//!   nested inside (a softmax backward runs the softmax-grad kernel). Work candle does
//!   itself (elementwise arithmetic, reshapes, its autograd bookkeeping) has no span: it is
//!   the step time the table does not cover, reported as such.
//! - **Regions**: `trident_nn::trace::region("name")` guards in user code.
//!
//! Profiling is off unless asked for; off, the loop takes no timestamps and spans record
//! nothing.

use serde::Serialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;
use trident_nn::trace::{self, Event, Recorder};

/// What to profile.
#[derive(Debug, Clone, Default)]
pub struct ProfileOptions {
    /// Only optimizer steps `first..=last` (1-based); all steps when `None`.
    pub steps: Option<(u64, u64)>,
    /// Where `trace.json`, `steps.csv`, `ops.csv` and `summary.txt` go.
    pub dir: PathBuf,
    /// The data loader's background workers (for the diagnosis).
    pub num_workers: usize,
    /// The run trains in bf16 mixed precision (for the diagnosis).
    pub bf16: bool,
}

impl ProfileOptions {
    /// Whether optimizer step `step` (1-based) is profiled.
    pub fn covers(&self, step: u64) -> bool {
        self.steps.is_none_or(|(a, b)| (a..=b).contains(&step))
    }
}

/// The phases of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for the next batch.
    Data,
    /// Forward pass and loss.
    Forward,
    /// Backward pass and gradient gathering.
    Backward,
    /// Optimizer update (with averaging and clipping).
    Optimizer,
    /// Gradient communication.
    Comm,
    /// Bookkeeping: metrics, logging, checkpoints.
    Other,
}

/// Phase names, in column order.
pub const PHASES: [&str; 6] = ["data", "forward", "backward", "optimizer", "comm", "other"];

impl Phase {
    fn index(self) -> usize {
        self as usize
    }
}

/// One profiled optimizer step, milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct StepPhases {
    /// Optimizer step (1-based).
    pub step: u64,
    /// Milliseconds per phase, in [`PHASES`] order.
    pub ms: [f64; 6],
    /// The whole step.
    pub total_ms: f64,
}

/// Tiles the training loop into phases: each [`PhaseTimer::mark`] gives the time since the
/// previous mark to a phase. Inactive, it does nothing.
pub struct PhaseTimer {
    active: bool,
    last: Instant,
    step_start: Instant,
    cur: [f64; 6],
    recorder: Option<std::sync::Arc<Recorder>>,
    /// The steps profiled so far.
    pub rows: Vec<StepPhases>,
}

impl PhaseTimer {
    /// A timer recording into `recorder` (phase spans for the trace) when it is `Some`.
    pub fn new(recorder: Option<std::sync::Arc<Recorder>>) -> Self {
        let now = Instant::now();
        PhaseTimer {
            active: false,
            last: now,
            step_start: now,
            cur: [0.0; 6],
            recorder,
            rows: Vec::new(),
        }
    }

    /// Starts a step (profiled when `active`): the next mark measures from now.
    pub fn begin_step(&mut self, active: bool) {
        self.active = active && self.recorder.is_some();
        trace::set_recording(self.active);
        if self.active {
            let now = Instant::now();
            self.last = now;
            self.step_start = now;
            self.cur = [0.0; 6];
        }
    }

    /// Gives the time since the previous mark to `phase`.
    #[inline]
    pub fn mark(&mut self, phase: Phase) {
        if !self.active {
            return;
        }
        let now = Instant::now();
        self.cur[phase.index()] += (now - self.last).as_secs_f64() * 1e3;
        if let Some(r) = &self.recorder {
            let start_ns = r.ns(self.last);
            r.push(Event {
                name: PHASES[phase.index()].into(),
                cat: "phase",
                start_ns,
                dur_ns: r.ns(now).saturating_sub(start_ns),
                tid: trace::thread_id(),
                flops: 0,
                layer: None,
            });
        }
        self.last = now;
    }

    /// Ends optimizer step `step`.
    pub fn end_step(&mut self, step: u64) {
        if !self.active {
            return;
        }
        // The step ends at its last mark, so its phases tile it exactly.
        let now = self.last;
        let total_ms = (now - self.step_start).as_secs_f64() * 1e3;
        if let Some(r) = &self.recorder {
            let start_ns = r.ns(self.step_start);
            r.push(Event {
                name: format!("step {step}").into(),
                cat: "step",
                start_ns,
                dur_ns: r.ns(now).saturating_sub(start_ns),
                tid: trace::thread_id(),
                flops: 0,
                layer: None,
            });
        }
        self.rows.push(StepPhases {
            step,
            ms: self.cur,
            total_ms,
        });
        self.active = false;
        trace::set_recording(false);
    }
}

/// Median, mean and coefficient of variation of a phase over the profiled steps.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseStats {
    /// Phase name.
    pub phase: &'static str,
    /// Median milliseconds.
    pub median_ms: f64,
    /// Mean milliseconds.
    pub mean_ms: f64,
    /// Largest step's milliseconds.
    pub max_ms: f64,
    /// Standard deviation / mean.
    pub cv: f64,
    /// Share of the summed time of the steady steps: all but the first profiled step when
    /// there are others (the first also pays for starting the profiler and warming caches:
    /// a 263 ms wait for data in a run of 10 ms steps made a dense autoencoder look
    /// data-bound).
    pub share: f64,
}

/// One operator's row of the table.
#[derive(Debug, Clone, Serialize)]
pub struct OpRow {
    /// Kernel name.
    pub name: String,
    /// `fwd` or `bwd`.
    pub pass: &'static str,
    /// Calls.
    pub calls: u64,
    /// Milliseconds, nested kernels excluded.
    pub self_ms: f64,
    /// Milliseconds, nested kernels included.
    pub total_ms: f64,
    /// Self time over the profiled steps' time.
    pub share: f64,
    /// GFLOP/s of self time (matrix products).
    pub gflops: Option<f64>,
}

/// One model layer's share of the kernels (its [`trident_nn::trace::layer`] scope).
#[derive(Debug, Clone, Serialize)]
pub struct LayerRow {
    /// The layer scope (`encoder.3`, `conv1`, `loss`); `(none)` for kernels run outside
    /// any scope.
    pub layer: String,
    /// Self milliseconds of its kernels in the forward pass.
    pub fwd_ms: f64,
    /// Self milliseconds of its kernels in the backward pass.
    pub bwd_ms: f64,
    /// Kernel calls.
    pub calls: u64,
    /// Forward plus backward over the profiled steps' time.
    pub share: f64,
    /// GFLOP/s of its matrix-product kernels' self time, when it has any.
    pub gflops: Option<f64>,
    /// Its rows by kernel and pass, largest first.
    pub ops: Vec<OpRow>,
}

/// The columns of [`OpRow::csv`].
const OP_COLUMNS: &str = "op,pass,calls,self_ms,total_ms,share,gflops";

impl OpRow {
    /// The row as CSV fields ([`OP_COLUMNS`]), as `ops.csv` and `layers.csv` write it.
    fn csv(&self) -> String {
        format!(
            "{},{},{},{:.4},{:.4},{:.5},{}",
            self.name,
            self.pass,
            self.calls,
            self.self_ms,
            self.total_ms,
            self.share,
            self.gflops.map_or(String::new(), |g| format!("{g:.2}"))
        )
    }
}

/// A finding of the diagnosis.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// `data-bound`, `optimizer-bound`, `communication-bound`, `high-variance`.
    pub rule: &'static str,
    /// The measured evidence.
    pub evidence: String,
    /// What to change.
    pub suggestion: String,
}

/// Everything the profiler concluded.
#[derive(Debug, Clone, Serialize)]
pub struct ProfileReport {
    /// Steps profiled.
    pub steps: usize,
    /// Per-phase statistics.
    pub phases: Vec<PhaseStats>,
    /// Median step milliseconds.
    pub median_step_ms: f64,
    /// Operators by self time.
    pub ops: Vec<OpRow>,
    /// Layers in the order the forward pass first reached them.
    pub layers: Vec<LayerRow>,
    /// Share of the profiled step time inside Trident's kernels (the rest is candle's own
    /// work and the loop).
    pub kernel_share: f64,
    /// User regions: name → (calls, milliseconds).
    pub regions: Vec<(String, u64, f64)>,
    /// The system monitor's summary, when it ran.
    pub monitor: Option<crate::monitor::MonitorSummary>,
    /// The diagnosis.
    pub findings: Vec<Finding>,
    /// CPU samples by category (pprof), when the sampler ran.
    pub sampled: Option<Sampled>,
}

/// What the sampling profiler saw, from the first to the last profiled step (work between
/// profiled steps, such as an evaluation inside the window, included).
#[derive(Debug, Clone, Serialize)]
pub struct Sampled {
    /// By category, largest first (samples at [`crate::sampler::HZ`]; those in libc,
    /// libgcc, libpthread and the vDSO are dropped).
    pub rows: Vec<crate::sampler::SampleRow>,
}

impl Sampled {
    /// Samples kept.
    pub fn samples(&self) -> u64 {
        self.rows.iter().map(|r| r.samples).sum()
    }
}

/// The median of `v` (0 for none).
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Self time of each event: its duration less that of the events directly nested in it
/// on the same thread.
fn self_times(events: &[Event]) -> Vec<u64> {
    let mut order: Vec<usize> = (0..events.len()).collect();
    order.sort_by_key(|&i| {
        (
            events[i].tid,
            events[i].start_ns,
            std::cmp::Reverse(events[i].dur_ns),
        )
    });
    let mut selft: Vec<u64> = events.iter().map(|e| e.dur_ns).collect();
    let mut stack: Vec<usize> = Vec::new();
    for &i in &order {
        let e = &events[i];
        while let Some(&top) = stack.last() {
            let t = &events[top];
            if t.tid == e.tid && e.start_ns < t.start_ns + t.dur_ns {
                break;
            }
            stack.pop();
        }
        if let Some(&parent) = stack.last() {
            selft[parent] = selft[parent].saturating_sub(e.dur_ns);
        }
        stack.push(i);
    }
    selft
}

/// Operator rows of `kernels` (with their self times), largest self time first.
fn op_rows<'a>(kernels: impl Iterator<Item = (&'a Event, &'a u64)>, step_total: f64) -> Vec<OpRow> {
    let mut by: HashMap<(String, &'static str), (u64, u64, u64, u64)> = HashMap::new();
    for (e, s) in kernels {
        let pass = if e.cat == "op.fwd" { "fwd" } else { "bwd" };
        let row = by.entry((e.name.to_string(), pass)).or_default();
        row.0 += 1;
        row.1 += s;
        row.2 += e.dur_ns;
        row.3 += e.flops;
    }
    let mut ops: Vec<OpRow> = by
        .into_iter()
        .map(|((name, pass), (calls, s, t, flops))| OpRow {
            name,
            pass,
            calls,
            self_ms: s as f64 / 1e6,
            total_ms: t as f64 / 1e6,
            share: s as f64 / 1e6 / step_total,
            gflops: (flops > 0 && s > 0).then(|| flops as f64 / s as f64),
        })
        .collect();
    ops.sort_by(|a, b| b.self_ms.total_cmp(&a.self_ms).then(a.name.cmp(&b.name)));
    ops
}

/// Kernel self time by layer scope, in the order the forward pass first reached each
/// layer (layers only seen in backward, and `(none)`, last).
fn layer_rows(kernels: &[Event], selft: &[u64], step_total: f64) -> Vec<LayerRow> {
    const NONE: &str = "(none)";
    let mut first: HashMap<&str, (bool, u64)> = HashMap::new();
    for e in kernels {
        let name = e.layer.as_deref().unwrap_or(NONE);
        let key = (e.cat != "op.fwd" || name == NONE, e.start_ns);
        first
            .entry(name)
            .and_modify(|k| *k = (*k).min(key))
            .or_insert(key);
    }
    let mut names: Vec<&str> = first.keys().copied().collect();
    names.sort_by_key(|n| (first[n], *n));
    names
        .into_iter()
        .map(|name| {
            let mine = kernels
                .iter()
                .zip(selft)
                .filter(|(e, _)| e.layer.as_deref().unwrap_or(NONE) == name);
            let ops = op_rows(mine, step_total);
            let ms = |pass: &str| {
                ops.iter()
                    .filter(|o| o.pass == pass)
                    .map(|o| o.self_ms)
                    .sum::<f64>()
            };
            let (product_ms, gflop) = ops.iter().fold((0.0, 0.0), |(ms, gf), o| match o.gflops {
                Some(g) => (ms + o.self_ms, gf + g * o.self_ms * 1e-3),
                None => (ms, gf),
            });
            LayerRow {
                layer: name.to_string(),
                fwd_ms: ms("fwd"),
                bwd_ms: ms("bwd"),
                calls: ops.iter().map(|o| o.calls).sum(),
                share: (ms("fwd") + ms("bwd")) / step_total,
                gflops: (product_ms > 0.0).then(|| gflop / (product_ms * 1e-3)),
                ops,
            }
        })
        .collect()
}

/// Builds the report from the timer's rows, the recorded events and the monitor's samples;
/// `bf16_ready_flops`, where counted ([`Recorder::bf16_ready_flops`]), are the products'
/// FLOPs deep enough to run in bf16.
pub fn analyse(
    rows: &[StepPhases],
    events: &[Event],
    samples: &[crate::monitor::Sample],
    opts: &ProfileOptions,
    bf16_ready_flops: Option<u64>,
) -> ProfileReport {
    let step_total: f64 = rows.iter().map(|r| r.total_ms).sum::<f64>().max(1e-9);
    let steady = &rows[rows.len().min(1)..];
    let steady = if steady.is_empty() { rows } else { steady };
    let steady_total: f64 = steady.iter().map(|r| r.total_ms).sum::<f64>().max(1e-9);
    let phases: Vec<PhaseStats> = PHASES
        .iter()
        .enumerate()
        .map(|(i, &phase)| {
            let v: Vec<f64> = rows.iter().map(|r| r.ms[i]).collect();
            let n = v.len().max(1) as f64;
            let mean = v.iter().sum::<f64>() / n;
            let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
            PhaseStats {
                phase,
                mean_ms: mean,
                max_ms: v.iter().cloned().fold(0.0, f64::max),
                cv: if mean > 0.0 { var.sqrt() / mean } else { 0.0 },
                share: steady.iter().map(|r| r.ms[i]).sum::<f64>() / steady_total,
                median_ms: median(&v),
            }
        })
        .collect();
    // Only kernels nest inside kernels; phases and regions contain them, so self times are
    // computed over the kernel events alone.
    let kernels: Vec<Event> = events
        .iter()
        .filter(|e| e.cat == "op.fwd" || e.cat == "op.bwd")
        .cloned()
        .collect();
    let selft = self_times(&kernels);
    let ops = op_rows(kernels.iter().zip(&selft), step_total);
    let layers = layer_rows(&kernels, &selft, step_total);
    let kernel_share = ops.iter().map(|o| o.self_ms).sum::<f64>() / step_total;
    let mut regions: HashMap<String, (u64, f64)> = HashMap::new();
    for e in events.iter().filter(|e| e.cat == "region") {
        let r = regions.entry(e.name.to_string()).or_default();
        r.0 += 1;
        r.1 += e.dur_ns as f64 / 1e6;
    }
    let mut regions: Vec<(String, u64, f64)> = regions.into_iter().map(|(k, (c, ms))| (k, c, ms)).collect();
    regions.sort_by(|a, b| b.2.total_cmp(&a.2));
    let totals: Vec<f64> = rows.iter().map(|r| r.total_ms).collect();
    let median_step_ms = median(&totals);
    let monitor = (!samples.is_empty()).then(|| crate::monitor::summarise(samples));
    let mut findings = diagnose(rows, &phases, median_step_ms, monitor.as_ref(), opts);
    if let Some(m) = &monitor {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        findings.extend(oversubscribed(m, cores));
    }
    let bf16_ready_gflop = bf16_ready_flops.map(|f| f as f64 * 1e-9);
    findings.extend(matmul_bound(
        &ops,
        opts.bf16,
        trident_nn::bf16::accelerated(),
        bf16_ready_gflop,
    ));
    ProfileReport {
        sampled: None,
        monitor,
        steps: rows.len(),
        phases,
        median_step_ms,
        ops,
        layers,
        kernel_share,
        regions,
        findings,
    }
}

/// The diagnosis rules, each with its threshold:
/// - data-bound: the loader wait is ≥ 20 % of the step time;
/// - optimizer-bound: the optimizer is ≥ 25 %;
/// - communication-bound: gradient exchange is ≥ 20 %;
/// - high variance: a step (after the first, which warms caches) takes ≥ 2x the median
///   step and the step time's coefficient of variation is ≥ 0.25; the phase that grew is
///   named.
pub fn diagnose(
    rows: &[StepPhases],
    phases: &[PhaseStats],
    median_step_ms: f64,
    monitor: Option<&crate::monitor::MonitorSummary>,
    opts: &ProfileOptions,
) -> Vec<Finding> {
    let mut out = Vec::new();
    let share = |p: &str| phases.iter().find(|s| s.phase == p).map_or(0.0, |s| s.share);
    let pct = |x: f64| format!("{:.0} %", 100.0 * x);
    if share("data") >= 0.20 {
        let w = opts.num_workers;
        // With every core already busy, more workers only compete with the model.
        let busy =
            monitor.map(|m| m.mean_core_busy.iter().sum::<f64>() / m.mean_core_busy.len().max(1) as f64);
        let suggestion = match busy {
            Some(b) if b >= 0.9 && w >= 1 => format!(
                "the cores are already {:.0} % busy, so more loader workers would compete with the model for \
                 them: make loading cheaper instead (decode and resize once ahead of training, smaller \
                 images, fewer transforms)",
                100.0 * b
            ),
            _ => format!(
                "set loader.num_workers = {} (and loader.prefetch ≥ 2) so batches are ready before they are needed",
                (w + 1).max(2)
            ),
        };
        out.push(Finding {
            rule: "data-bound",
            evidence: format!(
                "waiting for data takes {} of the profiled time (median step: {:.1} ms of {:.1} ms) with num_workers = {w}",
                pct(share("data")),
                phases[0].median_ms,
                median_step_ms
            ),
            suggestion,
        });
    }
    if share("optimizer") >= 0.25 {
        out.push(Finding {
            rule: "optimizer-bound",
            evidence: format!(
                "the optimizer takes {} of the profiled time",
                pct(share("optimizer"))
            ),
            suggestion: "raise train.grad_accum or the batch size so each update serves more examples; \
                         use adamw (one fused pass per parameter) rather than a chain of tensor ops"
                .into(),
        });
    }
    if share("comm") >= 0.20 {
        out.push(Finding {
            rule: "communication-bound",
            evidence: format!(
                "gradient exchange takes {} of the profiled time",
                pct(share("comm"))
            ),
            suggestion: "raise train.grad_accum (one exchange per optimizer step serves every micro-batch), \
                         or --bucket-mb when the model has many small tensors; ranks sharing one \
                         machine split its cores rather than the work: one process with more threads \
                         is faster there"
                .into(),
        });
    }
    let steady: Vec<&StepPhases> = rows.iter().skip(1).collect();
    if steady.len() >= 3 {
        let n = steady.len() as f64;
        let mean = steady.iter().map(|r| r.total_ms).sum::<f64>() / n;
        let sd = (steady.iter().map(|r| (r.total_ms - mean).powi(2)).sum::<f64>() / n).sqrt();
        let worst = steady
            .iter()
            .max_by(|a, b| a.total_ms.total_cmp(&b.total_ms))
            .expect("non-empty");
        if worst.total_ms >= 2.0 * median_step_ms && sd / mean >= 0.25 {
            let grew = (0..6)
                .max_by(|&a, &b| {
                    let da = worst.ms[a] - phases[a].median_ms;
                    let db = worst.ms[b] - phases[b].median_ms;
                    da.total_cmp(&db)
                })
                .expect("six phases");
            out.push(Finding {
                rule: "high-variance",
                evidence: format!(
                    "step {} took {:.1} ms against a median of {:.1} ms (coefficient of variation {:.2}); \
                     its {} phase took {:.1} ms against a median of {:.1} ms",
                    worst.step,
                    worst.total_ms,
                    median_step_ms,
                    sd / mean,
                    PHASES[grew],
                    worst.ms[grew],
                    phases[grew].median_ms
                ),
                suggestion: if PHASES[grew] == "other" {
                    "that step's bookkeeping grew: it wrote a checkpoint (train.checkpoint_every, or the \
                     one written when a run stops) or a log; if it recurs, write them less often, or leave \
                     that step out with --profile-steps"
                        .into()
                } else {
                    "look for other work on the machine (the system monitor), memory pressure, or \
                     uneven batches (padding to the longest sequence); profile those steps alone \
                     with --profile-steps"
                        .into()
                },
            });
        }
    }
    out
}

/// Matrix-product-bound: the kernels that carry matrix products (their rows have GFLOP/s)
/// take ≥ 50 % of the profiled time. The suggestion depends on the precision, on whether
/// this CPU has bf16 arithmetic (`bf16_hardware`: AMX or AVX512-BF16) and on how much of
/// the product work is deep and wide enough for bf16 products (`bf16_ready_gflop`, where
/// counted): a linear layer's of inner dimension below `trident_nn::bf16::MIN_BF16_DEPTH`
/// (a narrow transformer's) and a convolution's below 64 deep or 32 wide (a first layer's,
/// `trident_nn::ops::conv_bf16`) keep f32 products under bf16; where those carry most of
/// the work bf16 is not the advice.
pub fn matmul_bound(
    ops: &[OpRow],
    bf16: bool,
    bf16_hardware: bool,
    bf16_ready_gflop: Option<f64>,
) -> Option<Finding> {
    let products: Vec<&OpRow> = ops.iter().filter(|o| o.gflops.is_some()).collect();
    let share: f64 = products.iter().map(|o| o.share).sum();
    if share < 0.5 {
        return None;
    }
    let ms: f64 = products.iter().map(|o| o.self_ms).sum();
    let gflop: f64 = products
        .iter()
        .map(|o| o.gflops.unwrap_or(0.0) * o.self_ms * 1e-3)
        .sum();
    // The share of the product work bf16 could run (1 where not counted).
    let ready = bf16_ready_gflop.map_or(1.0, |r| (r / gflop.max(1e-12)).min(1.0));
    let suggestion = match (bf16, bf16_hardware) {
        (_, true) if ready < 0.5 => format!(
            "only {:.0} % of the product work is deep and wide enough for bf16 products (an inner \
             dimension of {} or more in linear layers; 64 or more, with 32 or more output channels, \
             in convolutions); the rest (a narrow model's products, attention's per-head ones, a first \
             convolution's) stays f32 under train.precision = \"bf16\", where rounding and packing such \
             short products cost what faster arithmetic saves, so bf16 saves little time here: fewer \
             layers, shorter sequences or smaller images cut the work",
            100.0 * ready,
            trident_nn::bf16::MIN_BF16_DEPTH
        ),
        (false, true) => "set train.precision = \"bf16\": this CPU multiplies bf16 in hardware (AMX or \
                          AVX512-BF16; f32 sums, f32 master weights) in linear layers and convolutions, and \
                          the saved activations of transformer blocks halve"
            .to_string(),
        (true, true) => "the products already run in bf16: a smaller student (trident distill), shorter \
                         sequences (less padding) or more cores cut the remaining work"
            .to_string(),
        (_, false) => {
            "this CPU has no bf16 arithmetic (AMX, AVX512-BF16), so bf16 keeps f32 products and saves \
                       only activation memory here: a smaller student (trident distill) or shorter sequences \
                       cut the work itself"
                .to_string()
        }
    };
    Some(Finding {
        rule: "matmul-bound",
        evidence: format!(
            "kernels with matrix products take {:.0} % of the profiled time, at {:.0} GFLOP/s overall ({})",
            100.0 * share,
            gflop / (ms * 1e-3).max(1e-12),
            if bf16 && bf16_hardware && ready >= 0.5 {
                "bf16"
            } else {
                "f32"
            }
        ),
        suggestion,
    })
}

/// Oversubscription: on average more than twice as many of this process's threads were
/// runnable as it has cores, so threads wait for a core instead of working. (A run with
/// the default pools shows about 1.5 per core: rayon's workers spin a while before they
/// sleep, and count as runnable then.)
pub fn oversubscribed(m: &crate::monitor::MonitorSummary, cores: usize) -> Option<Finding> {
    (m.mean_runnable > 2.0 * cores as f64).then(|| Finding {
        rule: "oversubscribed",
        evidence: format!(
            "on average {:.1} of the process's {} threads were runnable on {cores} cores",
            m.mean_runnable, m.max_threads
        ),
        suggestion: format!(
            "run at most {cores} busy threads: lower loader.num_workers, or RAYON_NUM_THREADS / \
             OPENBLAS_NUM_THREADS when other work shares the machine"
        ),
    })
}

impl ProfileReport {
    /// The terminal summary.
    pub fn text(&self, top: usize) -> String {
        let mut s = format!(
            "profile: {} steps, median step {:.1} ms\n  measured by: phases — clock marks in the training loop; operators — \
             spans in Trident's kernels; sampled — stacks every 1/{} s of CPU time, all threads (pprof)\n  \
             phases (median ms, share):",
            self.steps,
            self.median_step_ms,
            crate::sampler::HZ
        );
        for p in &self.phases {
            s += &format!("  {} {:.1} ({:.0} %)", p.phase, p.median_ms, 100.0 * p.share);
        }
        s += "\n  top operators (self time, Trident kernels):";
        for o in self.ops.iter().take(top) {
            s += &format!("  {}.{} {:.0} %", o.name, o.pass, 100.0 * o.share);
        }
        s += &format!(
            "\n  kernels cover {:.0} % of step time; the rest is candle's own ops, autograd and the loop\n",
            100.0 * self.kernel_share
        );
        if !self.layers.is_empty() {
            s += "  layers (kernel self time fwd + bwd ms, share):";
            let mut shown: Vec<&LayerRow> = self.layers.iter().collect();
            if shown.len() > top.max(16) {
                shown.sort_by(|a, b| b.share.total_cmp(&a.share));
                shown.truncate(top.max(16));
            }
            for l in shown {
                s += &format!(
                    "  {} {:.1} + {:.1} ({:.0} %)",
                    l.layer,
                    l.fwd_ms,
                    l.bwd_ms,
                    100.0 * l.share
                );
            }
            s += "\n";
        }
        if let Some(sm) = &self.sampled {
            s += &format!("  sampled ({} samples):", sm.samples());
            for r in sm.rows.iter().take(top) {
                s += &format!("  {} {:.0} %", r.category, 100.0 * r.share);
            }
            s += "\n";
        }
        if let Some(m) = &self.monitor {
            s += &format!(
                "  monitor: {} samples; core busy {}; peak RSS {:.0} MiB; up to {} threads, {:.1} runnable on average\n",
                m.samples,
                m.mean_core_busy
                    .iter()
                    .map(|b| format!("{:.0} %", 100.0 * b))
                    .collect::<Vec<_>>()
                    .join(" / "),
                m.peak_rss as f64 / (1 << 20) as f64,
                m.max_threads,
                m.mean_runnable
            );
        }
        for (name, calls, ms) in &self.regions {
            s += &format!("  region {name}: {calls} calls, {ms:.1} ms\n");
        }
        if self.findings.is_empty() {
            s += "  diagnosis: no bottleneck rule fired\n";
        }
        for f in &self.findings {
            s += &format!("  diagnosis: {} — {} → {}\n", f.rule, f.evidence, f.suggestion);
        }
        s
    }
}

/// Chrome trace JSON (Perfetto / chrome://tracing) of `events`.
pub fn chrome_trace(events: &[Event]) -> serde_json::Value {
    let ev: Vec<serde_json::Value> = events
        .iter()
        .map(|e| {
            let mut v = serde_json::json!({
                "name": e.name,
                "cat": e.cat,
                "ph": "X",
                "ts": e.start_ns as f64 / 1e3,
                "dur": e.dur_ns as f64 / 1e3,
                "pid": 1,
                "tid": e.tid,
            });
            if e.flops > 0 {
                v["args"]["flops"] = e.flops.into();
            }
            if let Some(l) = &e.layer {
                v["args"]["layer"] = l.as_ref().into();
            }
            v
        })
        .collect();
    serde_json::json!({ "traceEvents": ev, "displayTimeUnit": "ms" })
}

/// Writes `trace.json`, `steps.csv`, `ops.csv`, `layers.csv`, `samples.csv` (when the
/// sampler ran), `summary.txt` and `report.json` into `dir`.
pub fn write(
    dir: &Path,
    rows: &[StepPhases],
    events: &[Event],
    report: &ProfileReport,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let put = |name: &str, bytes: &[u8]| crate::write_atomic(&dir.join(name), bytes);
    put(
        "trace.json",
        serde_json::to_string(&chrome_trace(events))?.as_bytes(),
    )?;
    let mut csv = format!("step,{},total_ms\n", PHASES.map(|p| format!("{p}_ms")).join(","));
    for r in rows {
        csv += &format!(
            "{},{},{:.4}\n",
            r.step,
            r.ms.map(|v| format!("{v:.4}")).join(","),
            r.total_ms
        );
    }
    put("steps.csv", csv.as_bytes())?;
    let mut ops = format!("{OP_COLUMNS}\n");
    for o in &report.ops {
        ops += &format!("{}\n", o.csv());
    }
    put("ops.csv", ops.as_bytes())?;
    let mut layers = format!("layer,{OP_COLUMNS}\n");
    for l in &report.layers {
        for o in &l.ops {
            layers += &format!("{},{}\n", l.layer, o.csv());
        }
    }
    put("layers.csv", layers.as_bytes())?;
    if let Some(sm) = &report.sampled {
        let mut csv = String::from("category,samples,share,top_symbol\n");
        for r in &sm.rows {
            let quoted = |v: &str| format!("\"{}\"", v.replace('"', "\"\""));
            csv += &format!(
                "{},{},{:.5},{}\n",
                quoted(&r.category),
                r.samples,
                r.share,
                quoted(&r.top_symbol)
            );
        }
        put("samples.csv", csv.as_bytes())?;
    }
    put("summary.txt", report.text(usize::MAX).as_bytes())?;
    put("report.json", serde_json::to_string_pretty(report)?.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(step: u64, ms: [f64; 6]) -> StepPhases {
        StepPhases {
            step,
            ms,
            total_ms: ms.iter().sum(),
        }
    }

    fn rules(rows: &[StepPhases]) -> Vec<&'static str> {
        analyse(rows, &[], &[], &ProfileOptions::default(), None)
            .findings
            .iter()
            .map(|f| f.rule)
            .collect()
    }

    #[test]
    fn each_rule_fires_on_its_evidence_and_none_on_a_balanced_step() {
        let balanced: Vec<_> = (1..=6)
            .map(|s| row(s, [0.5, 30.0, 60.0, 5.0, 0.0, 1.0]))
            .collect();
        assert!(rules(&balanced).is_empty(), "{:?}", rules(&balanced));
        let data: Vec<_> = (1..=6)
            .map(|s| row(s, [40.0, 30.0, 60.0, 5.0, 0.0, 1.0]))
            .collect();
        assert_eq!(rules(&data), ["data-bound"]);
        let f = &analyse(&data, &[], &[], &ProfileOptions::default(), None).findings[0];
        assert!(f.suggestion.contains("num_workers = 2"), "{f:?}");
        // A long wait in the first profiled step alone (the profiler starting) is not.
        let mut first = balanced.clone();
        first[0] = row(1, [263.0, 30.0, 60.0, 5.0, 0.0, 1.0]);
        assert!(rules(&first).is_empty(), "{:?}", rules(&first));
        let opt: Vec<_> = (1..=6)
            .map(|s| row(s, [0.5, 30.0, 60.0, 40.0, 0.0, 1.0]))
            .collect();
        assert_eq!(rules(&opt), ["optimizer-bound"]);
        let comm: Vec<_> = (1..=6)
            .map(|s| row(s, [0.5, 30.0, 60.0, 5.0, 30.0, 1.0]))
            .collect();
        assert_eq!(rules(&comm), ["communication-bound"]);
        // Step 5's backward swings from 60 to 600 ms (the seed's 1.6 s → 30 s).
        let mut swing = balanced.clone();
        swing[4] = row(5, [0.5, 30.0, 600.0, 5.0, 0.0, 1.0]);
        swing[2] = row(3, [0.5, 30.0, 200.0, 5.0, 0.0, 1.0]);
        assert_eq!(rules(&swing), ["high-variance"]);
        let f = &analyse(&swing, &[], &[], &ProfileOptions::default(), None).findings[0];
        assert!(
            f.evidence.contains("step 5") && f.evidence.contains("backward"),
            "{f:?}"
        );
        assert!(f.suggestion.contains("other work on the machine"), "{f:?}");
        // A step that wrote a checkpoint ("other" grew) is named as such.
        let mut ckpt = balanced.clone();
        ckpt[5] = row(6, [0.5, 30.0, 60.0, 5.0, 0.0, 700.0]);
        ckpt[2] = row(3, [0.5, 30.0, 60.0, 5.0, 0.0, 150.0]);
        let f = &analyse(&ckpt, &[], &[], &ProfileOptions::default(), None).findings[0];
        assert!(
            f.rule == "high-variance" && f.suggestion.contains("checkpoint"),
            "{f:?}"
        );
        // A slow first step alone (warm-up) is not variance.
        let mut first = balanced.clone();
        first[0] = row(1, [0.5, 300.0, 600.0, 5.0, 0.0, 1.0]);
        assert!(rules(&first).is_empty());
    }

    #[test]
    fn self_time_excludes_nested_kernels_on_the_same_thread() {
        let ev = |name: &'static str, start_ns, dur_ns, tid| Event {
            name: name.into(),
            cat: "op.bwd",
            start_ns,
            dur_ns,
            tid,
            flops: 0,
            layer: None,
        };
        // softmax (0..100) holds softmax-grad (10..40); another thread overlaps in time.
        let events = [
            ev("softmax", 0, 100, 1),
            ev("softmax-grad", 10, 30, 1),
            ev("linear", 20, 50, 2),
        ];
        assert_eq!(self_times(&events), [70, 30, 50]);
        let rows = [row(1, [0.0, 0.0, 0.0002, 0.0, 0.0, 0.0])];
        let r = analyse(&rows, &events, &[], &ProfileOptions::default(), None);
        let softmax = r.ops.iter().find(|o| o.name == "softmax").unwrap();
        assert_eq!(
            (softmax.self_ms, softmax.total_ms, softmax.calls),
            (70e-6, 100e-6, 1)
        );
    }

    #[test]
    fn layers_are_listed_in_forward_order_with_their_backward_time() {
        let ev = |name: &'static str, fwd: bool, layer: Option<&str>, start_ns, dur_ns, flops| Event {
            name: name.into(),
            cat: if fwd { "op.fwd" } else { "op.bwd" },
            start_ns,
            dur_ns,
            tid: 1,
            flops,
            layer: layer.map(Into::into),
        };
        // Forward: embeddings, encoder.0, loss; backward in reverse; one kernel outside any
        // scope. The softmax-grad nested in encoder.0's backward counts only once.
        let events = [
            ev("embedding", true, Some("embeddings"), 0, 10, 0),
            ev("linear", true, Some("encoder.0"), 20, 100, 4000),
            ev("cross-entropy", true, Some("loss"), 130, 5, 0),
            ev("cross-entropy", false, Some("loss"), 200, 5, 0),
            ev("softmax", false, Some("encoder.0"), 210, 50, 0),
            ev("softmax-grad", false, Some("encoder.0"), 220, 20, 0),
            ev("linear", false, Some("encoder.0"), 300, 200, 8000),
            ev("gather", false, None, 600, 7, 0),
        ];
        let rows = [row(1, [0.0, 0.0, 0.001, 0.0, 0.0, 0.0])];
        let r = analyse(&rows, &events, &[], &ProfileOptions::default(), None);
        let names: Vec<&str> = r.layers.iter().map(|l| l.layer.as_str()).collect();
        assert_eq!(names, ["embeddings", "encoder.0", "loss", "(none)"]);
        let enc = &r.layers[1];
        assert_eq!((enc.fwd_ms, enc.bwd_ms, enc.calls), (100e-6, 250e-6, 4));
        // 12 000 FLOPs over 300 ns of products: 40 GFLOP/s.
        assert!((enc.gflops.unwrap() - 40.0).abs() < 1e-9, "{enc:?}");
        assert!((enc.share - 0.35).abs() < 1e-9);
        assert_eq!(r.layers[0].gflops, None);
        assert!(r.text(5).contains("encoder.0 0.0 + 0.0 (35 %)"), "{}", r.text(5));
        let trace = chrome_trace(&events);
        assert_eq!(trace["traceEvents"][1]["args"]["layer"], "encoder.0");
        assert_eq!(trace["traceEvents"][1]["args"]["flops"], 4000);
    }

    #[test]
    fn a_data_bound_run_on_saturated_cores_is_told_to_load_cheaper_not_wider() {
        let data: Vec<_> = (1..=6)
            .map(|s| row(s, [40.0, 30.0, 60.0, 5.0, 0.0, 1.0]))
            .collect();
        let busy = |b: f64| crate::monitor::MonitorSummary {
            samples: 10,
            cores: 2,
            mean_core_busy: vec![b, b],
            peak_rss: 1,
            max_threads: 6,
            mean_runnable: 2.0,
        };
        let opts = ProfileOptions {
            num_workers: 2,
            ..Default::default()
        };
        let analyse_with = |b: f64| {
            let r = analyse(&data, &[], &[], &opts, None);
            diagnose(&data, &r.phases, r.median_step_ms, Some(&busy(b)), &opts)
        };
        assert!(analyse_with(0.5)[0].suggestion.contains("num_workers = 3"));
        let f = &analyse_with(0.97)[0];
        assert!(
            f.suggestion.contains("97 % busy") && f.suggestion.contains("cheaper"),
            "{f:?}"
        );
    }

    #[test]
    fn oversubscription_needs_more_runnable_threads_than_cores() {
        let m = |runnable| crate::monitor::MonitorSummary {
            samples: 10,
            cores: 2,
            mean_core_busy: vec![1.0, 1.0],
            peak_rss: 1,
            max_threads: 9,
            mean_runnable: runnable,
        };
        assert!(oversubscribed(&m(3.0), 2).is_none());
        let f = oversubscribed(&m(4.6), 2).unwrap();
        assert!(
            f.evidence.contains("4.6") && f.evidence.contains("2 cores"),
            "{f:?}"
        );
    }

    #[test]
    fn steps_outside_the_window_are_not_profiled() {
        let o = ProfileOptions {
            steps: Some((3, 4)),
            ..Default::default()
        };
        assert_eq!((1..=6).filter(|&s| o.covers(s)).collect::<Vec<_>>(), [3, 4]);
        assert!(ProfileOptions::default().covers(1_000_000));
    }

    #[test]
    fn matmul_bound_names_the_share_and_the_fix_for_this_cpu() {
        let row = |name: &str, ms: f64, gflops: Option<f64>| OpRow {
            name: name.into(),
            pass: "fwd",
            calls: 1,
            self_ms: ms,
            total_ms: ms,
            share: ms / 100.0,
            gflops,
        };
        let ops = [
            row("feed-forward-block", 40.0, Some(100.0)),
            row("attention-block", 20.0, Some(50.0)),
            row("layer-norm", 30.0, None),
        ];
        // 60 % of the time in products: 40 ms at 100 and 20 ms at 50 GFLOP/s = 5 GFLOP in 60 ms.
        let f = matmul_bound(&ops, false, true, None).unwrap();
        assert_eq!(f.rule, "matmul-bound");
        assert!(
            f.evidence.contains("60 %") && f.evidence.contains("83 GFLOP/s"),
            "{f:?}"
        );
        assert!(f.suggestion.contains("precision = \"bf16\""), "{f:?}");
        assert!(matmul_bound(&ops, false, false, None)
            .unwrap()
            .suggestion
            .contains("no bf16 arithmetic"));
        assert!(matmul_bound(&ops, true, true, None)
            .unwrap()
            .suggestion
            .contains("already run in bf16"));
        let f = matmul_bound(&ops, true, false, None).unwrap();
        assert!(f.suggestion.contains("keeps f32 products"), "{f:?}");
        assert!(f.evidence.contains("(f32)"), "{f:?}");
        // Below half the time, no finding.
        assert!(matmul_bound(&ops[1..], false, true, None).is_none());
        // Most of the 5 GFLOP too shallow for bf16 products (a narrow ViT): bf16 is not
        // the advice, on or off, and the products are reported as f32.
        for bf16 in [false, true] {
            let f = matmul_bound(&ops, bf16, true, Some(1.0)).unwrap();
            assert!(
                f.suggestion.starts_with("only 20 % of the product work")
                    && f.suggestion.contains("saves little time")
                    && f.evidence.contains("(f32)"),
                "{f:?}"
            );
        }
        // Most of it deep enough (MiniLM): the advice stands.
        let f = matmul_bound(&ops, false, true, Some(4.5)).unwrap();
        assert!(f.suggestion.starts_with("set train.precision"), "{f:?}");
        assert!(matmul_bound(&ops, true, true, Some(4.5))
            .unwrap()
            .evidence
            .contains("(bf16)"));
        // Convolutions carrying most of the products (a GAN's critic, 7.4 GFLOP): deep and
        // wide enough, bf16 is the advice; a first layer's shallow ones alone, it is not.
        let ops = [
            row("conv2d", 50.0, Some(120.0)),
            row("conv-transpose2d", 10.0, Some(110.0)),
            row("linear", 5.0, Some(60.0)),
            row("batch-norm", 20.0, None),
        ];
        let f = matmul_bound(&ops, false, true, Some(6.0)).unwrap();
        assert!(
            f.suggestion.starts_with("set train.precision") && f.suggestion.contains("convolutions"),
            "{f:?}"
        );
        let f = matmul_bound(&ops, true, true, Some(1.0)).unwrap();
        assert!(
            f.suggestion.starts_with("only 14 % of the product work")
                && f.suggestion.contains("first convolution"),
            "{f:?}"
        );
    }
}
