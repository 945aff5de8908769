//! The scheduler thread and the instance threads of one model version.
//!
//! Requests arrive on a channel; the scheduler keeps them in a [`BatchQueue`] and, each
//! time an instance is idle, asks it what to run. Instances are OS threads that own a
//! [`ModelInstance`]: they assemble the batch, execute it, split the outputs, reply to
//! each request through its oneshot and report themselves idle again. No tensor work
//! ever runs on an async executor thread.

use crate::backend::{BackendError, Model, ModelInstance};
use crate::batcher::{BatchItem, BatchPolicy, BatchQueue, Decision};
use crate::stats::{ExecutionTimes, ModelStats};
use crate::ServeError;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread;
use std::time::Instant;
use trident_core::Tensor;

/// Named tensors (a job's inputs, or an execution's outputs).
type Outputs = Vec<(String, Tensor)>;

/// One queued request.
pub(crate) struct Job {
    pub inputs: Outputs,
    pub rows: usize,
    pub signature: Vec<i64>,
    pub enqueued: Instant,
    pub reply: tokio::sync::oneshot::Sender<Result<Outputs, ServeError>>,
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

enum Msg {
    Job(Job),
    Idle(usize),
}

/// Handle to a running scheduler; dropping it lets the threads finish and exit.
pub(crate) struct Scheduler {
    tx: mpsc::Sender<Msg>,
}

impl Scheduler {
    /// Queues a job; fails only when the scheduler has stopped.
    pub fn submit(&self, job: Job) -> Result<(), ()> {
        self.tx.send(Msg::Job(job)).map_err(|_| ())
    }
}

/// Creates `instances` instances of `model` and starts their threads and the scheduler.
pub(crate) fn start(
    label: &str,
    model: &dyn Model,
    instances: usize,
    policy: BatchPolicy,
    stats: Arc<ModelStats>,
) -> Result<Scheduler, BackendError> {
    let (tx, rx) = mpsc::channel();
    let mut workers = Vec::with_capacity(instances);
    for idx in 0..instances.max(1) {
        let instance = model.instance()?;
        let (work_tx, work_rx) = mpsc::channel::<Vec<Job>>();
        let (idle, stats) = (tx.clone(), stats.clone());
        thread::Builder::new()
            .name(format!("{label}#{idx}"))
            .spawn(move || instance_loop(idx, instance, work_rx, idle, &stats))
            .map_err(|e| BackendError::Execute(format!("cannot spawn instance thread: {e}")))?;
        workers.push(work_tx);
    }
    thread::Builder::new()
        .name(format!("{label}-sched"))
        .spawn(move || scheduler_loop(rx, workers, BatchQueue::new(policy)))
        .map_err(|e| BackendError::Execute(format!("cannot spawn scheduler thread: {e}")))?;
    Ok(Scheduler { tx })
}

fn scheduler_loop(rx: mpsc::Receiver<Msg>, workers: Vec<mpsc::Sender<Vec<Job>>>, mut queue: BatchQueue<Job>) {
    let mut idle: Vec<usize> = (0..workers.len()).rev().collect();
    let mut deadline: Option<Instant> = None;
    loop {
        let msg = match deadline {
            Some(d) => rx.recv_timeout(d.saturating_duration_since(Instant::now())),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match msg {
            Ok(Msg::Job(job)) => queue.push(job),
            Ok(Msg::Idle(i)) => idle.push(i),
            Err(RecvTimeoutError::Timeout) => {}
            // The model version was dropped: no request can be waiting any more.
            Err(RecvTimeoutError::Disconnected) => return,
        }
        // Clients that went away are dropped here; their futures already counted them.
        drop(queue.drain_cancelled());
        deadline = None;
        while let Some(&worker) = idle.last() {
            match queue.poll(Instant::now()) {
                Decision::Dispatch(jobs) => {
                    idle.pop();
                    if workers[worker].send(jobs).is_err() {
                        tracing::error!("instance {worker} has stopped");
                    }
                }
                Decision::WaitUntil(d) => {
                    deadline = Some(d);
                    break;
                }
                Decision::Idle => break,
            }
        }
    }
}

fn instance_loop(
    idx: usize,
    mut instance: Box<dyn ModelInstance>,
    work: mpsc::Receiver<Vec<Job>>,
    idle: mpsc::Sender<Msg>,
    stats: &ModelStats,
) {
    while let Ok(jobs) = work.recv() {
        run_batch(instance.as_mut(), jobs, stats);
        if idle.send(Msg::Idle(idx)).is_err() {
            return;
        }
    }
}

fn run_batch(instance: &mut dyn ModelInstance, jobs: Vec<Job>, stats: &ModelStats) {
    let start = Instant::now();
    for job in &jobs {
        stats.inference.queue.record(start - job.enqueued);
    }
    let rows: Vec<i64> = jobs.iter().map(|j| j.rows as i64).collect();
    let total: usize = jobs.iter().map(|j| j.rows).sum();
    let (inputs, replies) = assemble(jobs);
    let result = inputs.and_then(|inputs| {
        let t_input = start.elapsed();
        let t0 = Instant::now();
        let outputs = instance
            .execute(inputs)
            .map_err(|e| ServeError::Backend(e.to_string()))?;
        let t_infer = t0.elapsed();
        let t1 = Instant::now();
        let split = split_outputs(outputs, &rows, replies.len())?;
        let times = ExecutionTimes {
            input: t_input,
            infer: t_infer,
            output: t1.elapsed(),
        };
        stats.record_execution(total, replies.len(), times);
        Ok(split)
    });
    match result {
        Ok(per_job) => {
            for (reply, outputs) in replies.into_iter().zip(per_job) {
                let _ = reply.send(Ok(outputs));
            }
        }
        Err(e) => {
            tracing::warn!("execution failed: {e}");
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

type Reply = tokio::sync::oneshot::Sender<Result<Outputs, ServeError>>;

/// Concatenates the jobs' inputs along the batch dimension (a single job is moved).
fn assemble(mut jobs: Vec<Job>) -> (Result<Outputs, ServeError>, Vec<Reply>) {
    if jobs.len() == 1 {
        let job = jobs.pop().expect("one job");
        return (Ok(job.inputs), vec![job.reply]);
    }
    let names: Vec<String> = jobs[0].inputs.iter().map(|(n, _)| n.clone()).collect();
    let merged = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let parts: Vec<&Tensor> = jobs.iter().map(|j| &j.inputs[i].1).collect();
            Tensor::concat(&parts)
                .map(|t| (name.clone(), t))
                .map_err(|e| ServeError::Backend(format!("batching input '{name}': {e}")))
        })
        .collect();
    (merged, jobs.into_iter().map(|j| j.reply).collect())
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
