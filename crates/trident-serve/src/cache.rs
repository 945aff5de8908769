//! The response cache (Triton's `--cache-config local,size=BYTES` with a model's
//! `response_cache { enable: true }`): successful responses kept by a 128-bit hash of the
//! model name, version and validated inputs (name, data type, shape and bytes — the same key
//! whether a request came as JSON or binary), bounded in bytes, least recently used evicted
//! first. One cache is shared by every model that enables it. A hit answers without
//! queueing or executing; output selection and classification are applied after it, so one
//! entry serves any request for the same inputs.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use trident_core::Tensor;

/// Cached outputs: every output of the model, before selection.
pub type Outputs = Arc<Vec<(String, Tensor)>>;

/// A byte-bounded LRU cache of responses.
pub struct ResponseCache {
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<u128, Entry>,
    /// Last use → key, oldest first.
    order: BTreeMap<u64, u128>,
    tick: u64,
    used: usize,
}

struct Entry {
    outputs: Outputs,
    size: usize,
    tick: u64,
}

/// Per-entry bookkeeping counted against the capacity besides the tensors' bytes.
const ENTRY_OVERHEAD: usize = 128;

impl std::fmt::Debug for ResponseCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (entries, used) = self.usage();
        write!(
            f,
            "ResponseCache({entries} entries, {used} of {} bytes)",
            self.capacity
        )
    }
}

impl ResponseCache {
    /// A cache holding at most `capacity` bytes.
    pub fn new(capacity: usize) -> Self {
        ResponseCache {
            capacity,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Reads Triton's `--cache-config` value: `local,size=BYTES` (the only cache
    /// implementation Trident has). The error names what was wrong.
    pub fn from_config(spec: &str) -> Result<Self, crate::ConfigError> {
        let bad = |why: String| crate::ConfigError::new("--cache-config", why);
        let (kind, rest) = spec.split_once(',').unwrap_or((spec, ""));
        if kind.trim() != "local" {
            return Err(bad(format!(
                "--cache-config `{spec}`: the cache implementation must be `local` (`local,size=BYTES`)"
            )));
        }
        let mut size = None;
        for setting in rest.split(',').filter(|s| !s.trim().is_empty()) {
            match setting.split_once('=') {
                Some(("size", v)) => {
                    size = Some(v.trim().parse::<usize>().map_err(|_| {
                        bad(format!(
                            "--cache-config `{spec}`: size `{v}` is not a number of bytes"
                        ))
                    })?)
                }
                _ => {
                    return Err(bad(format!(
                        "--cache-config `{spec}`: unknown setting `{setting}` (expected size=BYTES)"
                    )))
                }
            }
        }
        match size {
            Some(0) | None => Err(bad(format!(
                "--cache-config `{spec}`: needs size=BYTES, more than 0"
            ))),
            Some(n) => Ok(Self::new(n)),
        }
    }

    /// The capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Entries and bytes held now.
    pub fn usage(&self) -> (usize, usize) {
        let inner = self.inner.lock().expect("cache lock");
        (inner.entries.len(), inner.used)
    }

    /// The key of a request: model, version and inputs in the model's order.
    pub fn key(model: &str, version: i64, inputs: &[(String, Tensor)]) -> u128 {
        let half = |seed: u64| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            seed.hash(&mut h);
            model.hash(&mut h);
            version.hash(&mut h);
            inputs.len().hash(&mut h);
            for (name, t) in inputs {
                name.hash(&mut h);
                t.dtype().as_str().hash(&mut h);
                t.shape().hash(&mut h);
                t.data().as_ref().hash(&mut h);
            }
            h.finish()
        };
        (u128::from(half(0x5eed_0001)) << 64) | u128::from(half(0x5eed_0002))
    }

    /// The outputs cached under `key`, marked as just used.
    pub fn get(&self, key: u128) -> Option<Outputs> {
        let mut guard = self.inner.lock().expect("cache lock");
        let inner = &mut *guard;
        inner.tick += 1;
        let tick = inner.tick;
        let entry = inner.entries.get_mut(&key)?;
        inner.order.remove(&entry.tick);
        entry.tick = tick;
        inner.order.insert(tick, key);
        Some(entry.outputs.clone())
    }

    /// Caches `outputs` under `key`, evicting the least recently used entries to fit; an
    /// answer larger than the whole cache is not kept.
    pub fn insert(&self, key: u128, outputs: Outputs) {
        let size = ENTRY_OVERHEAD
            + outputs
                .iter()
                .map(|(n, t)| n.len() + t.data().len() + 8 * t.shape().len())
                .sum::<usize>();
        if size > self.capacity {
            return;
        }
        let mut guard = self.inner.lock().expect("cache lock");
        let inner = &mut *guard;
        if let Some(old) = inner.entries.remove(&key) {
            inner.order.remove(&old.tick);
            inner.used -= old.size;
        }
        while inner.used + size > self.capacity {
            let Some((_, oldest)) = inner.order.pop_first() else {
                break;
            };
            if let Some(e) = inner.entries.remove(&oldest) {
                inner.used -= e.size;
            }
        }
        inner.tick += 1;
        let tick = inner.tick;
        inner.order.insert(tick, key);
        inner.used += size;
        inner.entries.insert(key, Entry { outputs, size, tick });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(v: f32, n: usize) -> Outputs {
        Arc::new(vec![(
            "y".into(),
            Tensor::from_f32(vec![n as i64], &vec![v; n]).unwrap(),
        )])
    }

    fn input(v: f32) -> Vec<(String, Tensor)> {
        vec![("x".into(), Tensor::from_f32(vec![1], &[v]).unwrap())]
    }

    #[test]
    fn keys_depend_on_model_version_and_every_input_detail() {
        let k = ResponseCache::key("m", 1, &input(1.0));
        assert_eq!(k, ResponseCache::key("m", 1, &input(1.0)));
        assert_ne!(k, ResponseCache::key("m", 2, &input(1.0)));
        assert_ne!(k, ResponseCache::key("n", 1, &input(1.0)));
        assert_ne!(k, ResponseCache::key("m", 1, &input(2.0)));
        let reshaped = vec![("x".to_string(), Tensor::from_f32(vec![1, 1], &[1.0]).unwrap())];
        assert_ne!(
            k,
            ResponseCache::key("m", 1, &reshaped),
            "the shape is part of the key"
        );
        let int = vec![("x".to_string(), Tensor::from_i64(vec![1], &[0]).unwrap())];
        let float = vec![("x".to_string(), Tensor::from_f32(vec![2], &[0.0, 0.0]).unwrap())];
        assert_ne!(
            ResponseCache::key("m", 1, &int),
            ResponseCache::key("m", 1, &float),
            "same bytes, other type"
        );
    }

    #[test]
    fn evicts_least_recently_used_within_the_byte_bound() {
        let entry = ENTRY_OVERHEAD + 1 + 4 * 10 + 8;
        let c = ResponseCache::new(2 * entry);
        c.insert(1, out(1.0, 10));
        c.insert(2, out(2.0, 10));
        assert!(c.get(1).is_some()); // 1 is now the most recent
        c.insert(3, out(3.0, 10)); // evicts 2
        assert!(c.get(2).is_none());
        assert_eq!(c.get(1).unwrap()[0].1.to_f32().unwrap()[0], 1.0);
        assert!(c.get(3).is_some());
        assert_eq!(c.usage(), (2, 2 * entry));
        c.insert(4, out(4.0, 10_000)); // larger than the cache: not kept, nothing evicted
        assert_eq!(c.usage(), (2, 2 * entry));
    }

    #[test]
    fn parses_triton_cache_config() {
        assert_eq!(
            ResponseCache::from_config("local,size=1048576")
                .unwrap()
                .capacity(),
            1 << 20
        );
        for bad in [
            "redis,size=10",
            "local",
            "local,size=abc",
            "local,size=0",
            "local,cap=5",
        ] {
            assert!(ResponseCache::from_config(bad).is_err(), "{bad}");
        }
    }
}
