//! Spans for the profiler: named, timed regions recorded only while a [`Recorder`] is
//! active. Trident's own kernels open one per forward and backward call (category
//! `op.fwd` / `op.bwd`, with the FLOPs of matrix products); the trainer opens one per step
//! phase; users annotate their own code with [`span`] (PR-4).
//!
//! Layers: a model opens a [`layer`] scope around each of its layers (`encoder.3`,
//! `conv2`); forward spans record the innermost scope. A kernel captures the scope when it
//! is built ([`current_layer`]) and opens its backward span with [`op_span_in`], so the
//! backward pass, which candle runs long after the scopes closed, is attributed to the same
//! layer; kernels nested inside a backward span inherit its layer.
//!
//! Off (the default) a span costs one relaxed atomic load and records nothing.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One finished span.
#[derive(Debug, Clone)]
pub struct Event {
    /// What ran: an operator (`linear`, `softmax`), a phase (`forward`) or a user region.
    pub name: Cow<'static, str>,
    /// `op.fwd`, `op.bwd`, `phase`, `step` or `region`.
    pub cat: &'static str,
    /// Start, nanoseconds since the recorder started.
    pub start_ns: u64,
    /// Duration in nanoseconds.
    pub dur_ns: u64,
    /// A small per-thread number (1 = the first thread that recorded).
    pub tid: u64,
    /// Floating-point operations done (matrix products), 0 when not counted.
    pub flops: u64,
    /// The model layer the span ran for (see [`layer`]), when one was open.
    pub layer: Option<Arc<str>>,
}

/// Collects the events of one profiled run.
#[derive(Debug)]
pub struct Recorder {
    origin: Instant,
    events: Mutex<Vec<Event>>,
    /// FLOPs of the products deep enough to run in bf16 ([`count_bf16_ready`]).
    bf16_ready: AtomicU64,
}

impl Recorder {
    /// The time the recorder started.
    pub fn origin(&self) -> Instant {
        self.origin
    }

    /// Nanoseconds from the origin to `t`.
    pub fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.origin).as_nanos() as u64
    }

    /// Records a finished event.
    pub fn push(&self, e: Event) {
        self.events.lock().expect("trace lock").push(e);
    }

    /// Takes the events recorded so far.
    pub fn take(&self) -> Vec<Event> {
        std::mem::take(&mut *self.events.lock().expect("trace lock"))
    }

    /// FLOPs counted by [`count_bf16_ready`] while this recorder recorded.
    pub fn bf16_ready_flops(&self) -> u64 {
        self.bf16_ready.load(Ordering::Relaxed)
    }
}

/// Counts `flops` of matrix products deep enough that mixed precision runs them in bf16
/// where the CPU has bf16 arithmetic (`bf16::matmul` calls this for an inner dimension of
/// at least `bf16::MIN_BF16_DEPTH`, the convolutions for products of the shapes
/// `ops::conv_bf16` runs in bf16, whatever the run's precision), while recording: the
/// profiler compares them with all the products' FLOPs before it advises bf16.
#[inline]
pub fn count_bf16_ready(flops: u64) {
    if !enabled() {
        return;
    }
    if let Some(r) = current() {
        r.bf16_ready.fetch_add(flops, Ordering::Relaxed);
    }
}

static ON: AtomicBool = AtomicBool::new(false);
static CURRENT: Mutex<Option<Arc<Recorder>>> = Mutex::new(None);
static NEXT_TID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static TID: Cell<u64> = const { Cell::new(0) };
    static LAYER: RefCell<Option<Arc<str>>> = const { RefCell::new(None) };
    static MUTED: Cell<bool> = const { Cell::new(false) };
}

/// This thread records no spans from now on, even while recording is on: the threads of
/// data-parallel replicas other than rank 0 (one profile describes one replica).
pub fn mute_this_thread() {
    MUTED.with(|m| m.set(true));
}

/// This thread's small id.
pub fn thread_id() -> u64 {
    TID.with(|t| {
        if t.get() == 0 {
            t.set(NEXT_TID.fetch_add(1, Ordering::Relaxed));
        }
        t.get()
    })
}

/// Starts recording into a new recorder (replacing any other) and returns it.
pub fn start() -> Arc<Recorder> {
    let r = Arc::new(Recorder {
        origin: Instant::now(),
        events: Mutex::new(Vec::new()),
        bf16_ready: AtomicU64::new(0),
    });
    *CURRENT.lock().expect("trace lock") = Some(r.clone());
    ON.store(true, Ordering::Release);
    r
}

/// Stops recording; spans opened from now on record nothing.
pub fn stop() {
    ON.store(false, Ordering::Release);
    *CURRENT.lock().expect("trace lock") = None;
}

/// Pauses (`false`) or resumes (`true`) the current recorder: profiling chosen steps only.
pub fn set_recording(on: bool) {
    let has = CURRENT.lock().expect("trace lock").is_some();
    ON.store(on && has, Ordering::Release);
}

/// Whether spans are being recorded.
#[inline]
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed) && !MUTED.with(|m| m.get())
}

fn current() -> Option<Arc<Recorder>> {
    CURRENT.lock().expect("trace lock").clone()
}

/// A timed region; records an [`Event`] when dropped, if recording was on when it opened.
#[must_use = "a span measures until it is dropped"]
pub struct Span(Option<Open>);

struct Open {
    rec: Arc<Recorder>,
    name: Cow<'static, str>,
    cat: &'static str,
    start: Instant,
    flops: u64,
    layer: Option<Arc<str>>,
    /// The thread's layer before this span set its own (backward spans), to restore.
    restore: Option<Option<Arc<str>>>,
}

/// Opens a span named `name` in category `cat`.
#[inline]
pub fn span(name: impl Into<Cow<'static, str>>, cat: &'static str) -> Span {
    span_flops(name, cat, 0)
}

/// Opens a span that did `flops` floating-point operations.
#[inline]
pub fn span_flops(name: impl Into<Cow<'static, str>>, cat: &'static str, flops: u64) -> Span {
    if !enabled() {
        return Span(None);
    }
    Span(current().map(|rec| Open {
        rec,
        name: name.into(),
        cat,
        start: Instant::now(),
        flops,
        layer: LAYER.with(|l| l.borrow().clone()),
        restore: None,
    }))
}

/// The layer scope open on this thread, for a kernel to keep until its backward pass
/// (`None` while not recording, so kernels built outside a profile keep nothing).
#[inline]
pub fn current_layer() -> Option<Arc<str>> {
    if !enabled() {
        return None;
    }
    LAYER.with(|l| l.borrow().clone())
}

/// A kernel span attributed to `layer` (the one the kernel captured when it was built);
/// kernels nested inside it inherit that layer. Used for backward passes.
#[inline]
pub fn op_span_in(layer: &Option<Arc<str>>, name: &'static str, cat: &'static str, flops: u64) -> Span {
    let mut s = op_span_flops(name, cat, flops);
    if let (Some(o), Some(l)) = (s.0.as_mut(), layer) {
        o.layer = Some(l.clone());
        o.restore = Some(LAYER.with(|t| t.replace(Some(l.clone()))));
    }
    s
}

/// While the returned guard lives, spans on this thread belong to layer `name()`, nested
/// in the enclosing scope (`encoder` then `3` gives `encoder/3`). Free when not recording:
/// `name` is not even called.
#[inline]
pub fn layer(name: impl FnOnce() -> String) -> LayerScope {
    if !enabled() {
        return LayerScope(None);
    }
    let prev = LAYER.with(|l| {
        let prev = l.borrow().clone();
        let full: Arc<str> = match &prev {
            Some(p) => format!("{p}/{}", name()).into(),
            None => name().into(),
        };
        l.replace(Some(full));
        prev
    });
    LayerScope(Some(prev))
}

/// Closes a [`layer`] scope when dropped.
#[must_use = "a layer scope lasts until it is dropped"]
pub struct LayerScope(Option<Option<Arc<str>>>);

impl Drop for LayerScope {
    fn drop(&mut self) {
        if let Some(prev) = self.0.take() {
            LAYER.with(|l| *l.borrow_mut() = prev);
        }
    }
}

/// A span for one of Trident's kernels: `name` without its `trident-` prefix.
#[inline]
pub fn op_span(name: &'static str, cat: &'static str) -> Span {
    op_span_flops(name, cat, 0)
}

/// [`op_span`] with the kernel's floating-point operations.
#[inline]
pub fn op_span_flops(name: &'static str, cat: &'static str, flops: u64) -> Span {
    span_flops(name.strip_prefix("trident-").unwrap_or(name), cat, flops)
}

/// A user region (category `region`): `let _r = trace::region("augment");`.
#[inline]
pub fn region(name: impl Into<Cow<'static, str>>) -> Span {
    span(name, "region")
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(o) = self.0.take() {
            let end = Instant::now();
            if let Some(prev) = o.restore {
                LAYER.with(|l| *l.borrow_mut() = prev);
            }
            let start_ns = o.rec.ns(o.start);
            o.rec.push(Event {
                name: o.name,
                cat: o.cat,
                start_ns,
                dur_ns: o.rec.ns(end).saturating_sub(start_ns),
                tid: thread_id(),
                flops: o.flops,
                layer: o.layer,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the recorder is process-wide.
    #[test]
    fn spans_record_only_while_recording() {
        {
            let _s = span("before", "region");
        }
        let r = start();
        {
            let _a = region("outer");
            let _b = span_flops("linear", "op.fwd", 42);
        }
        set_recording(false);
        {
            let _c = region("paused");
        }
        set_recording(true);
        {
            let _d = region("again");
        }
        stop();
        {
            let _e = region("after");
        }
        let ev = r.take();
        let names: Vec<&str> = ev.iter().map(|e| e.name.as_ref()).collect();
        // Inner spans end first.
        assert_eq!(names, ["linear", "outer", "again"]);
        assert_eq!(ev[0].flops, 42);
        assert!(ev[1].start_ns <= ev[0].start_ns && ev[0].dur_ns <= ev[1].dur_ns);
        assert!(!enabled());

        // Layer scopes: forward spans take the open scope, nested scopes join with '/',
        // a backward span takes the layer its kernel captured and lends it to nested spans.
        let r = start();
        let captured = {
            let _l = layer(|| "encoder".into());
            let _m = layer(|| "3".into());
            let _f = op_span("linear", "op.fwd");
            current_layer()
        };
        assert_eq!(current_layer(), None);
        {
            let _b = op_span_in(&captured, "linear", "op.bwd", 0);
            let _n = op_span("softmax-grad", "op.fwd");
        }
        assert_eq!(
            current_layer(),
            None,
            "the backward span restores the thread's layer"
        );
        let _ = op_span("loose", "op.fwd");
        stop();
        let _off = layer(|| unreachable!("not called while not recording"));
        let ev = r.take();
        let got: Vec<(&str, Option<&str>)> =
            ev.iter().map(|e| (e.name.as_ref(), e.layer.as_deref())).collect();
        assert_eq!(
            got,
            [
                ("linear", Some("encoder/3")),
                ("softmax-grad", Some("encoder/3")),
                ("linear", Some("encoder/3")),
                ("loose", None)
            ]
        );
    }
}
