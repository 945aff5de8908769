//! Named parameters: creation (seeded initialisation or loading from safetensors),
//! freezing, and saving.
//!
//! A [`Params`] store holds every tensor a model owns, in creation order, under a dotted
//! name (`bert.encoder.layer.0.attention.self.query.weight`): trainable weights as candle
//! [`Var`]s, and buffers (batch-norm running statistics) that are saved with the model but
//! get no gradient. A [`ParamBuilder`] is a cursor into the store with a name prefix; models
//! take one in their constructor, as with candle-nn's `VarBuilder`, but initialisation is
//! seeded per name so two runs with the same seed build bit-identical models.
//!
//! For inference a store hands models *detached* tensors that share the `Var`s' storage
//! ([`Params::for_inference`], and [`Params::inference_view`] for a second model over a
//! training model's store): ops on them record no graph, so a forward pass frees each
//! activation as soon as the next op has read it instead of keeping the whole batch's
//! activations alive for a backward pass that never comes (PyTorch's `no_grad`).

use candle_core::{DType, Device, Result, Shape, Tensor, Var};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use trident_data::rng::SplitMix64;

/// One named tensor of a model.
#[derive(Debug, Clone)]
pub struct Param {
    /// Dotted name.
    pub name: String,
    /// The value (updated in place by optimizers).
    pub var: Var,
    /// Receives gradients and optimizer updates; false for buffers and frozen weights.
    pub trainable: bool,
}

#[derive(Default)]
struct Store {
    params: Vec<Param>,
    index: HashMap<String, usize>,
    /// Names that were initialised because the loaded file lacked them.
    initialised: Vec<String>,
    /// Row lookups of the current training step ([`Params::gather_rows`]).
    row_uses: Vec<RowUse>,
    /// Gradient buffers that kernels write into directly ([`Params::sink`]), by name.
    sinks: HashMap<String, GradSink>,
}

/// A parameter's gradient buffer that a fused kernel's backward pass writes into directly
/// (with `beta = 1` GEMMs when it already holds this step's gradient), instead of
/// returning a tensor to candle's backward pass, which would zero-fill a second tensor of
/// the parameter's size, add the two, and leave the trainer a third copy to read. The
/// buffer's contents belong to the step started by the last [`Params::begin_step`];
/// [`Params::gradient_into`] reads them.
#[derive(Clone)]
pub struct GradSink {
    buf: Arc<Mutex<SinkBuf>>,
    step: Arc<AtomicU64>,
    len: usize,
}

struct SinkBuf {
    /// The step whose gradient `data` holds (`u64::MAX`: none yet).
    step: u64,
    data: Vec<f32>,
}

impl std::fmt::Debug for GradSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GradSink({} values)", self.len)
    }
}

impl GradSink {
    /// Number of values (the parameter's element count).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the parameter is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Runs `f` on the buffer; its flag says whether the buffer already holds a gradient of
    /// the current step (then `f` must add to it; otherwise overwrite every value).
    pub fn write<R>(&self, f: impl FnOnce(&mut [f32], bool) -> R) -> R {
        let step = self.step.load(Ordering::Acquire);
        let mut b = self.buf.lock().unwrap_or_else(|e| e.into_inner());
        if b.data.len() != self.len {
            b.data = vec![0.0; self.len];
        }
        let holds = b.step == step;
        b.step = step;
        f(&mut b.data, holds)
    }

    /// Adds `values` to this step's gradient, or makes them the gradient if none was
    /// written yet this step.
    pub fn accumulate(&self, values: &[f32]) {
        self.write(|out, holds| add_or_copy(out, values, holds))
    }

    /// Runs `f` on this step's gradient, if one was written.
    fn read<R>(&self, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
        let step = self.step.load(Ordering::Acquire);
        let b = self.buf.lock().unwrap_or_else(|e| e.into_inner());
        (b.step == step).then(|| f(&b.data))
    }
}

/// Rows of a table gathered in a training step, as a leaf of the graph.
struct RowUse {
    name: String,
    rows: Var,
    ids: Vec<u32>,
}

/// All the parameters of a model. Cloning shares the store.
#[derive(Clone, Default)]
pub struct Params {
    store: Arc<Mutex<Store>>,
    next_id: Arc<AtomicU64>,
    /// Counts [`begin_step`](Self::begin_step) calls; sinks hold the step they were written in.
    step: Arc<AtomicU64>,
    /// What builders hand out.
    hands: Hands,
}

/// What a store's builders hand to the models they build.
#[derive(Clone, Copy, Default, PartialEq)]
enum Hands {
    /// New parameters as tracked tensors (training).
    #[default]
    Tracked,
    /// New parameters as detached tensors (no graph is recorded through them).
    Detached,
    /// The store's existing parameters, detached, creating nothing: a second model over
    /// the same values.
    Existing,
}

impl std::fmt::Debug for Params {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Params({} tensors)", self.len())
    }
}

/// How a new parameter is initialised when no loaded value exists.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// All zeros.
    Zeros,
    /// All ones.
    Ones,
    /// Normal(0, std).
    Normal(f32),
    /// Uniform(-bound, bound).
    Uniform(f32),
}

impl Params {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store whose models get detached tensors: for a model that only runs
    /// forward (a checkpoint loaded for evaluation, prediction, export or as a teacher).
    /// The store's `Var`s are still there to load values into (in place).
    pub fn for_inference() -> Self {
        Params {
            hands: Hands::Detached,
            ..Self::default()
        }
    }

    /// This store, for building a second model over the same parameters for evaluation:
    /// its builders hand out each existing parameter detached (sharing its storage, so
    /// optimizer updates and loaded weights show) and create nothing.
    pub fn inference_view(&self) -> Self {
        Params {
            hands: Hands::Existing,
            ..self.clone()
        }
    }

    /// Whether this is an [`inference_view`](Self::inference_view): builders take existing
    /// parameters, so model constructors need not read weight files for it.
    pub fn is_view(&self) -> bool {
        self.hands == Hands::Existing
    }

    /// A builder at the root of this store: new parameters are initialised from `seed`, or
    /// taken from `loaded` where it holds the name.
    pub fn builder(&self, seed: u64, loaded: Option<Loaded>) -> ParamBuilder {
        ParamBuilder {
            params: self.clone(),
            prefix: String::new(),
            seed,
            loaded: loaded.map(Arc::new),
        }
    }

    /// Every parameter, in creation order.
    pub fn all(&self) -> Vec<Param> {
        self.store.lock().unwrap().params.clone()
    }

    /// The trainable parameters, in creation order.
    pub fn trainable(&self) -> Vec<Param> {
        self.all().into_iter().filter(|p| p.trainable).collect()
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.store.lock().unwrap().params.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of trainable scalars.
    pub fn trainable_count(&self) -> usize {
        self.trainable().iter().map(|p| p.var.elem_count()).sum()
    }

    /// Parameter `name`.
    pub fn get(&self, name: &str) -> Option<Param> {
        let s = self.store.lock().unwrap();
        s.index.get(name).map(|&i| s.params[i].clone())
    }

    /// Names created by initialisation although a file was loaded (e.g. a new
    /// classification head on a pretrained encoder).
    pub fn initialised_names(&self) -> Vec<String> {
        self.store.lock().unwrap().initialised.clone()
    }

    /// Freezes (or unfreezes) every parameter whose name starts with `prefix`; returns how
    /// many matched.
    pub fn set_trainable(&self, prefix: &str, trainable: bool) -> usize {
        let mut s = self.store.lock().unwrap();
        let mut n = 0;
        for p in s.params.iter_mut().filter(|p| p.name.starts_with(prefix)) {
            p.trainable = trainable;
            n += 1;
        }
        n
    }

    /// A fresh id (dropout layers use it to draw independent masks).
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Rows `ids` (u32, any shape) of the `[n, dim]` table parameter `name`, for a training
    /// step: the rows become a fresh leaf of the graph and the lookup is recorded, so the
    /// backward pass yields a gradient for the gathered rows only, which
    /// [`gradient_into`](Self::gradient_into) scatters into the table's gradient. candle's
    /// own `index_select` backward instead zero-fills a copy of the whole table and adds
    /// into it (MiniLM's word table is 30522 × 384: 47 MB, twice, every step). Returns
    /// `ids.shape + [dim]`. Frozen tables are looked up without a graph. Lookups are kept
    /// until [`begin_step`](Self::begin_step).
    pub fn gather_rows(&self, table: &Tensor, name: &str, ids: &Tensor) -> Result<Tensor> {
        let mut shape = ids.dims().to_vec();
        shape.push(table.dim(1)?);
        let flat = ids.flatten_all()?;
        let rows = table.detach().index_select(&flat, 0)?;
        if !self.get(name).is_some_and(|p| p.trainable) {
            return rows.reshape(shape);
        }
        let leaf = Var::from_tensor(&rows)?;
        self.store.lock().unwrap().row_uses.push(RowUse {
            name: name.into(),
            rows: leaf.clone(),
            ids: flat.to_dtype(DType::U32)?.to_vec1::<u32>()?,
        });
        leaf.as_tensor().reshape(shape)
    }

    /// Forgets the lookups recorded by [`gather_rows`](Self::gather_rows): call before each
    /// training forward pass.
    pub fn begin_step(&self) {
        self.store.lock().unwrap().row_uses.clear();
        self.step.fetch_add(1, Ordering::AcqRel);
    }

    /// The gradient buffer of trainable parameter `name`, for a fused kernel to write into
    /// (see [`GradSink`]); `None` for buffers, frozen or unknown parameters. A kernel that
    /// uses sinks gives the parameter no gradient in candle's [`GradStore`]
    /// (candle_core::backprop::GradStore): collect it with
    /// [`gradient_into`](Self::gradient_into).
    pub fn sink(&self, name: &str) -> Option<GradSink> {
        let mut s = self.store.lock().unwrap();
        let p = s.index.get(name).map(|&i| &s.params[i])?;
        if !p.trainable {
            return None;
        }
        let len = p.var.elem_count();
        let step = self.step.clone();
        let sink = s.sinks.entry(name.into()).or_insert_with(|| GradSink {
            buf: Arc::new(Mutex::new(SinkBuf {
                step: u64::MAX,
                data: Vec::new(),
            })),
            step,
            len,
        });
        Some(sink.clone())
    }

    /// Writes the gradient of `p` into `out` (`p`'s element count), adding to what is there
    /// when `accumulate`: the sum of its gradient in `grads`, what kernels wrote into its
    /// [`sink`](Self::sink) this step, and, for a table read through
    /// [`gather_rows`](Self::gather_rows), its rows' gradients scattered into place. Returns
    /// false when `p` got no gradient (then `out` is zeroed unless `accumulate`).
    pub fn gradient_into(
        &self,
        grads: &candle_core::backprop::GradStore,
        p: &Param,
        out: &mut [f32],
        accumulate: bool,
    ) -> Result<bool> {
        use rayon::prelude::*;
        if out.len() != p.var.elem_count() {
            candle_core::bail!(
                "gradient of `{}`: buffer of {} for {} values",
                p.name,
                out.len(),
                p.var.elem_count()
            )
        }
        // The dense gradient (or zeros) first, then the gathered rows added on top.
        let dense = grads.get(p.var.as_tensor());
        match dense {
            Some(g) => crate::kernel::with_f32(g, |g| add_or_copy(out, g, accumulate))?,
            None if !accumulate => out.par_chunks_mut(1 << 16).for_each(|o| o.fill(0.0)),
            None => {}
        }
        let mut got = dense.is_some();
        let store = self.store.lock().unwrap();
        if let Some(sink) = store.sinks.get(&p.name) {
            let add = accumulate || got;
            got |= sink.read(|g| add_or_copy(out, g, add)).is_some();
        }
        for u in store.row_uses.iter().filter(|u| u.name == p.name) {
            let Some(g) = grads.get(u.rows.as_tensor()) else {
                continue;
            };
            got = true;
            let dim = p.var.dim(1)?;
            crate::kernel::with_f32(g, |g| {
                for (row, &id) in g.chunks(dim).zip(&u.ids) {
                    let id = id as usize;
                    out[id * dim..(id + 1) * dim]
                        .iter_mut()
                        .zip(row)
                        .for_each(|(o, g)| *o += g);
                }
            })?;
        }
        Ok(got)
    }

    /// Every tensor by name (values, detached).
    pub fn tensors(&self) -> HashMap<String, Tensor> {
        self.all()
            .into_iter()
            .map(|p| (p.name, p.var.as_tensor().detach()))
            .collect()
    }

    /// Writes every tensor to a safetensors file (not atomically: callers that need that
    /// write into a temporary directory and rename it).
    pub fn save(&self, file: &Path) -> Result<()> {
        candle_core::safetensors::save(&self.tensors(), file)
    }

    /// Overwrites every parameter with the value of the same name in `loaded`; every name
    /// must be there with the same shape.
    pub fn load_values(&self, loaded: &Loaded) -> Result<()> {
        for p in self.all() {
            let t = loaded
                .get(&p.name, p.var.shape())
                .map_err(|e| candle_core::Error::Msg(format!("{}: {e}", loaded.origin)))?;
            let Some(t) = t else {
                candle_core::bail!("{}: has no tensor `{}`", loaded.origin, p.name)
            };
            p.var.set(&t)?;
        }
        Ok(())
    }

    fn insert(&self, param: Param, initialised_despite_file: bool) -> Result<Tensor> {
        let mut s = self.store.lock().unwrap();
        if s.index.contains_key(&param.name) {
            candle_core::bail!("parameter `{}` is created twice", param.name)
        }
        let t = if self.hands != Hands::Tracked {
            param.var.as_detached_tensor()
        } else {
            param.var.as_tensor().clone()
        };
        let i = s.params.len();
        s.index.insert(param.name.clone(), i);
        if initialised_despite_file {
            s.initialised.push(param.name.clone());
        }
        s.params.push(param);
        Ok(t)
    }
}

/// Tensors read from a safetensors file, with an optional name prefix to add (MiniLM's
/// file has no `bert.` prefix; BertForSequenceClassification's names have it).
#[derive(Debug, Clone)]
pub struct Loaded {
    tensors: HashMap<String, Tensor>,
    /// Where they came from, for error messages.
    pub origin: String,
}

impl Loaded {
    /// Reads `file`.
    pub fn read(file: &Path) -> Result<Self> {
        let tensors = candle_core::safetensors::load(file, &Device::Cpu)
            .map_err(|e| candle_core::Error::Msg(format!("{}: {e}", file.display())))?;
        Ok(Loaded {
            tensors,
            origin: file.display().to_string(),
        })
    }

    /// From tensors in memory.
    pub fn from_tensors(tensors: HashMap<String, Tensor>, origin: &str) -> Self {
        Loaded {
            tensors,
            origin: origin.into(),
        }
    }

    /// Adds `prefix` to every name that does not already start with it.
    pub fn with_prefix(mut self, prefix: &str) -> Self {
        self.tensors = self
            .tensors
            .into_iter()
            .map(|(k, v)| {
                if k.starts_with(prefix) {
                    (k, v)
                } else {
                    (format!("{prefix}{k}"), v)
                }
            })
            .collect();
        self
    }

    /// Drops the tensors under `prefix` (e.g. a pretrained classification head for another
    /// number of classes); returns their names.
    pub fn drop_prefix(&mut self, prefix: &str) -> Vec<String> {
        let names: Vec<String> = self
            .tensors
            .keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect();
        for n in &names {
            self.tensors.remove(n);
        }
        names
    }

    /// Keeps the numbered blocks `keep` under `prefix` (`prefix{i}.…`), renumbered
    /// 0, 1, … in that order, and drops the other blocks: a shallower student starts from
    /// chosen teacher layers (DistilBERT's "every other layer"). Errors name a block the
    /// file lacks.
    pub fn keep_layers(&mut self, prefix: &str, keep: &[usize]) -> Result<()> {
        let mut out = HashMap::with_capacity(self.tensors.len());
        for (k, v) in self.tensors.drain() {
            let Some(rest) = k.strip_prefix(prefix) else {
                out.insert(k, v);
                continue;
            };
            let (num, tail) = rest.split_once('.').unwrap_or((rest, ""));
            let Ok(i) = num.parse::<usize>() else {
                out.insert(k, v);
                continue;
            };
            for (new, _) in keep.iter().enumerate().filter(|(_, &old)| old == i) {
                out.insert(format!("{prefix}{new}.{tail}"), v.clone());
            }
        }
        self.tensors = out;
        for (new, old) in keep.iter().enumerate() {
            if !self
                .tensors
                .keys()
                .any(|k| k.starts_with(&format!("{prefix}{new}.")))
            {
                candle_core::bail!("{}: has no block {prefix}{old}", self.origin)
            }
        }
        Ok(())
    }

    /// Drops the tensors whose shape differs from `shapes[name]` (a model of another width
    /// initialised from this file "where shapes allow"); returns their names, sorted.
    pub fn retain_matching(&mut self, shapes: &HashMap<String, Vec<usize>>) -> Vec<String> {
        let mut dropped: Vec<String> = self
            .tensors
            .iter()
            .filter(|(k, t)| shapes.get(*k).is_some_and(|s| s.as_slice() != t.dims()))
            .map(|(k, _)| k.clone())
            .collect();
        dropped.sort();
        for k in &dropped {
            self.tensors.remove(k);
        }
        dropped
    }

    /// Adds or replaces tensor `name`.
    pub fn insert(&mut self, name: &str, t: Tensor) {
        self.tensors.insert(name.to_string(), t);
    }

    /// Tensor `name` as stored, if present.
    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    /// The shape of tensor `name`, if present.
    pub fn dims(&self, name: &str) -> Option<Vec<usize>> {
        self.tensors.get(name).map(|t| t.dims().to_vec())
    }

    /// Whether a tensor of this name exists.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The tensor `name` as f32 with shape `shape`; `None` if absent, an error naming the
    /// tensor if its shape differs.
    pub fn get(&self, name: &str, shape: &Shape) -> Result<Option<Tensor>> {
        let Some(t) = self.tensors.get(name) else {
            return Ok(None);
        };
        if t.shape() != shape {
            candle_core::bail!(
                "tensor `{name}` has shape {:?}, the model needs {:?}",
                t.dims(),
                shape.dims()
            )
        }
        Ok(Some(t.to_dtype(DType::F32)?))
    }
}

/// A cursor into a [`Params`] store with a name prefix.
#[derive(Clone)]
pub struct ParamBuilder {
    params: Params,
    prefix: String,
    seed: u64,
    loaded: Option<Arc<Loaded>>,
}

impl ParamBuilder {
    /// A builder for the sub-module `name`.
    pub fn pp(&self, name: impl std::fmt::Display) -> Self {
        let mut b = self.clone();
        b.prefix = if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        };
        b
    }

    /// The store.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// The full name of `name` under this prefix.
    pub fn path(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.into()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    /// A trainable parameter.
    pub fn get(&self, shape: impl Into<Shape>, name: &str, init: Init) -> Result<Tensor> {
        self.create(shape.into(), name, init, true)
    }

    /// A buffer: saved and loaded with the model, never trained.
    pub fn buffer(&self, shape: impl Into<Shape>, name: &str, init: Init) -> Result<Tensor> {
        self.create(shape.into(), name, init, false)
    }

    fn create(&self, shape: Shape, name: &str, init: Init, trainable: bool) -> Result<Tensor> {
        let full = self.path(name);
        if self.params.is_view() {
            let Some(p) = self.params.get(&full) else {
                candle_core::bail!("inference view: the store has no parameter `{full}`")
            };
            if p.var.shape() != &shape {
                candle_core::bail!(
                    "inference view: `{full}` has shape {:?}, the model needs {:?}",
                    p.var.dims(),
                    shape.dims()
                )
            }
            return Ok(p.var.as_detached_tensor());
        }
        let from_file = match &self.loaded {
            Some(l) => l
                .get(&full, &shape)
                .map_err(|e| candle_core::Error::Msg(format!("{}: {e}", l.origin)))?,
            None => None,
        };
        let despite_file = self.loaded.is_some() && from_file.is_none();
        let value = match from_file {
            Some(t) => t,
            None => initialise(&shape, init, self.seed, &full)?,
        };
        self.params.insert(
            Param {
                name: full,
                var: Var::from_tensor(&value)?,
                trainable,
            },
            despite_file,
        )
    }
}

/// `out += g` when `add`, else `out = g`; in parallel blocks.
fn add_or_copy(out: &mut [f32], g: &[f32], add: bool) {
    use rayon::prelude::*;
    out.par_chunks_mut(1 << 16)
        .zip(g.par_chunks(1 << 16))
        .for_each(|(o, g)| {
            if add {
                o.iter_mut().zip(g).for_each(|(o, g)| *o += g)
            } else {
                o.copy_from_slice(g)
            }
        })
}

/// FNV-1a of a string: stable across runs and platforms (std's hasher is randomly keyed).
pub fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn initialise(shape: &Shape, init: Init, seed: u64, name: &str) -> Result<Tensor> {
    let n = shape.elem_count();
    let mut rng = SplitMix64::from_parts(&[seed, name_hash(name)]);
    let v: Vec<f32> = match init {
        Init::Zeros => vec![0.0; n],
        Init::Ones => vec![1.0; n],
        Init::Uniform(b) => (0..n).map(|_| (rng.next_f32() * 2.0 - 1.0) * b).collect(),
        Init::Normal(std) => (0..n)
            .map(|_| {
                // Box-Muller; 1 - u keeps the logarithm finite.
                let (u1, u2) = (1.0 - rng.next_f32(), rng.next_f32());
                (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos() * std
            })
            .collect(),
    };
    Tensor::from_vec(v, shape.clone(), &Device::Cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inference_stores_hand_out_detached_tensors_over_the_vars_storage() {
        let values = |t: &Tensor| t.to_vec1::<f32>().unwrap();
        // An inference store: a Var to load into, a tensor that records no graph.
        let p = Params::for_inference();
        let w = p.builder(0, None).pp("lin").get(3, "weight", Init::Ones).unwrap();
        assert!(!w.track_op());
        let var = p.get("lin.weight").unwrap().var;
        var.set(&Tensor::new(&[1f32, 2., 3.], &Device::Cpu).unwrap())
            .unwrap();
        assert_eq!(values(&w), [1., 2., 3.], "loaded values show through the tensor");
        // A training store and a view of it: the view's tensor is the same storage,
        // detached; the training tensor records a graph.
        let train = Params::new();
        let t = train.builder(0, None).get(2, "b", Init::Zeros).unwrap();
        assert!(t.track_op());
        let view = train.inference_view();
        let v = view.builder(9, None).get(2, "b", Init::Ones).unwrap();
        assert!(!v.track_op());
        train
            .get("b")
            .unwrap()
            .var
            .set(&Tensor::new(&[5f32, 6.], &Device::Cpu).unwrap())
            .unwrap();
        assert_eq!(
            values(&v),
            [5., 6.],
            "the view follows the store, not its own init"
        );
        assert_eq!(train.len(), 1, "the view created nothing");
        let err = |r: Result<Tensor>| r.unwrap_err().to_string();
        assert!(err(view.builder(0, None).get(2, "missing", Init::Zeros)).contains("`missing`"));
        assert!(err(view.builder(0, None).get(3, "b", Init::Zeros)).contains("shape [2]"));
    }

    #[test]
    fn keep_layers_renumbers_the_chosen_blocks_and_drops_the_rest() {
        let t = |v: f32| Tensor::new(&[v], &Device::Cpu).unwrap();
        let mut tensors = HashMap::new();
        for i in 0..6 {
            tensors.insert(format!("enc.layer.{i}.w"), t(i as f32));
            tensors.insert(format!("enc.layer.{i}.sub.b"), t(10.0 + i as f32));
        }
        tensors.insert("enc.layer.norm".into(), t(-1.0)); // not a numbered block: kept
        tensors.insert("head.w".into(), t(-2.0));
        let mut l = Loaded::from_tensors(tensors, "test");
        l.keep_layers("enc.layer.", &[4, 0, 2]).unwrap();
        let v = |n: &str| l.tensors[n].to_vec1::<f32>().unwrap()[0];
        assert_eq!(
            (v("enc.layer.0.w"), v("enc.layer.1.w"), v("enc.layer.2.w")),
            (4.0, 0.0, 2.0)
        );
        assert_eq!(v("enc.layer.1.sub.b"), 10.0);
        assert_eq!((v("enc.layer.norm"), v("head.w")), (-1.0, -2.0));
        assert_eq!(l.tensors.len(), 3 * 2 + 2);
        let err = l.keep_layers("enc.layer.", &[0, 7]).unwrap_err().to_string();
        assert!(err.contains("no block enc.layer.7"), "{err}");
    }

    #[test]
    fn seeded_initialisation_is_reproducible_and_per_name() {
        let build = |seed| {
            let p = Params::new();
            let b = p.builder(seed, None);
            let a = b.pp("a").get((3, 4), "weight", Init::Normal(0.02)).unwrap();
            let c = b.pp("c").get((3, 4), "weight", Init::Normal(0.02)).unwrap();
            (
                a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                c.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            )
        };
        let (a1, c1) = build(1);
        let (a2, _) = build(1);
        let (a3, _) = build(2);
        assert_eq!(a1, a2);
        assert_ne!(a1, c1);
        assert_ne!(a1, a3);
    }

    #[test]
    fn loading_checks_shapes_and_reports_initialised_names() {
        let mut m = HashMap::new();
        m.insert(
            "enc.weight".to_string(),
            Tensor::ones((2, 2), DType::F32, &Device::Cpu).unwrap(),
        );
        let p = Params::new();
        let b = p.builder(0, Some(Loaded::from_tensors(m.clone(), "x.safetensors")));
        let w = b.get((2, 2), "enc.weight", Init::Zeros).unwrap();
        assert_eq!(w.sum_all().unwrap().to_scalar::<f32>().unwrap(), 4.0);
        b.get(3, "head.bias", Init::Zeros).unwrap();
        assert_eq!(p.initialised_names(), ["head.bias"]);
        let err = Params::new()
            .builder(0, Some(Loaded::from_tensors(m, "x.safetensors")))
            .get((3, 2), "enc.weight", Init::Zeros)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("x.safetensors: tensor `enc.weight` has shape [2, 2]"),
            "{err}"
        );
    }

    #[test]
    fn sparse_row_gradients_equal_the_dense_lookup_gradient() {
        let params = Params::new();
        let pb = params.builder(3, None);
        let table = pb.get((10, 4), "emb.weight", Init::Normal(1.0)).unwrap();
        let p = params.get("emb.weight").unwrap();
        // Repeated ids: their rows' gradients add up.
        let ids = Tensor::new(&[[1u32, 7, 1], [0, 7, 7]], &Device::Cpu).unwrap();
        let probe = Tensor::randn(0f32, 1.0, (2, 3, 4), &Device::Cpu).unwrap();
        let dense_out = table
            .index_select(&ids.flatten_all().unwrap(), 0)
            .unwrap()
            .reshape((2, 3, 4))
            .unwrap();
        let dense = (dense_out * &probe)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let want = dense
            .get(&table)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        params.begin_step();
        let sparse_out = params.gather_rows(&table, "emb.weight", &ids).unwrap();
        let grads = (sparse_out * &probe)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        assert!(
            grads.get(&table).is_none(),
            "the table itself is not in the graph"
        );
        let mut got = vec![9f32; 40];
        assert!(params.gradient_into(&grads, &p, &mut got, false).unwrap());
        for (a, b) in want.iter().zip(&got) {
            assert!((a - b).abs() < 1e-6, "{want:?} vs {got:?}");
        }
        // Accumulating adds; a frozen table records nothing.
        params.gradient_into(&grads, &p, &mut got, true).unwrap();
        assert!((got[4] - 2.0 * want[4]).abs() < 1e-5);
        params.begin_step();
        params.set_trainable("emb", false);
        let out = params.gather_rows(&table, "emb.weight", &ids).unwrap();
        let grads = out.sum_all().unwrap().backward().unwrap();
        assert!(!params.gradient_into(&grads, &p, &mut got, false).unwrap());
        assert!(got.iter().all(|v| *v == 0.0));
    }
}
