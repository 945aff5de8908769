//! Knowledge distillation (KD-1, KD-2): a frozen teacher's logits teach a student.
//!
//! [`Distill`] is a [`TrainStep`]: each batch runs the teacher in evaluation mode (no
//! dropout, batch norm on running statistics) with its logits detached from the graph, then
//! the student in training mode, and returns the student's logits with the distillation
//! loss. Only the student's parameters are handed to the optimizer, and the KL kernel
//! gives the teacher's logits no gradient, so the teacher cannot change.
//!
//! In cached mode ([`LogitCache`]) the teacher's logits are looked up by a hash of each
//! example's content (so every augmented view has its own entry, and changed data simply
//! misses) and computed only on a miss. Filled once before training
//! ([`Distill::teacher_logits`] over the epochs' views), the cache is a file reused by
//! later epochs and runs; it records a fingerprint of the teacher's weights and is refused
//! for another teacher. With many classes it can keep only each row's top-k logits (see
//! [`LogitCache::open`]).

use crate::trainer::{HiddenStates, StepOutput, TrainStep};
use candle_core::{Result, Tensor};
use half::f16;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use trident_nn::{ops, Ctx, Params};

/// The distillation loss.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum KdLoss {
    /// Hinton et al. (2015): `alpha · T² · KL(softmax(z_t/T) ‖ softmax(z_s/T)) + (1 − alpha)
    /// · CE(y, z_s)`, the KL averaged over the batch.
    Soft {
        /// Temperature `T` (> 0).
        temperature: f64,
        /// Weight `alpha` of the soft term, in [0, 1].
        alpha: f64,
    },
    /// DeiT's hard distillation: `½ CE(y, z_s) + ½ CE(argmax z_t, z_s)`.
    Hard {},
}

impl KdLoss {
    /// Checks the parameters; the message names the bad one.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if let KdLoss::Soft { temperature, alpha } = *self {
            if !(temperature > 0.0 && temperature.is_finite()) {
                return Err(format!("distill.temperature must be > 0, got {temperature}"));
            }
            if !(0.0..=1.0).contains(&alpha) {
                return Err(format!("distill.alpha must be in [0, 1], got {alpha}"));
            }
        }
        Ok(())
    }

    /// The loss of `student` logits against `teacher` logits and true `labels` (`[n]`, u32).
    pub fn compute(&self, student: &Tensor, teacher: &Tensor, labels: &Tensor) -> Result<Tensor> {
        let _layer = trident_nn::trace::layer(|| "distill-loss".into());
        match *self {
            KdLoss::Soft { temperature, alpha } => {
                let t = temperature as f32;
                let soft =
                    ops::distill_kl(student, teacher, t)?.affine(alpha * temperature * temperature, 0.0)?;
                if alpha >= 1.0 {
                    return Ok(soft);
                }
                let hard = ops::cross_entropy(student, labels)?.affine(1.0 - alpha, 0.0)?;
                soft + hard
            }
            KdLoss::Hard {} => {
                let argmax: Vec<u32> = ops::argmax_rows(teacher)?.into_iter().map(|i| i as u32).collect();
                let teacher_labels = Tensor::new(argmax, student.device())?;
                let a = ops::cross_entropy(student, labels)?;
                let b = ops::cross_entropy(student, &teacher_labels)?;
                (a + b)?.affine(0.5, 0.0)
            }
        }
    }
}

/// Hidden-state matching (TinyBERT, Jiao et al. 2020): `weight · mean over pairs of
/// MSE(student state s, teacher state t)` over the real tokens, added to the logit loss.
/// State 0 is the embeddings' output, state i the output of layer i. Student and teacher
/// must have the same hidden size (TinyBERT's learned projection is not built).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HiddenMatch {
    /// `[student state, teacher state]` pairs, e.g. `[[1, 2], [2, 4], [3, 6]]`.
    pub pairs: Vec<[usize; 2]>,
    /// The weight of the hidden-state term.
    #[serde(default = "one")]
    pub weight: f64,
}

fn one() -> f64 {
    1.0
}

/// The mean squared error between `[batch, seq, hidden]` states over the tokens where
/// `mask` (`[batch, seq]`, f32) is 1: `Σ((s − t)·mask)² / (Σmask · hidden)`. `teacher` gets
/// no gradient.
pub fn hidden_mse(student: &Tensor, teacher: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let hidden = student.dim(2)?;
    let diff = (student - teacher.detach())?.broadcast_mul(&mask.unsqueeze(2)?)?;
    let tokens = mask.sum_all()?.to_scalar::<f32>()?.max(1.0);
    diff.sqr()?
        .sum_all()?
        .affine(1.0 / (tokens as f64 * hidden as f64), 0.0)
}

/// A batch whose rows can be told apart by content: the cache's keys.
pub trait RowKeys {
    /// One key per example of the batch, a hash of exactly what the models see of it.
    fn row_keys(&self) -> Result<Vec<u64>>;
}

/// 64-bit FNV-1a: a stable hash (the same in every build and run, unlike std's hasher), for
/// content keys.
pub fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// The FNV-1a offset basis: the starting value of [`fnv1a`].
pub const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// Teacher logits by example content, stored as f16, and the file they live in.
pub struct LogitCache {
    path: PathBuf,
    teacher: String,
    classes: usize,
    top_k: Option<usize>,
    map: HashMap<u64, Entry>,
    /// Entries added since the file was read or written.
    added: usize,
}

/// One row: every logit (`idx` empty), or the top-k logits at `idx` and `fill` for the
/// other classes.
struct Entry {
    idx: Vec<u32>,
    val: Vec<f16>,
    fill: f16,
}

#[derive(Serialize, Deserialize)]
struct CacheHeader {
    format: String,
    teacher: String,
    classes: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    top_k: Option<usize>,
    entries: usize,
}

/// "10 classes" or "1000 classes, top 20".
fn layout(classes: usize, top_k: Option<usize>) -> String {
    match top_k {
        Some(k) => format!("{classes} classes, top {k}"),
        None => format!("{classes} classes"),
    }
}

const CACHE_FORMAT: &str = "trident-teacher-logits/1";

/// Why a cache file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// Reading or writing failed.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The file holds another teacher's logits, another class count or another top-k.
    #[error(
        "{path}: a stale teacher-logit cache: it was made for teacher {cached} with {cached_layout}, \
         the run needs teacher {current} with {layout}; delete the file (or set distill.cache \
         to another path) to rebuild it"
    )]
    Stale {
        /// The file.
        path: PathBuf,
        /// Fingerprint in the file.
        cached: String,
        /// Classes (and top-k) in the file.
        cached_layout: String,
        /// Fingerprint of the current teacher.
        current: String,
        /// Classes (and top-k) the run needs.
        layout: String,
    },
}

/// A fingerprint of a teacher checkpoint: CRC-32C and length of its `model.safetensors`.
pub fn teacher_fingerprint(checkpoint: &Path) -> std::result::Result<String, CacheError> {
    let file = checkpoint.join("model.safetensors");
    let bytes = std::fs::read(&file).map_err(|e| CacheError::Io {
        path: file.clone(),
        message: e.to_string(),
    })?;
    Ok(format!("crc32c:{:08x}:{}", crc32c::crc32c(&bytes), bytes.len()))
}

impl LogitCache {
    /// Opens the cache at `path` for `teacher` (a [`teacher_fingerprint`]) and `classes`:
    /// reads it if it exists (refusing a stale one), else starts empty.
    ///
    /// With `top_k = Some(k)` (k < classes) a row keeps its k largest logits and one fill
    /// value for the other classes, chosen so that their total probability at temperature
    /// 1 is the teacher's (`fill = logsumexp(rest) − ln(classes − k)`): the softmax at T = 1
    /// is exact for the top k and for the mass of the rest, which is spread evenly. Each row
    /// then costs `6k + 2` bytes instead of `2·classes`.
    pub fn open(
        path: &Path,
        teacher: &str,
        classes: usize,
        top_k: Option<usize>,
    ) -> std::result::Result<Self, CacheError> {
        if let Some(k) = top_k {
            if k == 0 || k >= classes {
                return Err(CacheError::Io {
                    path: path.to_path_buf(),
                    message: format!(
                        "top-k storage needs 0 < k < {classes} (the class count), got {k}; \
                         without top-k every logit is kept"
                    ),
                });
            }
        }
        let io = |e: std::io::Error| CacheError::Io {
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        let mut cache = LogitCache {
            path: path.to_path_buf(),
            teacher: teacher.to_string(),
            classes,
            top_k,
            map: HashMap::new(),
            added: 0,
        };
        let file = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(cache),
            Err(e) => return Err(io(e)),
        };
        let mut r = std::io::BufReader::new(file);
        let mut line = String::new();
        r.read_line(&mut line).map_err(io)?;
        let header: CacheHeader = serde_json::from_str(&line).map_err(|e| CacheError::Io {
            path: path.to_path_buf(),
            message: format!("not a teacher-logit cache ({e})"),
        })?;
        if header.format != CACHE_FORMAT {
            return Err(CacheError::Io {
                path: path.to_path_buf(),
                message: format!("format {:?}, expected {CACHE_FORMAT:?}", header.format),
            });
        }
        if header.teacher != teacher || header.classes != classes || header.top_k != top_k {
            return Err(CacheError::Stale {
                path: path.to_path_buf(),
                cached: header.teacher,
                cached_layout: layout(header.classes, header.top_k),
                current: teacher.to_string(),
                layout: layout(classes, top_k),
            });
        }
        let f16s = |b: &[u8]| -> Vec<f16> {
            b.chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]))
                .collect()
        };
        let mut entry = vec![0u8; cache.entry_bytes()];
        for _ in 0..header.entries {
            r.read_exact(&mut entry).map_err(|e| CacheError::Io {
                path: path.to_path_buf(),
                message: format!("truncated ({e})"),
            })?;
            let key = u64::from_le_bytes(entry[..8].try_into().expect("8 bytes"));
            let e = match top_k {
                None => Entry {
                    idx: Vec::new(),
                    val: f16s(&entry[8..]),
                    fill: f16::ZERO,
                },
                Some(k) => {
                    let idx: Vec<u32> = entry[8..8 + 4 * k]
                        .chunks_exact(4)
                        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
                        .collect();
                    if let Some(bad) = idx.iter().find(|&&i| i as usize >= classes) {
                        return Err(CacheError::Io {
                            path: path.to_path_buf(),
                            message: format!("corrupt: class index {bad} of {classes} classes"),
                        });
                    }
                    let vals = f16s(&entry[8 + 4 * k..]);
                    Entry {
                        idx,
                        fill: vals[k],
                        val: vals[..k].to_vec(),
                    }
                }
            };
            cache.map.insert(key, e);
        }
        Ok(cache)
    }

    /// Bytes of one row in the file: key, then the logits (dense) or the top-k indices,
    /// their logits and the fill value.
    fn entry_bytes(&self) -> usize {
        8 + match self.top_k {
            None => 2 * self.classes,
            Some(k) => 6 * k + 2,
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `[keys.len(), classes]` logits when every key is held.
    pub fn get(&self, keys: &[u64]) -> Result<Option<Tensor>> {
        let mut out = Vec::with_capacity(keys.len() * self.classes);
        for k in keys {
            let Some(e) = self.map.get(k) else {
                return Ok(None);
            };
            if e.idx.is_empty() {
                out.extend(e.val.iter().map(|x| x.to_f32()));
            } else {
                let row = out.len();
                out.resize(row + self.classes, e.fill.to_f32());
                for (&i, v) in e.idx.iter().zip(&e.val) {
                    out[row + i as usize] = v.to_f32();
                }
            }
        }
        Tensor::from_vec(out, (keys.len(), self.classes), &candle_core::Device::Cpu).map(Some)
    }

    /// Stores `[keys.len(), classes]` logits.
    pub fn insert(&mut self, keys: &[u64], logits: &Tensor) -> Result<()> {
        let rows = logits.to_dtype(candle_core::DType::F32)?.to_vec2::<f32>()?;
        for (k, row) in keys.iter().zip(rows) {
            if row.len() != self.classes {
                candle_core::bail!(
                    "teacher logits have {} classes, the cache {}",
                    row.len(),
                    self.classes
                )
            }
            let e = match self.top_k {
                None => Entry {
                    idx: Vec::new(),
                    val: row.into_iter().map(f16::from_f32).collect(),
                    fill: f16::ZERO,
                },
                Some(k) => {
                    let mut order: Vec<usize> = (0..row.len()).collect();
                    order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
                    let rest = &order[k..];
                    let max = rest.iter().map(|&i| row[i]).fold(f32::NEG_INFINITY, f32::max);
                    let sum: f64 = rest.iter().map(|&i| ((row[i] - max) as f64).exp()).sum();
                    let fill = max as f64 + sum.ln() - (rest.len() as f64).ln();
                    Entry {
                        idx: order[..k].iter().map(|&i| i as u32).collect(),
                        val: order[..k].iter().map(|&i| f16::from_f32(row[i])).collect(),
                        fill: f16::from_f64(fill),
                    }
                }
            };
            if self.map.insert(*k, e).is_none() {
                self.added += 1;
            }
        }
        Ok(())
    }

    /// Writes the file atomically (temporary file, fsync, rename) if anything was added.
    pub fn save(&mut self) -> std::result::Result<(), CacheError> {
        if self.added == 0 && self.path.exists() {
            return Ok(());
        }
        let io = |e: std::io::Error| CacheError::Io {
            path: self.path.clone(),
            message: e.to_string(),
        };
        let dir = self
            .path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(io)?;
        let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
        #[cfg(unix)]
        {
            // NamedTempFile is private (0600); the cache is an ordinary, shareable file.
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::Permissions::from_mode(0o644);
            tmp.as_file().set_permissions(mode).map_err(io)?;
        }
        {
            let mut w = std::io::BufWriter::new(tmp.as_file_mut());
            let header = CacheHeader {
                format: CACHE_FORMAT.into(),
                teacher: self.teacher.clone(),
                classes: self.classes,
                top_k: self.top_k,
                entries: self.map.len(),
            };
            writeln!(w, "{}", serde_json::to_string(&header).expect("header")).map_err(io)?;
            let mut keys: Vec<&u64> = self.map.keys().collect();
            keys.sort_unstable();
            for k in keys {
                w.write_all(&k.to_le_bytes()).map_err(io)?;
                let e = &self.map[k];
                for i in &e.idx {
                    w.write_all(&i.to_le_bytes()).map_err(io)?;
                }
                for x in &e.val {
                    w.write_all(&x.to_le_bytes()).map_err(io)?;
                }
                if self.top_k.is_some() {
                    w.write_all(&e.fill.to_le_bytes()).map_err(io)?;
                }
            }
            w.flush().map_err(io)?;
        }
        tmp.as_file().sync_all().map_err(io)?;
        tmp.persist(&self.path).map_err(|e| io(e.error))?;
        self.added = 0;
        Ok(())
    }
}

/// A student trained on a frozen teacher's logits.
pub struct Distill<S, T> {
    /// The model being trained.
    pub student: S,
    /// The frozen model whose logits are the targets.
    pub teacher: T,
    /// The loss.
    pub loss: KdLoss,
    /// Cached mode: teacher logits by example content.
    pub cache: Option<Mutex<LogitCache>>,
    /// Teacher forward passes run (batches), for the report.
    pub teacher_batches: AtomicU64,
    /// Batches answered from the cache.
    pub cached_batches: AtomicU64,
    /// Hidden-state matching (online mode only).
    pub hidden: Option<HiddenMatch>,
}

impl<S, T> Distill<S, T>
where
    S: TrainStep,
    S::Batch: RowKeys,
    T: TrainStep<Batch = S::Batch>,
{
    /// A distillation step; `cache` switches cached mode on.
    pub fn new(student: S, teacher: T, loss: KdLoss, cache: Option<LogitCache>) -> Self {
        Distill {
            student,
            teacher,
            loss,
            cache: cache.map(Mutex::new),
            teacher_batches: AtomicU64::new(0),
            cached_batches: AtomicU64::new(0),
            hidden: None,
        }
    }

    /// Adds hidden-state matching: the teacher then runs on every batch (no cache).
    pub fn with_hidden(mut self, hidden: HiddenMatch) -> Self {
        self.hidden = Some(hidden);
        self
    }

    /// The teacher's logits for `batch` (detached): from the cache when every row is
    /// there, else by running the teacher in evaluation mode (and storing the result).
    pub fn teacher_logits(&self, batch: &S::Batch) -> Result<Tensor> {
        let Some(cache) = &self.cache else {
            self.teacher_batches.fetch_add(1, Ordering::Relaxed);
            let _layer = trident_nn::trace::layer(|| "teacher".into());
            return Ok(self.teacher.forward(batch, &Ctx::eval())?.logits()?.detach());
        };
        let keys = batch.row_keys()?;
        if let Some(t) = cache.lock().expect("cache lock").get(&keys)? {
            self.cached_batches.fetch_add(1, Ordering::Relaxed);
            return Ok(t);
        }
        self.teacher_batches.fetch_add(1, Ordering::Relaxed);
        let logits = {
            let _layer = trident_nn::trace::layer(|| "teacher".into());
            self.teacher.forward(batch, &Ctx::eval())?.logits()?.detach()
        };
        let mut c = cache.lock().expect("cache lock");
        c.insert(&keys, &logits)?;
        // The loss sees what later epochs will read back: the f16-rounded values.
        Ok(c.get(&keys)?.unwrap_or(logits))
    }

    /// Writes the cache file (cached mode), atomically.
    pub fn save_cache(&self) -> std::result::Result<(), CacheError> {
        match &self.cache {
            Some(c) => c.lock().expect("cache lock").save(),
            None => Ok(()),
        }
    }
}

impl<S, T> Distill<S, T>
where
    S: TrainStep,
    S::Batch: RowKeys,
    T: TrainStep<Batch = S::Batch>,
{
    /// A training step with hidden-state matching: both models return their states.
    fn forward_matching(&self, h: &HiddenMatch, batch: &S::Batch, ctx: &Ctx) -> Result<StepOutput> {
        if self.cache.is_some() {
            candle_core::bail!("hidden-state matching runs the teacher online; it has no cached mode")
        }
        let missing = |who: &str| candle_core::Error::Msg(format!("the {who} has no hidden states to match"));
        let (out, hs) = self
            .student
            .forward_hidden(batch, ctx)?
            .ok_or_else(|| missing("student"))?;
        let (tout, ht) = {
            let _layer = trident_nn::trace::layer(|| "teacher".into());
            self.teacher
                .forward_hidden(batch, &Ctx::eval())?
                .ok_or_else(|| missing("teacher"))?
        };
        self.teacher_batches.fetch_add(1, Ordering::Relaxed);
        let logits = out.logits()?;
        let labels = Tensor::from_iter(out.labels.iter().map(|&l| l as u32), logits.device())?;
        let mut loss = self.loss.compute(logits, &tout.logits()?.detach(), &labels)?;
        let scale = h.weight / h.pairs.len().max(1) as f64;
        for &[s, t] in &h.pairs {
            let state = |hs: &HiddenStates, i: usize, who: &str| {
                hs.states.get(i).cloned().ok_or_else(|| {
                    candle_core::Error::Msg(format!(
                        "distill.hidden: the {who} has states 0..={}, not {i}",
                        hs.states.len() - 1
                    ))
                })
            };
            let mse = hidden_mse(&state(&hs, s, "student")?, &state(&ht, t, "teacher")?, &hs.mask)?;
            loss = (loss + mse.affine(scale, 0.0)?)?;
        }
        Ok(StepOutput { loss, ..out })
    }
}

impl<S, T> TrainStep for Distill<S, T>
where
    S: TrainStep,
    S::Batch: RowKeys,
    T: TrainStep<Batch = S::Batch>,
{
    type Batch = S::Batch;

    fn forward(&self, batch: &Self::Batch, ctx: &Ctx) -> Result<StepOutput> {
        if let (Some(h), true) = (&self.hidden, ctx.train) {
            return self.forward_matching(h, batch, ctx);
        }
        let out = self.student.forward(batch, ctx)?;
        if !ctx.train {
            // Evaluation reports the student's own loss on the true labels.
            return Ok(out);
        }
        let teacher = self.teacher_logits(batch)?;
        let logits = out.logits()?;
        let labels = Tensor::from_iter(out.labels.iter().map(|&l| l as u32), logits.device())?;
        Ok(StepOutput {
            loss: self.loss.compute(logits, &teacher, &labels)?,
            ..out
        })
    }

    fn params(&self) -> &Params {
        self.student.params()
    }

    /// Evaluation reports the student alone (see `forward`): the student's evaluator.
    fn evaluator(&self) -> Result<Option<Box<dyn TrainStep<Batch = Self::Batch>>>> {
        self.student.evaluator()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn the_cache_round_trips_and_refuses_another_teacher() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/logits.bin");
        let mut c = LogitCache::open(&path, "crc32c:1:2", 3, None).unwrap();
        assert!(c.is_empty());
        let logits = Tensor::new(&[[1.0f32, -2.5, 3.25], [0.1, 0.2, 70000.0]], &Device::Cpu).unwrap();
        c.insert(&[7, 9], &logits).unwrap();
        assert!(c.get(&[7, 8]).unwrap().is_none(), "a missing key misses");
        c.save().unwrap();

        let back = LogitCache::open(&path, "crc32c:1:2", 3, None).unwrap();
        assert_eq!(back.len(), 2);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o644, "the cache is readable by others, like any output");
        }
        let got = back.get(&[9, 7]).unwrap().unwrap().to_vec2::<f32>().unwrap();
        // f16: exact for these values but 0.1/0.2 (rounded) and 70000 (beyond f16: inf).
        assert_eq!(got[1], vec![1.0, -2.5, 3.25]);
        assert!((got[0][0] - 0.1).abs() < 1e-4 && (got[0][1] - 0.2).abs() < 1e-4);
        assert!(got[0][2].is_infinite());

        let stale = LogitCache::open(&path, "crc32c:ff:2", 3, None)
            .err()
            .unwrap()
            .to_string();
        assert!(
            stale.contains("stale") && stale.contains("crc32c:1:2") && stale.contains("crc32c:ff:2"),
            "{stale}"
        );
        let classes = LogitCache::open(&path, "crc32c:1:2", 4, None)
            .err()
            .unwrap()
            .to_string();
        assert!(
            classes.contains("3 classes") && classes.contains("4 classes"),
            "{classes}"
        );

        // A truncated file is an error, not a smaller cache.
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        let e = LogitCache::open(&path, "crc32c:1:2", 3, None)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("truncated"), "{e}");
        std::fs::write(&path, b"hello\n").unwrap();
        let e = LogitCache::open(&path, "crc32c:1:2", 3, None)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("not a teacher-logit cache"), "{e}");
    }

    #[test]
    fn top_k_storage_keeps_the_top_probabilities_and_the_mass_of_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let (classes, k) = (50, 5);
        let row: Vec<f32> = (0..classes)
            .map(|i| ((i * 37 % 50) as f32 - 25.0) / 6.0)
            .collect();
        let logits = Tensor::from_vec(row.clone(), (1, classes), &Device::Cpu).unwrap();
        let softmax = |z: &[f32]| -> Vec<f64> {
            let m = z.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f64> = z.iter().map(|v| ((v - m) as f64).exp()).collect();
            let s: f64 = e.iter().sum();
            e.iter().map(|v| v / s).collect()
        };
        let p = softmax(&row);
        let mut order: Vec<usize> = (0..classes).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));

        let path = dir.path().join("top.bin");
        let mut c = LogitCache::open(&path, "t", classes, Some(k)).unwrap();
        c.insert(&[1], &logits).unwrap();
        c.save().unwrap();
        let back = LogitCache::open(&path, "t", classes, Some(k)).unwrap();
        let got = back.get(&[1]).unwrap().unwrap().to_vec2::<f32>().unwrap();
        let q = softmax(&got[0]);
        // f16 logits: a relative error of about 1e-3 in each probability.
        for &i in &order[..k] {
            assert!(
                (q[i] - p[i]).abs() < 2e-3 * p[i].max(1e-3),
                "class {i}: {} vs {}",
                q[i],
                p[i]
            );
        }
        let rest = |v: &[f64]| order[k..].iter().map(|&i| v[i]).sum::<f64>();
        assert!((rest(&q) - rest(&p)).abs() < 2e-3, "{} vs {}", rest(&q), rest(&p));
        // The rest share their mass evenly.
        let first = q[order[k]];
        assert!(order[k..].iter().all(|&i| q[i] == first));
        // 8 + 6k + 2 bytes a row instead of 8 + 2·classes.
        let header = std::fs::read(&path)
            .unwrap()
            .iter()
            .position(|&b| b == b'\n')
            .unwrap()
            + 1;
        assert_eq!(
            std::fs::metadata(&path).unwrap().len() as usize,
            header + 8 + 6 * k + 2
        );

        // Another k, or none, is another cache; k must be below the class count.
        let e = LogitCache::open(&path, "t", classes, Some(10))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("50 classes, top 5") && e.contains("50 classes, top 10"),
            "{e}"
        );
        let e = LogitCache::open(&path, "t", classes, None)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("stale"), "{e}");
        let e = LogitCache::open(&dir.path().join("x"), "t", 4, Some(4))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("0 < k < 4"), "{e}");
    }

    /// Fixed logits and hidden states, whatever the batch.
    struct Fixed {
        logits: Tensor,
        states: Vec<Tensor>,
        params: Params,
    }

    struct Rows(usize);

    impl RowKeys for Rows {
        fn row_keys(&self) -> Result<Vec<u64>> {
            Ok((0..self.0 as u64).collect())
        }
    }

    impl TrainStep for Fixed {
        type Batch = Rows;
        fn forward(&self, b: &Rows, _: &Ctx) -> Result<StepOutput> {
            Ok(StepOutput::classified(
                Tensor::new(0f32, &Device::Cpu)?,
                self.logits.clone(),
                vec![0; b.0],
            ))
        }
        fn params(&self) -> &Params {
            &self.params
        }
        fn forward_hidden(&self, b: &Rows, ctx: &Ctx) -> Result<Option<(StepOutput, HiddenStates)>> {
            let mask = Tensor::new(&[[1f32, 1.0, 0.0], [1.0, 0.0, 0.0]], &Device::Cpu)?;
            let states = self.states.clone();
            Ok(Some((self.forward(b, ctx)?, HiddenStates { states, mask })))
        }
    }

    #[test]
    fn hidden_matching_adds_the_weighted_mean_of_the_mapped_pairs() {
        let dev = Device::Cpu;
        let state = |v: f32| Tensor::full(v, (2, 3, 4), &dev).unwrap();
        let logits = Tensor::new(&[[1f32, 0.0], [0.0, 2.0]], &dev).unwrap();
        let fixed = |states| Fixed {
            logits: logits.clone(),
            states,
            params: Params::new(),
        };
        let loss = KdLoss::Hard {};
        let plain = loss
            .compute(&logits, &logits, &Tensor::new(&[0u32, 0], &dev).unwrap())
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        // Student states 0 and 1 are 1 and 3; the teacher's 0, 1, 2 are 0, 0 and 2.
        let d = Distill::new(
            fixed(vec![state(1.0), state(3.0)]),
            fixed(vec![state(0.0), state(0.0), state(2.0)]),
            loss,
            None,
        )
        .with_hidden(HiddenMatch {
            pairs: vec![[0, 0], [1, 2]],
            weight: 2.0,
        });
        let got = d
            .forward(&Rows(2), &Ctx::train(0, 0))
            .unwrap()
            .loss
            .to_scalar::<f32>()
            .unwrap();
        // MSEs 1 and 1 (padding ignored), mean 1, weight 2.
        assert!((got - (plain + 2.0)).abs() < 1e-6, "{got} vs {plain} + 2");
        assert_eq!(d.teacher_batches.load(Ordering::Relaxed), 1);
        // Evaluation is the student alone.
        let eval = d
            .forward(&Rows(2), &Ctx::eval())
            .unwrap()
            .loss
            .to_scalar::<f32>()
            .unwrap();
        assert_eq!(eval, 0.0);
        // A state out of range is named.
        let bad = Distill::new(fixed(vec![state(1.0)]), fixed(vec![state(0.0)]), loss, None).with_hidden(
            HiddenMatch {
                pairs: vec![[0, 3]],
                weight: 1.0,
            },
        );
        let e = bad
            .forward(&Rows(2), &Ctx::train(0, 0))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("teacher has states 0..=0, not 3"), "{e}");
    }

    #[test]
    fn fnv1a_is_the_reference_hash() {
        // Test vectors of FNV-1a 64 (Fowler, Noll, Vo).
        assert_eq!(fnv1a(b"", FNV_START), 0xcbf29ce484222325);
        assert_eq!(fnv1a(b"a", FNV_START), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a(b"foobar", FNV_START), 0x85944171f73967e8);
    }
}
