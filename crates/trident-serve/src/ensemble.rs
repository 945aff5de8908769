//! Ensembles (`platform: "ensemble"`): a DAG of composing models, as Triton schedules
//! it. A step runs as soon as every ensemble tensor it reads exists; independent steps run
//! at the same time. Each step is an ordinary request to the composing model's own
//! [`ModelVersion::infer`] (its validation, its queue, its dynamic batching, its
//! statistics), in process and without copies (tensors share their bytes). A failing step
//! is named in the error, which keeps its kind (a client's mistake stays a 400).

use crate::model::{Composed, Composition, InferRequest, ModelVersion, OutputRequest};
use crate::{ConfigError, LoadError, ServeError};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;
use trident_core::config::{self, pb, ModelConfig};
use trident_core::{DataType, Tensor};

/// Finds a ready version of a composing model (name, version or latest).
pub type Lookup = Arc<dyn Fn(&str, Option<&str>) -> Result<Arc<ModelVersion>, ServeError> + Send + Sync>;

struct Step {
    model: String,
    /// `None`: the latest ready version (`model_version: -1`).
    version: Option<String>,
    /// (model tensor, ensemble tensor), sorted.
    inputs: Vec<(String, String)>,
    outputs: Vec<(String, String)>,
}

impl Step {
    fn label(&self, i: usize) -> String {
        format!("step {} (model '{}')", i + 1, self.model)
    }
}

/// A validated ensemble plan.
pub struct Ensemble {
    name: String,
    steps: Vec<Step>,
    outputs: Vec<String>,
    lookup: Lookup,
}

type Tensors = Vec<(String, Tensor)>;
type StepResult = (usize, Result<Tensors, ServeError>);

/// Each ensemble tensor's type and who gives it (for errors).
type Types = HashMap<String, (DataType, String)>;

impl Ensemble {
    /// Checks `config`'s `ensemble_scheduling` (every tensor produced once, every read
    /// tensor available, no cycle, the ensemble's outputs produced) and, through `lookup`,
    /// that each composing model is ready and its tensor names and types fit the map.
    pub fn plan(name: &str, config: &ModelConfig, lookup: Lookup) -> Result<Self, LoadError> {
        let bad = |why: String| LoadError::from(ConfigError::new("ensemble_scheduling", why));
        let steps = steps_of(config).map_err(bad)?;
        let mut models = Vec::with_capacity(steps.len());
        for (k, s) in steps.iter().enumerate() {
            if s.model == name {
                return Err(bad(format!("{} is the ensemble itself", s.label(k))));
            }
            let m = lookup(&s.model, s.version.as_deref()).map_err(|e| LoadError::Dependency {
                step: s.label(k),
                source: Box::new(e),
            })?;
            if m.decoupled() {
                return Err(bad(format!(
                    "{}: the model is decoupled (many responses per request); ensembles of decoupled models are not implemented",
                    s.label(k)
                )));
            }
            if matches!(
                m.config().scheduling_choice,
                Some(pb::model_config::SchedulingChoice::SequenceBatching(_))
            ) {
                return Err(bad(format!(
                    "{}: the model has sequence_batching; an ensemble's steps carry no sequence, so it could never run",
                    s.label(k)
                )));
            }
            if config.max_batch_size > 0 && m.config().max_batch_size < config.max_batch_size {
                return Err(bad(format!(
                    "{}: its max_batch_size {} is below the ensemble's {}",
                    s.label(k),
                    m.config().max_batch_size,
                    config.max_batch_size
                )));
            }
            models.push(m);
        }
        let types = produced_types(config, &steps, &models).map_err(bad)?;
        for (k, (s, m)) in steps.iter().zip(&models).enumerate() {
            check_reads(k, s, m, &types).map_err(bad)?;
        }
        for o in &config.output {
            let (dtype, by) = types
                .get(&o.name)
                .ok_or_else(|| bad(format!("ensemble output '{}' is produced by no step", o.name)))?;
            if config::data_type(o.data_type) != Some(*dtype) {
                return Err(bad(format!(
                    "ensemble output '{}' is declared {} but {by} gives {dtype}",
                    o.name,
                    config::data_type(o.data_type).map_or("without a type".to_string(), |t| t.to_string())
                )));
            }
        }
        check_acyclic(config, &steps).map_err(bad)?;
        Ok(Ensemble {
            name: name.to_string(),
            steps,
            outputs: config.output.iter().map(|o| o.name.clone()).collect(),
            lookup,
        })
    }

    async fn run_inner(&self, inputs: Vec<(String, Tensor)>) -> Result<Vec<(String, Tensor)>, ServeError> {
        let mut have: HashMap<String, Tensor> = inputs.into_iter().collect();
        let mut launched = vec![false; self.steps.len()];
        let mut running = tokio::task::JoinSet::new();
        loop {
            for (k, s) in self.steps.iter().enumerate() {
                if launched[k] || !s.inputs.iter().all(|(_, t)| have.contains_key(t)) {
                    continue;
                }
                launched[k] = true;
                let model = (self.lookup)(&s.model, s.version.as_deref()).map_err(|e| self.in_step(k, e))?;
                let request = InferRequest {
                    inputs: s
                        .inputs
                        .iter()
                        .map(|(m, t)| (m.clone(), have[t].clone()))
                        .collect(),
                    outputs: s
                        .outputs
                        .iter()
                        .map(|(m, _)| OutputRequest::named(m.clone()))
                        .collect(),
                    received: Instant::now(),
                    sequence: None,
                };
                // Boxed: an ensemble step may itself be an ensemble.
                let step: Pin<Box<dyn Future<Output = StepResult> + Send>> =
                    Box::pin(async move { (k, model.infer(request).await.map(|r| r.outputs)) });
                running.spawn(step);
            }
            let Some(joined) = running.join_next().await else {
                break;
            };
            let (k, result) =
                joined.map_err(|e| ServeError::Backend(format!("ensemble '{}': {e}", self.name)))?;
            let outputs = result.map_err(|e| self.in_step(k, e))?;
            for (name, tensor) in outputs {
                if let Some((_, ens)) = self.steps[k].outputs.iter().find(|(m, _)| *m == name) {
                    have.insert(ens.clone(), tensor);
                }
            }
        }
        self.outputs
            .iter()
            .map(|o| {
                have.remove_entry(o).ok_or_else(|| {
                    ServeError::Backend(format!("ensemble '{}': no step produced output '{o}'", self.name))
                })
            })
            .collect()
    }

    /// `e`, raised by step `k`, with the ensemble and step named; a client's error stays
    /// one, an overloaded model stays overloaded.
    fn in_step(&self, k: usize, e: ServeError) -> ServeError {
        let at = format!("ensemble '{}' {}", self.name, self.steps[k].label(k));
        match e {
            ServeError::InvalidRequest(m) => ServeError::InvalidRequest(format!("{at}: {m}")),
            ServeError::Backend(m) => ServeError::Backend(format!("{at}: {m}")),
            e @ ServeError::Overloaded { .. } => e,
            e => ServeError::NotReady {
                model: self.name.clone(),
                reason: format!("{at}: {e}"),
            },
        }
    }
}

impl Composition for Ensemble {
    /// Runs the DAG on validated inputs; returns the ensemble's outputs in config order.
    fn run(&self, inputs: Vec<(String, Tensor)>) -> Composed<'_> {
        Box::pin(self.run_inner(inputs))
    }
}

/// The steps of `config`'s `ensemble_scheduling`, maps sorted by model tensor.
fn steps_of(config: &ModelConfig) -> Result<Vec<Step>, String> {
    let Some(pb::model_config::SchedulingChoice::EnsembleScheduling(e)) = &config.scheduling_choice else {
        return Err("platform \"ensemble\" needs ensemble_scheduling { step [ ... ] }".into());
    };
    if e.step.is_empty() {
        return Err("ensemble_scheduling has no step".into());
    }
    if config.input.is_empty() || config.output.is_empty() {
        return Err("an ensemble declares its inputs and outputs in config.pbtxt".into());
    }
    let sorted = |m: &HashMap<String, String>| {
        let mut v: Vec<(String, String)> = m.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        v.sort();
        v
    };
    Ok(e.step
        .iter()
        .map(|s| Step {
            model: s.model_name.clone(),
            version: (s.model_version >= 0).then(|| s.model_version.to_string()),
            inputs: sorted(&s.input_map),
            outputs: sorted(&s.output_map),
        })
        .collect())
}

/// The ensemble's tensors and their types: its inputs, then each step's outputs, each
/// produced exactly once.
fn produced_types(
    config: &ModelConfig,
    steps: &[Step],
    models: &[Arc<ModelVersion>],
) -> Result<Types, String> {
    let mut types = Types::new();
    for i in &config.input {
        let dtype =
            config::data_type(i.data_type).ok_or_else(|| format!("input '{}': no data type", i.name))?;
        types.insert(i.name.clone(), (dtype, format!("ensemble input '{}'", i.name)));
    }
    for (k, (s, m)) in steps.iter().zip(models).enumerate() {
        if s.outputs.is_empty() {
            return Err(format!("{}: output_map is empty", s.label(k)));
        }
        for (model_tensor, ens) in &s.outputs {
            let spec = m
                .outputs()
                .iter()
                .find(|o| &o.name == model_tensor)
                .ok_or_else(|| {
                    format!(
                        "{}: output_map names '{model_tensor}', which the model does not output",
                        s.label(k)
                    )
                })?;
            if let Some((_, by)) = types.get(ens) {
                return Err(format!(
                    "{}: ensemble tensor '{ens}' is already produced by {by}",
                    s.label(k)
                ));
            }
            types.insert(ens.clone(), (spec.dtype, s.label(k)));
        }
    }
    Ok(types)
}

/// Step `k` reads only tensors that exist, into inputs its model has, of the same type,
/// and gives every input the model requires.
fn check_reads(k: usize, s: &Step, m: &ModelVersion, types: &Types) -> Result<(), String> {
    for (model_tensor, ens) in &s.inputs {
        let spec = m
            .inputs()
            .iter()
            .find(|i| &i.name == model_tensor)
            .ok_or_else(|| {
                format!(
                    "{}: input_map names '{model_tensor}', which is not an input of the model",
                    s.label(k)
                )
            })?;
        let (dtype, by) = types.get(ens).ok_or_else(|| {
            format!(
                "{}: reads ensemble tensor '{ens}', which no step produces and the ensemble does not take",
                s.label(k)
            )
        })?;
        if *dtype != spec.dtype {
            return Err(format!(
                "{}: input '{model_tensor}' is {}, but '{ens}' from {by} is {dtype}",
                s.label(k),
                spec.dtype
            ));
        }
    }
    match m
        .inputs()
        .iter()
        .find(|i| !i.optional && !s.inputs.iter().any(|(t, _)| *t == i.name))
    {
        Some(missing) => Err(format!(
            "{}: input_map does not give its input '{}'",
            s.label(k),
            missing.name
        )),
        None => Ok(()),
    }
}

/// Every step becomes runnable from the ensemble's inputs: no cycle.
fn check_acyclic(config: &ModelConfig, steps: &[Step]) -> Result<(), String> {
    let mut have: HashSet<&str> = config.input.iter().map(|i| i.name.as_str()).collect();
    let mut done = vec![false; steps.len()];
    while let Some(k) =
        (0..steps.len()).find(|&k| !done[k] && steps[k].inputs.iter().all(|(_, t)| have.contains(t.as_str())))
    {
        done[k] = true;
        have.extend(steps[k].outputs.iter().map(|(_, t)| t.as_str()));
    }
    match done.iter().position(|d| !d) {
        Some(k) => Err(format!(
            "{} can never run: its inputs depend on each other in a cycle",
            steps[k].label(k)
        )),
        None => Ok(()),
    }
}
