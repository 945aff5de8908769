//! Spans for the profiler: named, timed regions recorded only while a [`Recorder`] is
//! active. Trident's own kernels open one per forward and backward call (category
//! `op.fwd` / `op.bwd`, with the FLOPs of matrix products); the trainer opens one per step
//! phase; users annotate their own code with [`span`] (PR-4).
//!
//! Off (the default) a span costs one relaxed atomic load and records nothing.

use std::borrow::Cow;
use std::cell::Cell;
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
}

/// Collects the events of one profiled run.
#[derive(Debug)]
pub struct Recorder {
    origin: Instant,
    events: Mutex<Vec<Event>>,
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
}

static ON: AtomicBool = AtomicBool::new(false);
static CURRENT: Mutex<Option<Arc<Recorder>>> = Mutex::new(None);
static NEXT_TID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static TID: Cell<u64> = const { Cell::new(0) };
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
    ON.load(Ordering::Relaxed)
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
    }))
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
            let start_ns = o.rec.ns(o.start);
            o.rec.push(Event {
                name: o.name,
                cat: o.cat,
                start_ns,
                dur_ns: o.rec.ns(end).saturating_sub(start_ns),
                tid: thread_id(),
                flops: o.flops,
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
    }
}
