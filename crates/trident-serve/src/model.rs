//! A loaded model version: its validated interface, its scheduler and its instances.
//! `infer` checks a request against `config.pbtxt`, queues it and awaits the reply; all
//! tensor work happens on the model's own OS threads (see `scheduler`).

use crate::backend::Model;
use crate::backend::Streamed;
use crate::batcher::BatchPolicy;
use crate::cache::ResponseCache;
use crate::scheduler::{self, Executed, Job, Reply, Scheduler};
use crate::sequence::Sequencer;
use crate::stats::ModelStats;
use crate::ServeError;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use trident_core::config::{self, pb, ModelConfig};
use trident_core::{DataType, Tensor};

/// An inference request addressed to one model version.
#[derive(Debug)]
pub struct InferRequest {
    /// Named inputs.
    pub inputs: Vec<(String, Tensor)>,
    /// Outputs to return; empty means all.
    pub outputs: Vec<OutputRequest>,
    /// When the server received the request (start of the request duration).
    pub received: Instant,
    /// The sequence it belongs to (models with `sequence_batching`).
    pub sequence: Option<crate::sequence::SequenceFlags>,
}

/// One requested output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputRequest {
    /// Output name.
    pub name: String,
    /// Triton's classification extension: the top N classes of each row instead of the
    /// tensor, as BYTES `"value:index[:label]"`.
    pub classification: Option<usize>,
}

impl OutputRequest {
    /// The whole tensor of output `name`.
    pub fn named(name: impl Into<String>) -> Self {
        OutputRequest {
            name: name.into(),
            classification: None,
        }
    }
}

/// Outputs of one request.
#[derive(Debug)]
pub struct InferResponse {
    /// Named outputs, in the order requested (model order when all).
    pub outputs: Vec<(String, Tensor)>,
}

/// A tensor as `config.pbtxt` declares it.
#[derive(Debug, Clone, PartialEq)]
pub struct IoSpec {
    /// Name.
    pub name: String,
    /// Type.
    pub dtype: DataType,
    /// Dimensions without the batch dimension; -1 is variable.
    pub dims: Vec<i64>,
    /// Shape the model actually takes/gives (`reshape`), without batch dimension.
    pub reshape: Option<Vec<i64>>,
    /// May be omitted (inputs only).
    pub optional: bool,
}

impl IoSpec {
    fn from_input(i: &pb::ModelInput) -> Self {
        IoSpec {
            name: i.name.clone(),
            dtype: config::data_type(i.data_type).expect("validated config"),
            dims: i.dims.clone(),
            reshape: i.reshape.as_ref().map(|r| r.shape.clone()),
            optional: i.optional,
        }
    }

    fn from_output(o: &pb::ModelOutput) -> Self {
        IoSpec {
            name: o.name.clone(),
            dtype: config::data_type(o.data_type).expect("validated config"),
            dims: o.dims.clone(),
            reshape: o.reshape.as_ref().map(|r| r.shape.clone()),
            optional: false,
        }
    }

    /// Shape as clients see it: batch dimension (-1) first when the model batches.
    pub fn client_shape(&self, batching: bool) -> Vec<i64> {
        batching
            .then_some(-1)
            .into_iter()
            .chain(self.dims.iter().copied())
            .collect()
    }
}

/// A model version ready to serve.
pub struct ModelVersion {
    name: String,
    version: i64,
    config: Arc<ModelConfig>,
    backend: &'static str,
    inputs: Vec<IoSpec>,
    outputs: Vec<IoSpec>,
    max_queue: usize,
    stats: Arc<ModelStats>,
    runner: Runner,
    /// Each output's labels (`label_filename`), in `outputs` order.
    labels: Vec<Option<Arc<[String]>>>,
    /// The server's response cache, when this model enables it.
    cache: Option<Arc<ResponseCache>>,
    /// The sequence batcher, for models with `sequence_batching`.
    sequencer: Option<Sequencer>,
    /// `model_transaction_policy { decoupled: true }`: responses are streamed.
    decoupled: bool,
}

/// What executes a version's requests.
enum Runner {
    /// A backend's instances behind the scheduler; the loaded model for its per-input checks.
    Backend {
        scheduler: Scheduler,
        model: Box<dyn Model>,
    },
    /// Composing models, step by step.
    Composed(Box<dyn Composition>),
}

/// A version that runs its requests on other models (an ensemble's steps,
/// `crate::ensemble::Ensemble`): validated inputs in, its outputs out in config order.
pub trait Composition: Send + Sync {
    /// Runs `inputs` through the composing models. (A boxed future: compositions may
    /// nest, and an `async fn` cannot contain itself.)
    fn run(&self, inputs: Vec<(String, Tensor)>) -> Composed<'_>;
}

/// What a [`Composition`] runs to: its outputs by name.
pub type Composed<'a> = Pin<Box<dyn Future<Output = Result<Vec<(String, Tensor)>, ServeError>> + Send + 'a>>;

/// Queue bound used when `max_queue_size` is 0 (Triton: unbounded). Trident bounds every
/// queue; this is large enough never to matter below overload.
pub const DEFAULT_MAX_QUEUE: usize = 16_384;

/// How to run a model version.
pub struct Deployment {
    /// Model name.
    pub name: String,
    /// Version number.
    pub version: i64,
    /// Complete, validated configuration.
    pub config: Arc<ModelConfig>,
    /// The loaded model.
    pub model: Box<dyn Model>,
    /// Backend name for logs and metadata.
    pub backend: &'static str,
    /// Number of instances (OS threads).
    pub instances: usize,
    /// Each output's labels (`label_filename`, one per line), in config order.
    pub labels: Vec<Option<Arc<[String]>>>,
    /// `model_warmup` samples, run on every instance before the version is ready.
    pub warmup: Vec<crate::warmup::WarmupSample>,
    /// The response cache, when the server has one and the model enables it.
    pub cache: Option<Arc<ResponseCache>>,
}

impl ModelVersion {
    /// Spawns the instances and the scheduler; an error is why the version failed to
    /// load.
    pub fn start(d: Deployment) -> Result<Self, crate::LoadError> {
        let stats = Arc::new(ModelStats::default());
        let decoupled = is_decoupled(&d.config);
        let mut policy = batch_policy(&d.config);
        if decoupled && policy.enabled {
            tracing::warn!(model = %d.name, "dynamic batching of a decoupled model is not implemented: its requests run one at a time");
            policy.enabled = false;
        }
        let max_queue = match &d.config.scheduling_choice {
            Some(pb::model_config::SchedulingChoice::DynamicBatching(db)) => db
                .default_queue_policy
                .as_ref()
                .map(|q| q.max_queue_size as usize)
                .filter(|&n| n > 0)
                .unwrap_or(DEFAULT_MAX_QUEUE),
            _ => DEFAULT_MAX_QUEUE,
        };
        let sequencer = Sequencer::from_config(&d.config, d.instances)?;
        if sequencer.is_some() && decoupled {
            return Err(crate::ConfigError::new(
                "sequence_batching",
                "sequence_batching of a decoupled model is not implemented",
            )
            .into());
        }
        if decoupled && d.cache.is_some() {
            tracing::warn!(model = %d.name, "response_cache does not apply to decoupled models (a request has many responses): not cached");
        }
        if sequencer.is_some() && d.cache.is_some() {
            tracing::warn!(model = %d.name, "response_cache does not apply to sequence models (their outputs depend on the sequence): not cached");
        }
        let cache = if sequencer.is_some() || decoupled {
            None
        } else {
            d.cache
        };
        let label = format!("{}:{}", d.name, d.version);
        let scheduler = scheduler::start(
            &label,
            d.model.as_ref(),
            d.instances,
            policy,
            stats.clone(),
            &d.warmup,
        )?;
        Ok(ModelVersion {
            inputs: d.config.input.iter().map(IoSpec::from_input).collect(),
            outputs: d.config.output.iter().map(IoSpec::from_output).collect(),
            name: d.name,
            version: d.version,
            config: d.config,
            backend: d.backend,
            max_queue,
            stats,
            runner: Runner::Backend {
                scheduler,
                model: d.model,
            },
            labels: d.labels,
            cache,
            sequencer,
            decoupled,
        })
    }

    /// An ensemble version: no instances of its own, its steps run on the composing
    /// models.
    pub fn start_ensemble(
        name: String,
        version: i64,
        config: Arc<ModelConfig>,
        ensemble: Box<dyn Composition>,
        labels: Vec<Option<Arc<[String]>>>,
        cache: Option<Arc<ResponseCache>>,
    ) -> Self {
        ModelVersion {
            inputs: config.input.iter().map(IoSpec::from_input).collect(),
            outputs: config.output.iter().map(IoSpec::from_output).collect(),
            name,
            version,
            config,
            backend: "ensemble",
            max_queue: DEFAULT_MAX_QUEUE,
            stats: Arc::new(ModelStats::default()),
            runner: Runner::Composed(ensemble),
            labels,
            cache,
            sequencer: None,
            decoupled: false,
        }
    }

    /// Model name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Version number.
    pub fn version(&self) -> i64 {
        self.version
    }
    /// The complete configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }
    /// Backend serving this version.
    pub fn backend(&self) -> &'static str {
        self.backend
    }
    /// Declared inputs.
    pub fn inputs(&self) -> &[IoSpec] {
        &self.inputs
    }
    /// Declared outputs.
    pub fn outputs(&self) -> &[IoSpec] {
        &self.outputs
    }
    /// Whether requests carry a batch dimension.
    pub fn batching(&self) -> bool {
        self.config.max_batch_size > 0
    }
    /// Statistics.
    pub fn stats(&self) -> &ModelStats {
        &self.stats
    }
    /// Whether the model streams its responses (`model_transaction_policy { decoupled:
    /// true }`): it answers [`ModelVersion::infer_decoupled`] only.
    pub fn decoupled(&self) -> bool {
        self.decoupled
    }

    /// Validates, queues and runs one request.
    pub async fn infer(&self, request: InferRequest) -> Result<InferResponse, ServeError> {
        let received = request.received;
        let result = self.infer_inner(request).await;
        let elapsed = received.elapsed();
        match result {
            Ok((response, compute_infer)) => {
                self.stats.record_success(elapsed, compute_infer);
                Ok(response)
            }
            Err(e) => {
                self.stats.record_failure(elapsed);
                Err(e)
            }
        }
    }

    /// Validates and queues one request of a decoupled model; its responses (any
    /// number, each with the requested outputs) come from [`Responses::next`].
    pub fn infer_decoupled(&self, request: InferRequest) -> Result<Responses<'_>, ServeError> {
        let received = request.received;
        let result = self.start_decoupled(request);
        if result.is_err() {
            self.stats.record_failure(received.elapsed());
        }
        result
    }

    fn start_decoupled(&self, request: InferRequest) -> Result<Responses<'_>, ServeError> {
        // Ensembles and sequence models are never decoupled (refused at load).
        if !self.decoupled {
            return Err(ServeError::Unsupported(format!(
                "model '{}' is not decoupled: it answers each request once",
                self.name
            )));
        }
        let wanted = self.requested_outputs(&request.outputs)?;
        self.refuse_sequence(&request)?;
        let (inputs, rows, signature) = self.prepare_inputs(request.inputs)?;
        // A few responses may wait for a slow client; then the backend waits.
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let pending = self.enqueue(inputs, rows, signature, Reply::Stream(tx))?;
        Ok(Responses {
            model: self,
            rx,
            wanted,
            rows,
            received: request.received,
            dispatched: None,
            finished: false,
            _pending: pending,
        })
    }

    /// The response and the model time of the execution that produced it.
    async fn infer_inner(
        &self,
        request: InferRequest,
    ) -> Result<(InferResponse, std::time::Duration), ServeError> {
        if self.decoupled {
            return Err(ServeError::Unsupported(format!(
                "model '{}' is decoupled: its responses can only be streamed (gRPC ModelStreamInfer)",
                self.name
            )));
        }
        let wanted = self.requested_outputs(&request.outputs)?;
        if let Some(sequencer) = &self.sequencer {
            return self.infer_sequence(sequencer, request, &wanted).await;
        }
        self.refuse_sequence(&request)?;
        let (inputs, rows, signature) = self.prepare_inputs(request.inputs)?;
        let Some(cache) = &self.cache else {
            return self.execute(inputs, rows, signature, &wanted).await;
        };
        let t0 = Instant::now();
        let key = ResponseCache::key(&self.name, self.version, &inputs);
        if let Some(outputs) = cache.get(key) {
            self.stats.inference.cache_hit.record(t0.elapsed());
            let response = self.select_outputs(outputs.as_ref().clone(), &wanted, rows)?;
            return Ok((response, Duration::ZERO));
        }
        let lookup = t0.elapsed();
        let all: Vec<(usize, Option<usize>)> = (0..self.outputs.len()).map(|i| (i, None)).collect();
        let (everything, compute) = self.execute(inputs, rows, signature, &all).await?;
        let t1 = Instant::now();
        cache.insert(key, Arc::new(everything.outputs.clone()));
        self.stats.inference.cache_miss.record(lookup + t1.elapsed());
        let response = self.select_outputs(everything.outputs, &wanted, rows)?;
        Ok((response, compute))
    }

    /// One request of a sequence: its controls and state join the inputs, the
    /// sequence's requests run one at a time, its state outputs are kept.
    async fn infer_sequence(
        &self,
        sequencer: &Sequencer,
        request: InferRequest,
        wanted: &[(usize, Option<usize>)],
    ) -> Result<(InferResponse, Duration), ServeError> {
        let (mut inputs, rows, mut signature) = self.prepare_inputs(request.inputs)?;
        if rows != 1 {
            return Err(ServeError::InvalidRequest(format!(
                "inference request to model '{}' must specify batch-size 1 due to requirements of sequence batcher",
                self.name
            )));
        }
        let slot = sequencer.enter(request.sequence.as_ref())?;
        let flags = request.sequence.expect("enter checked the sequence");
        // Declared before `active`, so dropped after its lock is released.
        let _leave = crate::sequence::Leave {
            sequencer,
            flags: &flags,
            slot: &slot,
        };
        let mut active = slot.lock().await;
        sequencer.admit(&flags, &slot).await;
        let result = async {
            let extra = sequencer.extra_inputs(&flags, &active)?;
            for (i, (_, t)) in extra.iter().enumerate() {
                signature.push(-3 - i as i64);
                signature.extend_from_slice(&t.shape()[usize::from(self.batching())..]);
                signature.push(-2);
            }
            inputs.extend(extra);
            let executed = self.run_backend(inputs, rows, signature).await?;
            let outputs = sequencer.keep_state(&mut active, executed.outputs)?;
            Ok((
                self.select_outputs(outputs, wanted, rows)?,
                executed.compute_infer,
            ))
        }
        .await;
        drop(active);
        result
    }

    /// Queues validated inputs on the backend's instances and awaits their outputs.
    async fn run_backend(
        &self,
        inputs: Vec<(String, Tensor)>,
        rows: usize,
        signature: Vec<i64>,
    ) -> Result<Executed, ServeError> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let _pending = self.enqueue(inputs, rows, signature, Reply::Once(reply))?;
        rx.await.map_err(|_| ServeError::Unloading(self.name.clone()))?
    }

    /// Queues validated inputs on the backend's instances, within `max_queue_size`; the
    /// guard counts the request as pending until it is dropped.
    fn enqueue(
        &self,
        inputs: Vec<(String, Tensor)>,
        rows: usize,
        signature: Vec<i64>,
        reply: Reply,
    ) -> Result<PendingGuard<'_>, ServeError> {
        let Runner::Backend { scheduler, .. } = &self.runner else {
            return Err(ServeError::Backend(
                "an ensemble has no instances of its own".into(),
            ));
        };
        self.stats
            .try_add_pending(self.max_queue)
            .map_err(|pending| ServeError::Overloaded {
                model: self.name.clone(),
                pending: pending.max(0) as usize,
                limit: self.max_queue,
            })?;
        let pending = PendingGuard(&self.stats);
        scheduler.submit(Job {
            inputs,
            rows,
            signature,
            enqueued: Instant::now(),
            reply,
        });
        Ok(pending)
    }

    /// Sequence flags on a model without `sequence_batching` would have no effect.
    fn refuse_sequence(&self, request: &InferRequest) -> Result<(), ServeError> {
        match &request.sequence {
            Some(flags) => Err(ServeError::InvalidRequest(format!(
                "model '{}' has no sequence_batching: sequence {} (sequence_id, sequence_start, sequence_end) would have no effect",
                self.name, flags.id
            ))),
            None => Ok(()),
        }
    }

    /// Runs validated inputs on the backend's instances or the ensemble's steps.
    async fn execute(
        &self,
        inputs: Vec<(String, Tensor)>,
        rows: usize,
        signature: Vec<i64>,
        wanted: &[(usize, Option<usize>)],
    ) -> Result<(InferResponse, Duration), ServeError> {
        if let Runner::Composed(e) = &self.runner {
            let t0 = Instant::now();
            let outputs = e.run(inputs).await?;
            let response = self.select_outputs(outputs, wanted, rows)?;
            return Ok((response, t0.elapsed()));
        }
        let executed = self.run_backend(inputs, rows, signature).await?;
        let response = self.select_outputs(executed.outputs, wanted, rows)?;
        Ok((response, executed.compute_infer))
    }

    /// Output indexes with their classification counts.
    fn requested_outputs(&self, wanted: &[OutputRequest]) -> Result<Vec<(usize, Option<usize>)>, ServeError> {
        if wanted.is_empty() {
            return Ok((0..self.outputs.len()).map(|i| (i, None)).collect());
        }
        wanted
            .iter()
            .map(|o| {
                let i = self
                    .outputs
                    .iter()
                    .position(|s| s.name == o.name)
                    .ok_or_else(|| {
                        ServeError::InvalidRequest(format!(
                            "unexpected inference output '{}' for model '{}'; outputs are: {}",
                            o.name,
                            self.name,
                            names_of(&self.outputs)
                        ))
                    })?;
                if o.classification == Some(0) {
                    return Err(ServeError::InvalidRequest(format!(
                        "output '{}': classification must ask for at least 1 class",
                        o.name
                    )));
                }
                if o.classification.is_some() && self.outputs[i].dtype == DataType::Bytes {
                    return Err(ServeError::InvalidRequest(format!(
                        "output '{}' is BYTES; classification needs a numeric output",
                        o.name
                    )));
                }
                Ok((i, o.classification))
            })
            .collect()
    }

    /// Checks inputs against the configuration and applies `reshape`. Returns the model
    /// inputs in config order, the batch rows and the batching signature.
    #[allow(clippy::type_complexity)]
    fn prepare_inputs(
        &self,
        given: Vec<(String, Tensor)>,
    ) -> Result<(Vec<(String, Tensor)>, usize, Vec<i64>), ServeError> {
        let invalid = |m: String| ServeError::InvalidRequest(m);
        let mut slots: Vec<Option<Tensor>> = vec![None; self.inputs.len()];
        for (name, tensor) in given {
            let idx = self.inputs.iter().position(|s| s.name == name).ok_or_else(|| {
                invalid(format!(
                    "unexpected inference input '{name}' for model '{}'; inputs are: {}",
                    self.name,
                    names_of(&self.inputs)
                ))
            })?;
            if slots[idx].replace(tensor).is_some() {
                return Err(invalid(format!("input '{name}' is given twice")));
            }
        }
        let missing: Vec<&IoSpec> = self
            .inputs
            .iter()
            .zip(&slots)
            .filter(|(spec, slot)| slot.is_none() && !spec.optional)
            .map(|(spec, _)| spec)
            .collect();
        if !missing.is_empty() {
            return Err(invalid(self.missing_inputs(&slots, &missing)));
        }
        let mut rows: Option<usize> = None;
        let mut signature = Vec::new();
        let mut out = Vec::with_capacity(self.inputs.len());
        for (i, (spec, slot)) in self.inputs.iter().zip(slots).enumerate() {
            let Some(tensor) = slot else {
                // Every missing input was found before this loop.
                continue;
            };
            let r = self.check_input(spec, &tensor)?;
            if let Runner::Backend { model, .. } = &self.runner {
                model
                    .check_input(&spec.name, &tensor)
                    .map_err(|e| ServeError::InvalidRequest(e.to_string()))?;
            }
            if *rows.get_or_insert(r) != r {
                return Err(invalid(format!(
                    "input '{}' batch size does not match other inputs for '{}': {r} rows, others have {}",
                    spec.name,
                    self.name,
                    rows.unwrap_or_default()
                )));
            }
            signature.push(i as i64);
            signature.extend_from_slice(&tensor.shape()[usize::from(self.batching())..]);
            signature.push(-2);
            out.push((spec.name.clone(), self.apply_reshape(spec, tensor, r)?));
        }
        Ok((out, rows.unwrap_or(1), signature))
    }

    /// Triton's text for missing inputs: what was given and what is missing.
    fn missing_inputs(&self, slots: &[Option<Tensor>], missing: &[&IoSpec]) -> String {
        let list = |names: Vec<&str>| {
            format!(
                "[{}]",
                names
                    .iter()
                    .map(|n| format!("'{n}'"))
                    .collect::<Vec<_>>()
                    .join(",")
            )
        };
        let given: Vec<&str> = self
            .inputs
            .iter()
            .zip(slots)
            .filter(|(_, slot)| slot.is_some())
            .map(|(spec, _)| spec.name.as_str())
            .collect();
        let required = self.inputs.iter().filter(|s| !s.optional).count();
        let expected = if required == self.inputs.len() {
            format!("expected {required} inputs")
        } else {
            format!(
                "expected number of inputs between {required} and {}",
                self.inputs.len()
            )
        };
        format!(
            "{expected} but got {} inputs for model '{}'. Got input(s) {}, but missing required input(s) {}. Please provide all required input(s).",
            given.len(),
            self.name,
            list(given),
            list(missing.iter().map(|s| s.name.as_str()).collect()),
        )
    }

    fn check_input(&self, spec: &IoSpec, t: &Tensor) -> Result<usize, ServeError> {
        if t.dtype() != spec.dtype {
            return Err(ServeError::InvalidRequest(format!(
                "inference input '{}' data-type is '{}', but model '{}' expects '{}'",
                spec.name,
                t.dtype(),
                self.name,
                spec.dtype
            )));
        }
        let expected = spec.client_shape(self.batching());
        let shape = t.shape();
        let dims_ok =
            shape.len() == expected.len() && shape.iter().zip(&expected).all(|(&g, &e)| e == -1 || g == e);
        let dims = |d: &[i64]| format!("[{}]", d.iter().map(i64::to_string).collect::<Vec<_>>().join(","));
        if !dims_ok {
            let note = if self.batching() {
                " NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended to each input shape. If you want to specify the full shape including the batch dim in your input dims config, try setting max_batch_size to zero. See the model configuration docs for more info on max_batch_size."
            } else {
                ""
            };
            return Err(ServeError::InvalidRequest(format!(
                "unexpected shape for input '{}' for model '{}'. Expected {}, got {}.{note}",
                spec.name,
                self.name,
                dims(&expected),
                dims(shape),
            )));
        }
        if !self.batching() {
            return Ok(1);
        }
        let rows = shape[0];
        let max = self.config.max_batch_size as i64;
        if rows > max {
            return Err(ServeError::InvalidRequest(format!(
                "inference request batch-size must be <= {max} for '{}' (input '{}' has {rows} rows)",
                self.name, spec.name
            )));
        }
        if rows < 1 {
            return Err(ServeError::InvalidRequest(format!(
                "input '{}': batch size {rows} for '{}', expected at least 1 row",
                spec.name, self.name
            )));
        }
        Ok(rows as usize)
    }

    fn apply_reshape(&self, spec: &IoSpec, t: Tensor, rows: usize) -> Result<Tensor, ServeError> {
        let Some(target) = &spec.reshape else { return Ok(t) };
        let batch_prefix = self.batching().then_some(rows as i64);
        let per_row = t.len() / rows.max(1);
        let shape = resolve(batch_prefix, target, per_row);
        t.reshape(shape)
            .map_err(|e| ServeError::InvalidRequest(format!("input '{}': cannot reshape: {e}", spec.name)))
    }

    fn select_outputs(
        &self,
        mut all: Vec<(String, Tensor)>,
        wanted: &[(usize, Option<usize>)],
        rows: usize,
    ) -> Result<InferResponse, ServeError> {
        let mut outputs = Vec::with_capacity(wanted.len());
        for &(i, classes) in wanted {
            let spec = &self.outputs[i];
            let pos = all.iter().position(|(n, _)| n == &spec.name).ok_or_else(|| {
                ServeError::Backend(format!("the model did not produce output '{}'", spec.name))
            })?;
            let (name, tensor) = all.swap_remove(pos);
            let tensor = match &spec.reshape {
                Some(_) => {
                    let per_row = tensor.len() / rows.max(1);
                    let shape = resolve(self.batching().then_some(rows as i64), &spec.dims, per_row);
                    tensor
                        .reshape(shape)
                        .map_err(|e| ServeError::Backend(format!("output '{name}': {e}")))?
                }
                None => tensor,
            };
            let tensor = match classes {
                Some(k) => crate::classify::top_k(
                    &tensor,
                    k,
                    self.batching().then_some(rows),
                    self.labels[i].as_deref(),
                )
                .map_err(|e| ServeError::InvalidRequest(format!("output '{name}': {e}")))?,
                None => tensor,
            };
            outputs.push((name, tensor));
        }
        Ok(InferResponse { outputs })
    }
}

/// The responses of one request of a decoupled model, in the order the model sends
/// them. The request counts as a success or a failure in the statistics when they end,
/// or as a failure when they are dropped before.
pub struct Responses<'a> {
    model: &'a ModelVersion,
    rx: tokio::sync::mpsc::Receiver<Streamed>,
    wanted: Vec<(usize, Option<usize>)>,
    rows: usize,
    received: Instant,
    dispatched: Option<Instant>,
    finished: bool,
    _pending: PendingGuard<'a>,
}

impl Responses<'_> {
    /// The next response; `None` once the model has sent its last. An error ends the
    /// request.
    pub async fn next(&mut self) -> Option<Result<InferResponse, ServeError>> {
        if self.finished {
            return None;
        }
        loop {
            let message = self.rx.recv().await;
            let stats = &self.model.stats;
            return match message {
                Some(Streamed::Dispatched(at)) => {
                    self.dispatched = Some(at);
                    continue;
                }
                Some(Streamed::Response(outputs)) => {
                    match self.model.select_outputs(outputs, &self.wanted, self.rows) {
                        Ok(response) => Some(Ok(response)),
                        Err(e) => Some(Err(self.end_with(e))),
                    }
                }
                Some(Streamed::Failed(e)) => Some(Err(self.end_with(e))),
                None => {
                    self.finished = true;
                    let elapsed = self.received.elapsed();
                    match self.dispatched {
                        // The model held the request from dispatch to its last response.
                        Some(at) => stats.record_success(elapsed, at.elapsed()),
                        // The model went away before running it (unloaded).
                        None => stats.record_failure(elapsed),
                    }
                    self.dispatched
                        .is_none()
                        .then(|| Err(ServeError::Unloading(self.model.name.clone())))
                }
            };
        }
    }

    fn end_with(&mut self, e: ServeError) -> ServeError {
        self.finished = true;
        self.model.stats.record_failure(self.received.elapsed());
        e
    }
}

/// Responses given up before their end (the client went away) count as a failed request,
/// so that every request is counted once.
impl Drop for Responses<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.model.stats.record_failure(self.received.elapsed());
        }
    }
}

fn is_decoupled(config: &ModelConfig) -> bool {
    config
        .model_transaction_policy
        .as_ref()
        .is_some_and(|p| p.decoupled)
}

/// `[batch?] + dims`, with one -1 in `dims` resolved from the element count per row.
fn resolve(batch: Option<i64>, dims: &[i64], per_row: usize) -> Vec<i64> {
    let known: i64 = dims.iter().filter(|&&d| d >= 0).product();
    let fill = if known > 0 { per_row as i64 / known } else { 0 };
    batch
        .into_iter()
        .chain(dims.iter().map(|&d| if d < 0 { fill } else { d }))
        .collect()
}

fn names_of(specs: &[IoSpec]) -> String {
    specs
        .iter()
        .map(|s| format!("'{}'", s.name))
        .collect::<Vec<_>>()
        .join(", ")
}

fn batch_policy(config: &ModelConfig) -> BatchPolicy {
    let max_batch_size = config.max_batch_size.max(1) as usize;
    use pb::model_sequence_batching::StrategyChoice;
    match &config.scheduling_choice {
        // Requests of different sequences batch together, up to max_batch_size rows,
        // waiting at most the strategy's max_queue_delay_microseconds.
        Some(pb::model_config::SchedulingChoice::SequenceBatching(sb)) => {
            let (preferred, delay) = match &sb.strategy_choice {
                Some(StrategyChoice::Oldest(o)) => (
                    o.preferred_batch_size.iter().map(|&p| p as usize).collect(),
                    o.max_queue_delay_microseconds,
                ),
                Some(StrategyChoice::Direct(d)) => (vec![], d.max_queue_delay_microseconds),
                None => (vec![], 0),
            };
            BatchPolicy {
                enabled: config.max_batch_size > 0,
                max_batch_size,
                preferred,
                max_delay: std::time::Duration::from_micros(delay),
            }
        }
        Some(pb::model_config::SchedulingChoice::DynamicBatching(db)) => BatchPolicy {
            enabled: true,
            max_batch_size,
            preferred: db.preferred_batch_size.iter().map(|&p| p as usize).collect(),
            max_delay: std::time::Duration::from_micros(db.max_queue_delay_microseconds),
        },
        _ => BatchPolicy {
            enabled: false,
            max_batch_size,
            preferred: vec![],
            max_delay: Default::default(),
        },
    }
}

struct PendingGuard<'a>(&'a ModelStats);

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.0.remove_pending();
    }
}
