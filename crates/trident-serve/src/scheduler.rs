//! The scheduler thread and the instance threads of one model version.
//!
//! Requests go into a [`BatchQueue`] shared by the model's instances. Instances are OS
//! threads that own a [`ModelInstance`]: when idle, one asks the queue what to run,
//! assembles the batch, executes it, splits the outputs and replies to each request
//! through its oneshot. No tensor work ever runs on an async executor thread.

use crate::backend::{BackendError, Model, ModelInstance, ResponseSender, Streamed};
use crate::batcher::{BatchItem, BatchPolicy, BatchQueue, Decision};
use crate::stats::{ExecutionTimes, ModelStats};
use crate::ServeError;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Instant;
use trident_core::Tensor;

/// Named tensors (a job's inputs, or an execution's outputs).
type Outputs = Vec<(String, Tensor)>;

/// What an execution gives each request: its outputs and the execution's model time.
pub(crate) struct Executed {
    pub outputs: Outputs,
    /// compute_infer of the execution the request was part of.
    pub compute_infer: std::time::Duration,
}

/// One queued request.
pub(crate) struct Job {
    pub inputs: Outputs,
    pub rows: usize,
    pub signature: Vec<i64>,
    pub enqueued: Instant,
    pub reply: Reply,
}

/// Where a job's answer goes.
pub(crate) enum Reply {
    /// The one answer of a model that is not decoupled.
    Once(tokio::sync::oneshot::Sender<Result<Executed, ServeError>>),
    /// A decoupled model's responses (such a job always runs alone).
    Stream(tokio::sync::mpsc::Sender<Streamed>),
}

impl Reply {
    fn is_closed(&self) -> bool {
        match self {
            Reply::Once(tx) => tx.is_closed(),
            Reply::Stream(tx) => tx.is_closed(),
        }
    }

    fn send(self, result: Result<Executed, ServeError>) {
        match self {
            Reply::Once(tx) => drop(tx.send(result)),
            // A decoupled job runs alone (`run_alone` → `run_decoupled`), its responses
            // through its ResponseSender: only its failure comes here.
            Reply::Stream(tx) => {
                debug_assert!(result.is_err(), "a decoupled job answered through Reply::send");
                if let Err(e) = result {
                    drop(tx.blocking_send(Streamed::Failed(e)));
                }
            }
        }
    }
}

impl BatchItem for Job {
    fn batch_size(&self) -> usize {
        self.rows
    }
    fn signature(&self) -> &[i64] {
        &self.signature
    }
    fn is_cancelled(&self) -> bool {
        self.reply.is_closed()
    }
    fn enqueued_at(&self) -> Instant {
        self.enqueued
    }
}

/// The queue shared by a model version's instance threads.
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

struct State {
    queue: BatchQueue<Job>,
    closed: bool,
}

/// Handle to a model version's instances; dropping it lets them finish and exit.
pub(crate) struct Scheduler {
    shared: Arc<Shared>,
}

impl Scheduler {
    /// Queues a job and wakes an idle instance.
    pub fn submit(&self, job: Job) {
        self.shared.state.lock().expect("scheduler lock").queue.push(job);
        self.shared.wake.notify_one();
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.shared.state.lock().expect("scheduler lock").closed = true;
        self.shared.wake.notify_all();
    }
}

/// Creates `instances` instances of `model` and starts one OS thread for each.
///
/// There is no scheduler thread: an idle instance takes the lock, asks the batcher what
/// to run, and either runs it or sleeps on the condition variable until the batch
/// deadline or the next arrival. A request thus reaches an engine with a single
/// thread hand-off.
pub(crate) fn start(
    label: &str,
    model: &dyn Model,
    instances: usize,
    policy: BatchPolicy,
    stats: Arc<ModelStats>,
    warmup: &[crate::warmup::WarmupSample],
) -> Result<Scheduler, BackendError> {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            queue: BatchQueue::new(policy),
            closed: false,
        }),
        wake: Condvar::new(),
    });
    let scheduler = Scheduler {
        shared: shared.clone(),
    };
    let (warmed_tx, warmed) = std::sync::mpsc::channel();
    let instances = instances.max(1);
    for idx in 0..instances {
        let instance = model.instance()?;
        let (shared, stats) = (shared.clone(), stats.clone());
        let (samples, warmed_tx) = (warmup.to_vec(), warmed_tx.clone());
        thread::Builder::new()
            .name(format!("{label}#{idx}"))
            .spawn(move || {
                let mut instance = instance;
                // Warm-up on this instance's own thread, before it takes requests.
                let result = samples.iter().try_for_each(|s| {
                    (0..s.count).try_for_each(|_| {
                        instance
                            .execute(s.inputs.clone())
                            .map(drop)
                            .map_err(|e| format!("warm-up sample '{}' failed on instance {idx}: {e}", s.name))
                    })
                });
                let ok = result.is_ok();
                let _ = warmed_tx.send(result);
                if ok {
                    instance_loop(instance, &shared, &stats)
                }
            })
            .map_err(|e| BackendError::Execute(format!("cannot spawn instance thread: {e}")))?;
    }
    // Ready only once every instance has run its warm-up.
    for _ in 0..instances {
        match warmed.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(BackendError::Execute(e)),
            Err(_) => {
                return Err(BackendError::Execute(
                    "an instance thread ended during warm-up".into(),
                ))
            }
        }
    }
    Ok(scheduler)
}

fn instance_loop(mut instance: Box<dyn ModelInstance>, shared: &Shared, stats: &ModelStats) {
    let mut state = shared.state.lock().expect("scheduler lock");
    loop {
        // Clients that went away are dropped here; their futures already counted them.
        drop(state.queue.drain_cancelled());
        match state.queue.poll(Instant::now()) {
            Decision::Dispatch(jobs) => {
                let more = !state.queue.is_empty();
                drop(state);
                if more {
                    shared.wake.notify_one();
                }
                run_batch(instance.as_mut(), jobs, stats);
                state = shared.state.lock().expect("scheduler lock");
            }
            _ if state.closed => return,
            Decision::WaitUntil(deadline) => {
                let wait = deadline.saturating_duration_since(Instant::now());
                state = shared.wake.wait_timeout(state, wait).expect("scheduler lock").0;
            }
            Decision::Idle => state = shared.wake.wait(state).expect("scheduler lock"),
        }
    }
}

/// Runs one batch and replies to each of its requests. When a merged execution fails,
/// its requests run again one by one, so a request that breaks the engine fails alone
/// and the others get their answers.
fn run_batch(instance: &mut dyn ModelInstance, mut jobs: Vec<Job>, stats: &ModelStats) {
    let start = Instant::now();
    for job in &jobs {
        stats.inference.queue.record(start - job.enqueued);
    }
    if jobs.len() == 1 {
        return run_alone(instance, jobs.pop().expect("one job"), start, stats);
    }
    // Decoupled models never batch (`ModelVersion::start` turns their batching off), so
    // their jobs always took the branch above.
    let rows: Vec<i64> = jobs.iter().map(|j| j.rows as i64).collect();
    match assemble(&jobs).and_then(|inputs| execute(instance, inputs, &rows, start, stats)) {
        Ok(answers) => reply(jobs, answers),
        Err(e) => {
            tracing::warn!(
                "an execution of {} merged requests failed ({e}); running them one by one",
                jobs.len()
            );
            for job in jobs {
                run_alone(instance, job, Instant::now(), stats);
            }
        }
    }
}

/// Runs one job by itself; its inputs are handed to the engine (nothing would rerun it).
fn run_alone(instance: &mut dyn ModelInstance, mut job: Job, start: Instant, stats: &ModelStats) {
    let inputs = std::mem::take(&mut job.inputs);
    if let Reply::Stream(tx) = job.reply {
        return run_decoupled(instance, inputs, job.rows, tx, start, stats);
    }
    match execute(instance, inputs, &[job.rows as i64], start, stats) {
        Ok(answers) => reply(vec![job], answers),
        Err(e) => fail(vec![job], e),
    }
}

/// One execution of `inputs`, whose batch is `rows` rows of each job in turn: each job's
/// outputs and the execution's model time.
fn execute(
    instance: &mut dyn ModelInstance,
    inputs: Outputs,
    rows: &[i64],
    start: Instant,
    stats: &ModelStats,
) -> Result<(Vec<Outputs>, std::time::Duration), ServeError> {
    let t_input = start.elapsed();
    let t0 = Instant::now();
    let outputs =
        crate::backend::guard_panics("while executing", || instance.execute(inputs)).map_err(serve_error)?;
    let t_infer = t0.elapsed();
    let t1 = Instant::now();
    let split = split_outputs(outputs, rows, rows.len())?;
    let times = ExecutionTimes {
        input: t_input,
        infer: t_infer,
        output: t1.elapsed(),
    };
    let total = rows.iter().sum::<i64>() as usize;
    stats.record_execution(total, rows.len(), times);
    Ok((split, t_infer))
}

/// One request of a decoupled model: the instance sends its responses (now or from its
/// own threads); the execution's time is until the instance is free again.
fn run_decoupled(
    instance: &mut dyn ModelInstance,
    inputs: Outputs,
    rows: usize,
    tx: tokio::sync::mpsc::Sender<Streamed>,
    start: Instant,
    stats: &ModelStats,
) {
    let t_input = start.elapsed();
    let t0 = Instant::now();
    if tx.blocking_send(Streamed::Dispatched(start)).is_err() {
        return;
    }
    let responses = ResponseSender::new(tx.clone());
    match crate::backend::guard_panics("while executing", || {
        instance.execute_decoupled(inputs, responses)
    }) {
        Ok(()) => {
            let times = ExecutionTimes {
                input: t_input,
                infer: t0.elapsed(),
                output: std::time::Duration::ZERO,
            };
            stats.record_execution(rows, 1, times);
        }
        Err(e) => fail_one(Reply::Stream(tx), serve_error(e)),
    }
}

/// A backend's refusal of a request's data is the client's error; anything else is the
/// engine's.
fn serve_error(e: BackendError) -> ServeError {
    match e {
        BackendError::InvalidInput(m) => ServeError::InvalidRequest(m),
        e if e.is_invalid_input() => ServeError::InvalidRequest(e.to_string()),
        e => ServeError::Backend(e.to_string()),
    }
}

fn reply(jobs: Vec<Job>, (per_job, compute_infer): (Vec<Outputs>, std::time::Duration)) {
    for (job, outputs) in jobs.into_iter().zip(per_job) {
        job.reply.send(Ok(Executed {
            outputs,
            compute_infer,
        }));
    }
}

fn fail(jobs: Vec<Job>, e: ServeError) {
    for job in jobs {
        fail_one(job.reply, e.clone());
    }
}

fn fail_one(reply: Reply, e: ServeError) {
    match &e {
        ServeError::InvalidRequest(m) => tracing::debug!("request refused by the model: {m}"),
        e => tracing::warn!("execution failed: {e}"),
    }
    reply.send(Err(e));
}

/// Concatenates the jobs' inputs along the batch dimension (the jobs keep theirs, for a
/// rerun one by one).
fn assemble(jobs: &[Job]) -> Result<Outputs, ServeError> {
    let names = jobs[0].inputs.iter().map(|(n, _)| n);
    names
        .enumerate()
        .map(|(i, name)| {
            let parts: Vec<&Tensor> = jobs.iter().map(|j| &j.inputs[i].1).collect();
            Tensor::concat(&parts)
                .map(|t| (name.clone(), t))
                .map_err(|e| ServeError::Backend(format!("batching input '{name}': {e}")))
        })
        .collect()
}

/// Splits every output along the batch dimension into one set per job.
fn split_outputs(outputs: Outputs, rows: &[i64], jobs: usize) -> Result<Vec<Outputs>, ServeError> {
    let mut per_job: Vec<Outputs> = (0..jobs).map(|_| Vec::with_capacity(outputs.len())).collect();
    for (name, tensor) in outputs {
        let parts = if jobs == 1 {
            vec![tensor]
        } else {
            tensor.split(rows).map_err(|e| {
                ServeError::Backend(format!(
                    "output '{name}' cannot be split into batches {rows:?}: {e}"
                ))
            })?
        };
        for (slot, part) in per_job.iter_mut().zip(parts) {
            slot.push((name.clone(), part));
        }
    }
    Ok(per_job)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::ModelIo;
    use std::time::Duration;

    /// y = x, except that an execution containing a NaN fails (an engine error).
    struct FailsOnNan;
    struct FailsOnNanInstance;

    impl Model for FailsOnNan {
        fn io(&self) -> &ModelIo {
            unreachable!("not used by the scheduler")
        }
        fn instance(&self) -> Result<Box<dyn ModelInstance>, BackendError> {
            Ok(Box::new(FailsOnNanInstance))
        }
    }

    impl ModelInstance for FailsOnNanInstance {
        fn execute(&mut self, inputs: Vec<(String, Tensor)>) -> Result<Outputs, BackendError> {
            let x = inputs[0].1.to_f32().expect("f32 input");
            if x.iter().any(|v| v.is_nan()) {
                return Err(BackendError::Execute("NaN in the input".into()));
            }
            if x.iter().any(|v| v.is_infinite()) {
                panic!("an engine bug on infinity");
            }
            Ok(vec![("y".into(), inputs[0].1.clone())])
        }
    }

    fn job(value: f32) -> (Job, tokio::sync::oneshot::Receiver<Result<Executed, ServeError>>) {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let job = Job {
            inputs: vec![("x".into(), Tensor::from_f32(vec![1, 1], &[value]).unwrap())],
            rows: 1,
            signature: vec![0, 1, -2],
            enqueued: Instant::now(),
            reply: Reply::Once(reply),
        };
        (job, rx)
    }

    #[test]
    fn a_failing_request_does_not_fail_the_requests_merged_with_it() {
        let stats = Arc::new(ModelStats::default());
        let policy = BatchPolicy {
            enabled: true,
            max_batch_size: 8,
            preferred: vec![3],
            max_delay: Duration::from_secs(5),
        };
        let scheduler = start("t", &FailsOnNan, 1, policy, stats.clone(), &[]).unwrap();
        let replies: Vec<_> = [1.0, f32::NAN, 3.0]
            .into_iter()
            .map(|v| {
                let (job, rx) = job(v);
                scheduler.submit(job);
                rx
            })
            .collect();
        let results: Vec<_> = replies
            .into_iter()
            .map(|rx| rx.blocking_recv().unwrap())
            .collect();
        let value =
            |r: &Result<Executed, ServeError>| r.as_ref().ok().map(|e| e.outputs[0].1.to_f32().unwrap());
        assert_eq!(value(&results[0]), Some(vec![1.0]));
        assert!(matches!(&results[1], Err(ServeError::Backend(m)) if m.contains("NaN")));
        assert_eq!(value(&results[2]), Some(vec![3.0]));
        // Failed executions are not counted: the two that succeeded ran alone.
        assert_eq!(stats.snapshot("t", 1).execution_count, 2);

        // An engine that panics fails only that request, with the panic named, when it is
        // merged with others; the instance thread lives on and serves them.
        let rxs: Vec<_> = [7.0, f32::INFINITY, 8.0]
            .into_iter()
            .map(|v| {
                let (job, rx) = job(v);
                scheduler.submit(job);
                rx
            })
            .collect();
        let results: Vec<_> = rxs.into_iter().map(|rx| rx.blocking_recv().unwrap()).collect();
        assert_eq!(value(&results[0]), Some(vec![7.0]));
        assert!(
            matches!(&results[1], Err(e) if e.to_string().contains("panicked while executing: an engine bug")),
            "{:?}",
            results[1].as_ref().err()
        );
        assert_eq!(value(&results[2]), Some(vec![8.0]));
    }
}
