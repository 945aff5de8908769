//! The model repository: `<root>/<model>/config.pbtxt` and `<root>/<model>/<version>/model.onnx`.
//!
//! Loads, reloads and unloads models according to the control mode, completes missing
//! configuration from the model file as Triton does, and keeps a per-model state
//! (ready versions, or the reason a model is unavailable) for the index and readiness
//! APIs. A model that fails to load is reported, never fatal to the server.
//!
//! Names that arrive from clients are only ever compared with directory entries read
//! from the repository; they are never joined onto a path.

mod complete;
mod engines;

pub use engines::OnnxEngine;

use crate::ensemble::{Ensemble, Lookup};
use crate::model::{Deployment, ModelVersion};
use crate::stats::ModelStatSnapshot;
use crate::ServeError;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;
use trident_core::config::{self, pb, ModelConfig};

/// Triton's `--model-control-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlMode {
    /// Load everything at start; no load/unload API.
    None,
    /// Load what `--load-model` names; load/unload API enabled.
    Explicit,
    /// Load everything and rescan periodically for changes.
    Poll,
}

/// How the repository is served.
#[derive(Debug, Clone)]
pub struct RepositoryOptions {
    /// Repository directory.
    pub root: PathBuf,
    /// Control mode.
    pub mode: ControlMode,
    /// Models to load at start in explicit mode (`*` loads all).
    pub startup_models: Vec<String>,
    /// CPU cores to share among instances (intra-op threads = cores / instances).
    pub cores: usize,
    /// Default ONNX engine.
    pub onnx_engine: OnnxEngine,
    /// The response cache (`--cache-config`), shared by the models that enable it.
    pub cache: Option<Arc<crate::cache::ResponseCache>>,
}

/// One row of the repository index.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct IndexEntry {
    /// Model name.
    pub name: String,
    /// Version, when the entry is about one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// READY or UNAVAILABLE; absent for models never loaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<&'static str>,
    /// Why a model is unavailable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

enum Slot {
    Ready(Arc<ModelVersion>),
    Failed(String),
}

struct ModelState {
    /// Versions by number; empty with `error` set when the whole model failed.
    versions: BTreeMap<i64, Slot>,
    error: Option<String>,
    fingerprint: Vec<(PathBuf, SystemTime, u64)>,
}

/// A load request's overrides: Triton's `config` (the whole configuration, as JSON)
/// and `file:<path>` (model files) load parameters.
#[derive(Debug, Default, Clone)]
pub struct LoadOverride {
    /// JSON of a `ModelConfig` that replaces `config.pbtxt`.
    pub config: Option<String>,
    /// Files of the model directory, by path relative to it (`1/model.onnx`): the
    /// model is then loaded from a fresh directory holding only these files.
    pub files: Vec<(String, Vec<u8>)>,
}

/// The repository manager.
pub struct Repository {
    options: RepositoryOptions,
    /// Shared with ensembles (weakly), which look their composing models up per request.
    models: Arc<RwLock<BTreeMap<String, ModelState>>>,
    /// Fresh directories of models loaded from `file:` overrides, deleted when the
    /// model is unloaded or loaded again.
    override_dirs: std::sync::Mutex<BTreeMap<String, tempfile::TempDir>>,
}

impl Repository {
    /// A repository manager; nothing is loaded until [`Repository::load_startup_models`].
    pub fn new(options: RepositoryOptions) -> Self {
        Repository {
            options,
            models: Arc::new(RwLock::new(BTreeMap::new())),
            override_dirs: Default::default(),
        }
    }

    /// The control mode.
    pub fn mode(&self) -> ControlMode {
        self.options.mode
    }

    /// Loads the models the control mode asks for at start. Failures are recorded.
    pub fn load_startup_models(&self) -> Result<(), ServeError> {
        let names = self.model_dirs()?;
        let load_all = self.options.mode != ControlMode::Explicit
            || self.options.startup_models.iter().any(|m| m == "*");
        // Each model's composing models, `None` unless it is an ensemble (one read each).
        let steps: Vec<Option<Vec<String>>> = names
            .iter()
            .map(|n| ensemble_steps(&self.options.root.join(n)))
            .collect();
        // An ensemble named by --load-model brings its composing models (as Triton does).
        let mut wanted: Vec<String> = self.options.startup_models.clone();
        for (name, steps) in names.iter().zip(&steps) {
            if self.options.startup_models.contains(name) {
                wanted.extend(steps.iter().flatten().cloned());
            }
        }
        // Ensembles after the models they compose.
        let (ensembles, plain): (Vec<_>, Vec<_>) = names.iter().zip(&steps).partition(|(_, s)| s.is_some());
        for (name, _) in plain.into_iter().chain(ensembles) {
            if load_all || wanted.contains(name) {
                let _ = self.load_model(name);
            }
        }
        for wanted in &self.options.startup_models {
            if wanted != "*" && !names.contains(wanted) {
                tracing::error!(model = %wanted, "--load-model names a model that is not in the repository");
            }
        }
        Ok(())
    }

    /// Loads (or reloads) a model through the repository API (`explicit` mode only).
    pub fn load(&self, name: &str) -> Result<(), ServeError> {
        self.require_explicit("load")?;
        let name = self.existing_dir(name)?;
        let steps = ensemble_steps(&self.options.root.join(&name)).unwrap_or_default();
        self.load_composing(&name, steps)?;
        match self.load_model(&name) {
            Some(reason) => Err(ServeError::LoadFailed { model: name, reason }),
            None => Ok(()),
        }
    }

    /// Like Triton, loading an ensemble first loads its composing models not yet loaded
    /// (each failure is the composing model's own; the ensemble's load then names it).
    fn load_composing(&self, name: &str, steps: Vec<String>) -> Result<(), ServeError> {
        for dep in steps {
            if dep != name && self.model_dirs()?.contains(&dep) && self.get(&dep, None).is_err() {
                tracing::info!(model = %dep, ensemble = %name, "loading a composing model of the ensemble");
                let _ = self.load(&dep);
            }
        }
        Ok(())
    }

    /// Loads a model with Triton's load overrides (`explicit` mode only). A `config`
    /// replaces `config.pbtxt` for this load (the next plain load reads the file
    /// again); `files` are written into a fresh directory, and only there, from which
    /// the model then loads. A failed load leaves what was serving in place.
    pub fn load_with(&self, name: &str, overrides: LoadOverride) -> Result<(), ServeError> {
        if overrides.config.is_none() && overrides.files.is_empty() {
            return self.load(name);
        }
        self.require_explicit("load")?;
        let failed = |reason: String| {
            tracing::error!("Poll failed for model directory '{name}': {reason}");
            ServeError::LoadFailed {
                model: name.to_string(),
                reason: format!("failed to poll from model repository: {reason}"),
            }
        };
        let Some(text) = &overrides.config else {
            return Err(failed(
                "Load parameter 'config' must be specified for model file override".into(),
            ));
        };
        let parsed = config::parse_config_json(text, Path::new("config override"))
            .map_err(|e| failed(format!("Invalid config override: {e}")))?;
        if !parsed.config.name.is_empty() && parsed.config.name != name {
            return Err(failed(format!(
                "Invalid config override: name '{}' is not the model's name '{name}'",
                parsed.config.name
            )));
        }
        let fresh = match overrides.files.is_empty() {
            true => None,
            false => Some(write_model_files(name, &overrides.files).map_err(failed)?),
        };
        let dir = match &fresh {
            Some(d) => d.path().to_path_buf(),
            None => self.options.root.join(self.existing_dir(name)?),
        };
        // The override's own steps, not those of the config.pbtxt on disk.
        self.load_composing(name, composing(&parsed.config))?;
        match self.load_model_at(name, &dir, Some(parsed)) {
            Some(reason) => Err(ServeError::LoadFailed {
                model: name.to_string(),
                reason,
            }),
            None => {
                let mut dirs = self.override_dirs.lock().expect("lock");
                match fresh {
                    Some(d) => dirs.insert(name.to_string(), d),
                    None => dirs.remove(name),
                };
                Ok(())
            }
        }
    }

    /// [`Self::unload`], and with `dependents` (Triton's `unload_dependents`) also the
    /// composing models of an ensemble that no other loaded ensemble uses, in turn.
    pub fn unload_with(&self, name: &str, dependents: bool) -> Result<(), ServeError> {
        let steps = match dependents {
            true => self
                .get(name, None)
                .ok()
                .filter(|m| m.config().platform == "ensemble")
                .map(|m| composing(m.config()))
                .unwrap_or_default(),
            false => Vec::new(),
        };
        self.unload(name)?;
        for step in steps {
            let still_used = self
                .models
                .read()
                .expect("lock")
                .values()
                .flat_map(ready_slots)
                .any(|v| v.config().platform == "ensemble" && composing(v.config()).contains(&step));
            if still_used {
                tracing::info!(model = %step, ensemble = %name, "kept: another loaded ensemble uses it");
            } else {
                self.unload_with(&step, true)?;
            }
        }
        Ok(())
    }

    /// Unloads a model (`explicit` mode only). In-flight requests finish first: each
    /// holds its version alive until it has replied.
    pub fn unload(&self, name: &str) -> Result<(), ServeError> {
        self.require_explicit("unload")?;
        let removed = self.models.write().expect("lock").remove(name);
        self.override_dirs.lock().expect("lock").remove(name);
        match removed {
            Some(_) => tracing::info!(model = %name, "unloaded"),
            // As Triton: unloading what is not loaded succeeds (there is nothing to do).
            None => tracing::warn!(model = %name, "unload: the model is not loaded"),
        }
        Ok(())
    }

    /// Rescans the repository (`poll` mode): loads new models, reloads changed ones and
    /// unloads removed ones.
    pub fn poll(&self) -> Result<(), ServeError> {
        let names = self.model_dirs()?;
        let stale: Vec<String> = {
            let models = self.models.read().expect("lock");
            let removed = models.keys().filter(|n| !names.contains(n)).cloned();
            let changed = names.iter().filter(|n| {
                models
                    .get(*n)
                    .is_none_or(|m| m.fingerprint != fingerprint(&self.options.root.join(n)))
            });
            removed.chain(changed.cloned()).collect()
        };
        let (ensembles, plain): (Vec<String>, Vec<String>) = stale
            .into_iter()
            .partition(|n| ensemble_steps(&self.options.root.join(n)).is_some());
        for name in plain.into_iter().chain(ensembles) {
            if names.contains(&name) {
                tracing::info!(model = %name, "repository changed: (re)loading");
                let _ = self.load_model(&name);
            } else {
                tracing::info!(model = %name, "removed from repository: unloading");
                self.models.write().expect("lock").remove(&name);
            }
        }
        Ok(())
    }

    /// The repository index: every model directory, with state for loaded ones.
    pub fn index(&self, ready_only: bool) -> Result<Vec<IndexEntry>, ServeError> {
        let names = self.model_dirs()?;
        let models = self.models.read().expect("lock");
        let mut out = Vec::new();
        for name in names {
            let entry = |version: Option<i64>, state, reason| IndexEntry {
                name: name.clone(),
                version: version.map(|v| v.to_string()),
                state,
                reason,
            };
            match models.get(&name) {
                None => out.push(entry(None, None, None)),
                Some(m) if m.versions.is_empty() => {
                    let reason = m
                        .error
                        .clone()
                        .unwrap_or_else(|| "no version is available".into());
                    out.push(entry(None, Some("UNAVAILABLE"), Some(reason)));
                }
                Some(m) => {
                    for (&v, slot) in &m.versions {
                        out.push(match slot {
                            Slot::Ready(_) => entry(Some(v), Some("READY"), None),
                            Slot::Failed(r) => entry(Some(v), Some("UNAVAILABLE"), Some(r.clone())),
                        });
                    }
                }
            }
        }
        if ready_only {
            out.retain(|e| e.state == Some("READY"));
        }
        Ok(out)
    }

    /// A ready version: the given one, or the highest ready version.
    pub fn get(&self, name: &str, version: Option<&str>) -> Result<Arc<ModelVersion>, ServeError> {
        lookup(&self.models.read().expect("lock"), name, version)
    }

    /// What an ensemble uses to find its composing models at request time (a weak
    /// handle: the repository owns the ensembles, not the other way round).
    fn lookup_handle(&self) -> Lookup {
        let models = Arc::downgrade(&self.models);
        Arc::new(move |name: &str, version: Option<&str>| {
            let models = models
                .upgrade()
                .ok_or_else(|| ServeError::Unloading(name.to_string()))?;
            let guard = models.read().expect("lock");
            lookup(&guard, name, version)
        })
    }

    /// Versions of a model that are ready, ascending.
    pub fn ready_versions(&self, name: &str) -> Vec<i64> {
        let models = self.models.read().expect("lock");
        let Some(m) = models.get(name) else {
            return Vec::new();
        };
        m.versions
            .iter()
            .filter(|(_, s)| matches!(s, Slot::Ready(_)))
            .map(|(&v, _)| v)
            .collect()
    }

    /// Statistics of ready versions, optionally of one model / version.
    pub fn stats(
        &self,
        name: Option<&str>,
        version: Option<&str>,
    ) -> Result<Vec<ModelStatSnapshot>, ServeError> {
        if let Some(name) = name {
            let versions: Vec<Arc<ModelVersion>> = match version {
                Some(v) => vec![self.get(name, Some(v))?],
                None => {
                    let models = self.models.read().expect("lock");
                    let m = models
                        .get(name)
                        .ok_or_else(|| ServeError::ModelNotFound(name.to_string()))?;
                    ready_slots(m).collect()
                }
            };
            return Ok(versions
                .iter()
                .map(|v| v.stats().snapshot(v.name(), v.version()))
                .collect());
        }
        let models = self.models.read().expect("lock");
        Ok(models
            .values()
            .flat_map(ready_slots)
            .map(|v| v.stats().snapshot(v.name(), v.version()))
            .collect())
    }

    fn require_explicit(&self, what: &str) -> Result<(), ServeError> {
        match self.options.mode {
            ControlMode::Explicit => Ok(()),
            // Triton's text (its tests match it), then which mode and how to change it.
            mode => Err(ServeError::NotAllowed(format!(
                "explicit model load / unload is not allowed if polling is enabled: {what} refused in model control mode {mode:?} (start with --model-control-mode explicit)"
            ))),
        }
    }

    /// Model directory names, sorted. Hidden entries are skipped.
    fn model_dirs(&self) -> Result<Vec<String>, ServeError> {
        model_dirs(&self.options.root).map_err(|e| {
            tracing::error!(
                "cannot read model repository {}: {e}",
                self.options.root.display()
            );
            ServeError::NotAllowed(format!("cannot read the model repository: {e}"))
        })
    }

    /// The repository's own spelling of `name`, if it is one of its model directories.
    fn existing_dir(&self, name: &str) -> Result<String, ServeError> {
        self.model_dirs()?
            .into_iter()
            .find(|n| n == name)
            .ok_or_else(|| ServeError::LoadFailed {
                model: name.to_string(),
                reason: "failed to poll from model repository: no model directory of that name".to_string(),
            })
    }

    /// Loads every selected version of `name` and swaps the result in. A reload that
    /// fails leaves what was serving in place: a version that was ready stays ready
    /// until a replacement has loaded, and the failure is logged and returned.
    fn load_model(&self, name: &str) -> Option<String> {
        let failure = self.load_model_at(name, &self.options.root.join(name), None);
        if failure.is_none() {
            // Loaded from the repository again: a `file:` override's directory goes.
            self.override_dirs.lock().expect("lock").remove(name);
        }
        failure
    }

    /// [`Self::load_model`] from `dir`, with the configuration given or read there.
    fn load_model_at(&self, name: &str, dir: &Path, config: Option<config::ParsedConfig>) -> Option<String> {
        let fingerprint = fingerprint(dir);
        let loaded = load_versions(dir, name, config, &self.options, &self.lookup_handle());
        let mut models = self.models.write().expect("lock");
        let previous = models.remove(name).map(|m| m.versions).unwrap_or_default();
        let (state, failure) = match loaded {
            Ok(versions) => self.merge_reload(name, previous, versions, fingerprint),
            Err(reason) => {
                let reason = self.relative(&reason);
                if previous.values().any(|s| matches!(s, Slot::Ready(_))) {
                    tracing::error!(model = %name, "reload failed, the loaded versions keep serving: {reason}");
                    let state = ModelState {
                        versions: previous,
                        error: None,
                        fingerprint,
                    };
                    (
                        state,
                        Some(format!("{reason} (the previously loaded versions keep serving)")),
                    )
                } else {
                    tracing::error!(model = %name, "failed to load: {reason}");
                    let state = ModelState {
                        versions: BTreeMap::new(),
                        error: Some(reason.clone()),
                        fingerprint,
                    };
                    (state, Some(reason))
                }
            }
        };
        models.insert(name.to_string(), state);
        failure
    }

    /// The new versions, except that one which failed to load keeps its previous ready
    /// instance. Returns the state and the first failure, if any.
    fn merge_reload(
        &self,
        name: &str,
        mut previous: BTreeMap<i64, Slot>,
        versions: BTreeMap<i64, Slot>,
        fingerprint: Vec<(PathBuf, SystemTime, u64)>,
    ) -> (ModelState, Option<String>) {
        let mut failure = None;
        let mut merged = BTreeMap::new();
        for (v, slot) in versions {
            let slot = match slot {
                Slot::Ready(m) => {
                    tracing::info!(model = %name, version = v, backend = m.backend(), "ready");
                    Slot::Ready(m)
                }
                Slot::Failed(reason) => {
                    let reason = self.relative(&reason);
                    match previous.remove(&v) {
                        Some(Slot::Ready(old)) => {
                            tracing::error!(model = %name, version = v, "reload failed, the loaded version keeps serving: {reason}");
                            failure.get_or_insert(format!(
                                "version {v}: {reason} (the previously loaded version keeps serving)"
                            ));
                            Slot::Ready(old)
                        }
                        _ => {
                            tracing::error!(model = %name, version = v, "failed to load: {reason}");
                            failure.get_or_insert(format!("version {v}: {reason}"));
                            Slot::Failed(reason)
                        }
                    }
                }
            };
            merged.insert(v, slot);
        }
        let state = ModelState {
            versions: merged,
            error: None,
            fingerprint,
        };
        (state, failure)
    }

    /// `message` with the repository's own path removed, so that what reaches clients
    /// (index reasons, 503 texts) names files relative to the repository.
    fn relative(&self, message: &str) -> String {
        let root = self.options.root.display().to_string();
        let root = root.trim_end_matches('/');
        if root.is_empty() {
            return message.to_string();
        }
        message
            .replace(&format!("{root}/"), "")
            .replace(root, "<repository>")
    }
}

/// A ready version of `name` in `models`: the given one, or the highest ready version.
fn lookup(
    models: &BTreeMap<String, ModelState>,
    name: &str,
    version: Option<&str>,
) -> Result<Arc<ModelVersion>, ServeError> {
    let model = models
        .get(name)
        .ok_or_else(|| ServeError::ModelNotFound(name.to_string()))?;
    let ready = |slot: &Slot| match slot {
        Slot::Ready(v) => Some(v.clone()),
        Slot::Failed(_) => None,
    };
    match version.filter(|v| !v.is_empty()) {
        Some(v) => {
            let number = parse_version(v)?;
            model
                .versions
                .get(&number)
                .and_then(ready)
                .ok_or_else(|| ServeError::VersionNotFound {
                    model: name.to_string(),
                    version: number.to_string(),
                    ready_missing: model.versions.contains_key(&number),
                })
        }
        None => model
            .versions
            .values()
            .rev()
            .find_map(ready)
            .ok_or_else(|| ServeError::NotReady {
                model: name.to_string(),
                reason: model
                    .error
                    .clone()
                    .unwrap_or_else(|| "no version is ready".into()),
            }),
    }
}

/// Writes `file:` override contents into a fresh directory. Each path must be
/// relative and stay inside it (no `..`, no root, no empty or over-long component).
fn write_model_files(name: &str, files: &[(String, Vec<u8>)]) -> Result<tempfile::TempDir, String> {
    let dir = tempfile::Builder::new()
        .prefix(&format!(
            "trident-{}-",
            name.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
        ))
        .tempdir()
        .map_err(|e| format!("cannot create a directory for the model files: {e}"))?;
    for (relative, data) in files {
        let path = Path::new(relative);
        let bad = |why: &str| format!("Invalid file parameter 'file:{relative}': {why}");
        let mut components = 0;
        for c in path.components() {
            match c {
                std::path::Component::Normal(part) if part.len() <= 255 => components += 1,
                std::path::Component::Normal(_) => {
                    return Err(bad("a path component is longer than 255 bytes"))
                }
                _ => {
                    return Err(bad(
                        "the path must stay within model directory (relative, no '..')",
                    ))
                }
            }
        }
        if components == 0 {
            return Err(bad("empty path"));
        }
        let target = dir.path().join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| bad(&e.to_string()))?;
        }
        if target.is_dir() {
            return Err(bad("directory has been created as a file"));
        }
        std::fs::write(&target, data).map_err(|e| bad(&e.to_string()))?;
    }
    Ok(dir)
}

/// A version string as Triton reads it (`std::stol`, then > 0), with its error texts.
pub fn parse_version(v: &str) -> Result<i64, ServeError> {
    let number: i64 = v.trim().parse().map_err(|_| {
        ServeError::InvalidRequest(format!(
            "failed to get model version from specified version string '{v}' (details: stol), version should be an integral value > 0"
        ))
    })?;
    if number < 0 {
        return Err(ServeError::InvalidRequest(format!(
            "invalid model version specified '{v}' , version should be an integral value > 0"
        )));
    }
    Ok(number)
}

/// The composing models of the ensemble in `dir`; `None` when its config is not an
/// ensemble's (or cannot be read: loading it will say why).
fn ensemble_steps(dir: &Path) -> Option<Vec<String>> {
    let c = config::read_config(&dir.join("config.pbtxt")).ok()?.config;
    (c.platform == "ensemble").then(|| composing(&c))
}

/// The model names of an ensemble config's steps.
fn composing(c: &ModelConfig) -> Vec<String> {
    match &c.scheduling_choice {
        Some(pb::model_config::SchedulingChoice::EnsembleScheduling(e)) => {
            e.step.iter().map(|s| s.model_name.clone()).collect()
        }
        _ => Vec::new(),
    }
}

fn ready_slots(m: &ModelState) -> impl Iterator<Item = Arc<ModelVersion>> + '_ {
    m.versions.values().filter_map(|s| match s {
        Slot::Ready(v) => Some(v.clone()),
        Slot::Failed(_) => None,
    })
}

/// Reads the configuration, picks versions by policy, loads each. A configuration
/// error fails the whole model; a model-file error fails only its version.
fn load_versions(
    dir: &Path,
    name: &str,
    given: Option<config::ParsedConfig>,
    options: &RepositoryOptions,
    lookup: &Lookup,
) -> Result<BTreeMap<i64, Slot>, String> {
    let cores = options.cores;
    let config_path = dir.join("config.pbtxt");
    let mut config = if let Some(parsed) = given {
        for warning in &parsed.warnings {
            tracing::warn!(model = %name, "config override: {warning}");
        }
        parsed.config
    } else if config_path.exists() {
        let parsed = config::read_config(&config_path).map_err(|e| e.to_string())?;
        for warning in &parsed.warnings {
            tracing::warn!(model = %name, "{}: {warning}", config_path.display());
        }
        parsed.config
    } else {
        tracing::info!(model = %name, "no config.pbtxt: completing the configuration from the model file");
        ModelConfig::default()
    };
    let versions = select_versions(dir, &config)?;
    if config.platform == "ensemble" {
        return load_ensemble(dir, name, config, &config_path, &versions, lookup, options);
    }
    let as_written = config.clone();
    let engine = engines::select(&config, options.onnx_engine)?;
    let mut slots = BTreeMap::new();
    // Latest first: its interface completes the configuration for all versions.
    let mut completed: Option<Arc<ModelConfig>> = None;
    for &version in versions.iter().rev() {
        let file = dir.join(version.to_string()).join(model_filename(&config));
        let slot = (|| {
            let instances = complete::instance_count(&config);
            let threads = complete::threads_per_instance(&config, instances, cores)?;
            let load_options = crate::backend::LoadOptions {
                threads_per_instance: threads,
                config: as_written.clone(),
            };
            let model =
                crate::backend::guard_panics("while loading", || engine.backend.load(&file, &load_options))
                    .map_err(|e| e.to_string())?;
            let full = match &completed {
                Some(c) => c.clone(),
                None => {
                    complete::autocomplete(&mut config, name, model.io())?;
                    config::validate(&config, name, &config_path).map_err(|e| e.to_string())?;
                    Arc::new(config.clone())
                }
            };
            complete::check_against_model(&full, model.io())?;
            let labels = read_labels(dir, &full)?;
            let warmup = crate::warmup::samples(&full, dir).map_err(|e| e.to_string())?;
            let cache = model_cache(&full, name, options);
            completed = Some(full.clone());
            tracing::info!(model = %name, version, instances, threads_per_instance = threads, "loading with {}", engine.backend.name());
            ModelVersion::start(Deployment {
                name: name.to_string(),
                version,
                config: full,
                model,
                backend: engine.backend.name(),
                instances,
                labels,
                warmup,
                cache,
            })
            .map(|m| Slot::Ready(Arc::new(m)))
            .map_err(|e| e.to_string())
        })();
        let slot = slot.unwrap_or_else(Slot::Failed);
        if let (Slot::Failed(reason), None) = (&slot, &completed) {
            if versions.len() == 1 {
                return Err(reason.clone());
            }
        }
        slots.insert(version, slot);
    }
    Ok(slots)
}

/// An ensemble's versions: its plan checked against the composing models now loaded.
fn load_ensemble(
    dir: &Path,
    name: &str,
    mut config: ModelConfig,
    config_path: &Path,
    versions: &[i64],
    lookup: &Lookup,
    options: &RepositoryOptions,
) -> Result<BTreeMap<i64, Slot>, String> {
    if config.name.is_empty() {
        config.name = name.to_string();
    }
    if !config.instance_group.is_empty() {
        return Err("an ensemble has no instance_group: its composing models have their own".into());
    }
    if matches!(
        config.scheduling_choice,
        Some(pb::model_config::SchedulingChoice::DynamicBatching(_))
    ) {
        return Err("an ensemble has ensemble_scheduling, not dynamic_batching".into());
    }
    config::validate(&config, name, config_path).map_err(|e| e.to_string())?;
    let config = Arc::new(config);
    let labels = read_labels(dir, &config)?;
    let mut slots = BTreeMap::new();
    for &version in versions {
        let plan = Ensemble::plan(name, &config, lookup.clone()).map_err(|e| e.to_string())?;
        tracing::info!(model = %name, version, "ensemble of {}", composing(&config).join(", "));
        let cache = model_cache(&config, name, options);
        let v = ModelVersion::start_ensemble(
            name.to_string(),
            version,
            config.clone(),
            Box::new(plan),
            labels.clone(),
            cache,
        );
        slots.insert(version, Slot::Ready(Arc::new(v)));
    }
    Ok(slots)
}

/// The server's cache for a model whose config enables `response_cache`.
fn model_cache(
    config: &ModelConfig,
    name: &str,
    options: &RepositoryOptions,
) -> Option<Arc<crate::cache::ResponseCache>> {
    if !config.response_cache.as_ref().is_some_and(|r| r.enable) {
        return None;
    }
    if options.cache.is_none() {
        tracing::warn!(
            model = %name,
            "response_cache is enabled but the server has no cache: start it with --cache-config local,size=BYTES"
        );
    }
    options.cache.clone()
}

/// Each output's `label_filename` (a file in the model directory, one label per line).
fn read_labels(dir: &Path, config: &ModelConfig) -> Result<Vec<Option<Arc<[String]>>>, String> {
    config
        .output
        .iter()
        .map(|o| {
            if o.label_filename.is_empty() {
                return Ok(None);
            }
            let name = Path::new(&o.label_filename);
            if name.is_absolute()
                || name
                    .components()
                    .any(|c| !matches!(c, std::path::Component::Normal(_)))
            {
                return Err(format!(
                    "output '{}': label_filename '{}' must name a file inside the model directory",
                    o.name, o.label_filename
                ));
            }
            let file = dir.join(name);
            let text = std::fs::read_to_string(&file)
                .map_err(|e| format!("output '{}': label_filename {}: {e}", o.name, file.display()))?;
            Ok(Some(
                text.lines()
                    .map(|l| l.trim_end_matches('\r').to_string())
                    .collect(),
            ))
        })
        .collect()
}

/// The model directories of the repository at `root`, sorted; hidden entries and
/// anything that is not a directory (symbolic links included) are skipped.
pub fn model_dirs(root: &Path) -> std::io::Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(root)?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    Ok(names)
}

fn model_filename(config: &ModelConfig) -> &str {
    if config.default_model_filename.is_empty() {
        engines::default_filename(config)
    } else {
        &config.default_model_filename
    }
}

/// Numeric version directories chosen by `version_policy` (default: latest 1).
fn select_versions(dir: &Path, config: &ModelConfig) -> Result<Vec<i64>, String> {
    let mut available: Vec<i64> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().to_str()?.parse::<i64>().ok())
        .filter(|&v| v >= 0)
        .collect();
    available.sort_unstable();
    use pb::model_version_policy::PolicyChoice;
    let chosen: Vec<i64> = match config
        .version_policy
        .as_ref()
        .and_then(|p| p.policy_choice.as_ref())
    {
        Some(PolicyChoice::All(_)) => available.clone(),
        Some(PolicyChoice::Specific(s)) => {
            if let Some(missing) = s.versions.iter().find(|v| !available.contains(v)) {
                return Err(format!(
                    "version_policy names version {missing}, which has no directory"
                ));
            }
            s.versions.clone()
        }
        Some(PolicyChoice::Latest(l)) => {
            let n = (l.num_versions.max(1) as usize).min(available.len());
            available[available.len() - n..].to_vec()
        }
        None => available.last().copied().into_iter().collect(),
    };
    if chosen.is_empty() {
        return Err(format!(
            "no version directory (e.g. {}/1/model.onnx) found",
            dir.display()
        ));
    }
    Ok(chosen)
}

/// File names, modification times and sizes under a model directory (two levels).
fn fingerprint(dir: &Path) -> Vec<(PathBuf, SystemTime, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), 0)];
    while let Some((d, depth)) = stack.pop() {
        let Ok(read) = std::fs::read_dir(&d) else { continue };
        for entry in read.filter_map(Result::ok) {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() && depth < 2 {
                stack.push((entry.path(), depth + 1));
            }
            out.push((
                entry.path(),
                meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                meta.len(),
            ));
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests;
