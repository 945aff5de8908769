//! The dynamic batcher's decision logic as a pure state machine: no threads, no clock.
//! The scheduler feeds it requests and asks, whenever an instance is free, what to run
//! now; tests drive it directly with chosen instants.
//!
//! Policy (Triton's dynamic batcher): requests are taken in arrival order while they
//! fit in `max_batch_size` and have the same non-batch shapes. A batch is dispatched at
//! once when it reaches the largest preferred size (or `max_batch_size` when none is
//! configured), when the next request cannot join it, or when its oldest request has
//! waited `max_queue_delay`. A batch dispatched for those last two reasons is cut at the
//! largest preferred size it contains, if any. Requests whose client has gone are
//! dropped before they cost an execution.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// What the batcher needs to know about a queued request.
pub trait BatchItem {
    /// Rows this request contributes (its first dimension; 1 for non-batching models).
    fn batch_size(&self) -> usize;
    /// Requests merge only when these are equal (non-batch shapes, present inputs).
    fn signature(&self) -> &[i64];
    /// Whether the client has gone away.
    fn is_cancelled(&self) -> bool;
    /// When the request was queued.
    fn enqueued_at(&self) -> Instant;
}

/// Batching parameters from `config.pbtxt`.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchPolicy {
    /// Merge requests at all (a `dynamic_batching` block is present).
    pub enabled: bool,
    /// Largest merged batch.
    pub max_batch_size: usize,
    /// Sizes worth waiting for, ascending.
    pub preferred: Vec<usize>,
    /// Longest time the oldest request waits for a batch to fill.
    pub max_delay: Duration,
}

/// The batcher's answer when an instance is free.
#[derive(Debug)]
pub enum Decision<T> {
    /// Run these requests now, as one execution.
    Dispatch(Vec<T>),
    /// Nothing to run before this instant (unless more requests arrive).
    WaitUntil(Instant),
    /// The queue is empty.
    Idle,
}

/// Queued requests plus the policy that turns them into batches.
#[derive(Debug)]
pub struct BatchQueue<T> {
    policy: BatchPolicy,
    queue: VecDeque<T>,
}

impl<T: BatchItem> BatchQueue<T> {
    /// An empty queue.
    pub fn new(mut policy: BatchPolicy) -> Self {
        policy.preferred.sort_unstable();
        policy.preferred.dedup();
        BatchQueue {
            policy,
            queue: VecDeque::new(),
        }
    }

    /// Number of queued requests.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Queues a request.
    pub fn push(&mut self, item: T) {
        self.queue.push_back(item);
    }

    /// Removes requests whose client went away and returns them.
    pub fn drain_cancelled(&mut self) -> Vec<T> {
        let (gone, kept): (Vec<T>, Vec<T>) = self.queue.drain(..).partition(|i| i.is_cancelled());
        self.queue = kept.into();
        gone
    }

    /// Decides what a free instance should run at `now`.
    pub fn poll(&mut self, now: Instant) -> Decision<T> {
        let Some(first) = self.queue.front() else {
            return Decision::Idle;
        };
        if !self.policy.enabled {
            return Decision::Dispatch(vec![self.queue.pop_front().expect("non-empty")]);
        }
        let (count, rows, blocked) = self.fitting_prefix();
        let target = self
            .policy
            .preferred
            .last()
            .copied()
            .unwrap_or(self.policy.max_batch_size);
        let deadline = first.enqueued_at() + self.policy.max_delay;
        if rows >= target {
            let cut = self
                .cut_at_preferred(count)
                .filter(|_| rows > target)
                .unwrap_or(count);
            return self.take(cut);
        }
        if blocked || now >= deadline {
            let cut = self.cut_at_preferred(count).unwrap_or(count);
            return self.take(cut);
        }
        Decision::WaitUntil(deadline)
    }

    /// Longest run of queued requests that fit together: (requests, rows, whether the
    /// next request could not join).
    fn fitting_prefix(&self) -> (usize, usize, bool) {
        let signature = self.queue[0].signature();
        let mut rows = 0;
        for (i, item) in self.queue.iter().enumerate() {
            let fits = rows + item.batch_size() <= self.policy.max_batch_size;
            if i > 0 && (!fits || item.signature() != signature) {
                return (i, rows, true);
            }
            rows += item.batch_size();
        }
        (self.queue.len(), rows, false)
    }

    /// Number of leading requests whose rows add up to the largest preferred size.
    fn cut_at_preferred(&self, count: usize) -> Option<usize> {
        let mut rows = 0;
        let mut best = None;
        for (i, item) in self.queue.iter().take(count).enumerate() {
            rows += item.batch_size();
            if self.policy.preferred.contains(&rows) {
                best = Some(i + 1);
            }
        }
        best
    }

    fn take(&mut self, n: usize) -> Decision<T> {
        Decision::Dispatch(self.queue.drain(..n.max(1)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Req {
        id: u32,
        rows: usize,
        sig: Vec<i64>,
        at: Instant,
        gone: bool,
    }

    impl BatchItem for Req {
        fn batch_size(&self) -> usize {
            self.rows
        }
        fn signature(&self) -> &[i64] {
            &self.sig
        }
        fn is_cancelled(&self) -> bool {
            self.gone
        }
        fn enqueued_at(&self) -> Instant {
            self.at
        }
    }

    fn queue(preferred: &[usize], max: usize, delay_us: u64) -> BatchQueue<Req> {
        BatchQueue::new(BatchPolicy {
            enabled: true,
            max_batch_size: max,
            preferred: preferred.to_vec(),
            max_delay: Duration::from_micros(delay_us),
        })
    }

    fn req(id: u32, rows: usize, at: Instant) -> Req {
        Req {
            id,
            rows,
            sig: vec![16],
            at,
            gone: false,
        }
    }

    fn ids(d: Decision<Req>) -> Vec<u32> {
        match d {
            Decision::Dispatch(v) => v.iter().map(|r| r.id).collect(),
            other => panic!("expected a dispatch, got {other:?}"),
        }
    }

    #[test]
    fn waits_for_delay_then_sends_what_it_has() {
        let t0 = Instant::now();
        let mut q = queue(&[], 8, 100);
        q.push(req(1, 1, t0));
        q.push(req(2, 1, t0));
        assert!(matches!(q.poll(t0), Decision::WaitUntil(d) if d == t0 + Duration::from_micros(100)));
        assert_eq!(ids(q.poll(t0 + Duration::from_micros(100))), vec![1, 2]);
        assert!(matches!(q.poll(t0), Decision::Idle));
    }

    #[test]
    fn dispatches_at_once_when_the_largest_preferred_size_is_reached() {
        let t0 = Instant::now();
        let mut q = queue(&[2, 4], 8, 1_000_000);
        for i in 0..3 {
            q.push(req(i, 1, t0));
        }
        assert!(matches!(q.poll(t0), Decision::WaitUntil(_)));
        q.push(req(3, 1, t0));
        q.push(req(4, 1, t0));
        assert_eq!(
            ids(q.poll(t0)),
            vec![0, 1, 2, 3],
            "cut at preferred 4, request 4 waits"
        );
        assert!(matches!(q.poll(t0), Decision::WaitUntil(_)));
    }

    #[test]
    fn on_timeout_cuts_at_the_largest_preferred_size_available() {
        let t0 = Instant::now();
        let mut q = queue(&[2, 4], 8, 10);
        for i in 0..3 {
            q.push(req(i, 1, t0));
        }
        let late = t0 + Duration::from_micros(10);
        assert_eq!(ids(q.poll(late)), vec![0, 1]);
        assert_eq!(
            ids(q.poll(late)),
            vec![2],
            "no preferred size possible: send what is there"
        );
    }

    #[test]
    fn never_exceeds_max_batch_size() {
        let t0 = Instant::now();
        let mut q = queue(&[], 4, 1_000_000);
        q.push(req(0, 3, t0));
        q.push(req(1, 2, t0));
        assert_eq!(
            ids(q.poll(t0)),
            vec![0],
            "request 1 would overflow: send request 0 now"
        );
        assert!(matches!(q.poll(t0), Decision::WaitUntil(_)));
    }

    #[test]
    fn different_shapes_do_not_merge() {
        let t0 = Instant::now();
        let mut q = queue(&[], 8, 1_000_000);
        q.push(req(0, 1, t0));
        q.push(Req {
            sig: vec![32],
            ..req(1, 1, t0)
        });
        q.push(req(2, 1, t0));
        assert_eq!(
            ids(q.poll(t0)),
            vec![0],
            "request 1 cannot join: send request 0 now"
        );
        assert_eq!(ids(q.poll(t0)), vec![1]);
        assert!(
            matches!(q.poll(t0), Decision::WaitUntil(_)),
            "request 2 waits for company"
        );
    }

    #[test]
    fn zero_delay_dispatches_immediately() {
        let t0 = Instant::now();
        let mut q = queue(&[4], 8, 0);
        q.push(req(0, 1, t0));
        assert_eq!(ids(q.poll(t0)), vec![0]);
    }

    #[test]
    fn disabled_batching_runs_requests_one_by_one() {
        let t0 = Instant::now();
        let mut q = BatchQueue::new(BatchPolicy {
            enabled: false,
            max_batch_size: 8,
            preferred: vec![],
            max_delay: Duration::ZERO,
        });
        q.push(req(0, 2, t0));
        q.push(req(1, 2, t0));
        assert_eq!(ids(q.poll(t0)), vec![0]);
        assert_eq!(ids(q.poll(t0)), vec![1]);
    }

    #[test]
    fn cancelled_requests_are_dropped() {
        let t0 = Instant::now();
        let mut q = queue(&[], 8, 0);
        q.push(Req {
            gone: true,
            ..req(0, 1, t0)
        });
        q.push(req(1, 1, t0));
        assert_eq!(q.drain_cancelled().len(), 1);
        assert_eq!(ids(q.poll(t0)), vec![1]);
    }
}
