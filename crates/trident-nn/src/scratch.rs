//! Recycled f32 buffers for the fused training ops.
//!
//! A training step allocates the same large intermediates every step (MiniLM: 21 MB per
//! encoder layer kept for the backward pass, as much again in temporaries). Fresh
//! `vec![0.0; n]` buffers are zero-filled by one thread before the kernels overwrite them
//! (5 % of a step's samples were `memset`); buffers taken from here are reused as they
//! are. Only kernels that overwrite every value take from here.

use std::sync::Mutex;

/// Buffers smaller than this are not worth keeping.
const MIN_LEN: usize = 1 << 14;
/// At most this many bytes are kept.
const MAX_BYTES: usize = 1 << 30;

static POOL: Mutex<Vec<Vec<f32>>> = Mutex::new(Vec::new());

/// A buffer of `len` values with unspecified contents (left from an earlier use, or
/// zero): the caller must overwrite every value before reading any.
pub(crate) fn take(len: usize) -> Vec<f32> {
    if len >= MIN_LEN {
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = pool.iter().position(|v| v.len() == len) {
            return pool.swap_remove(i);
        }
    }
    vec![0.0; len]
}

/// Returns a buffer for reuse.
pub(crate) fn give(v: Vec<f32>) {
    if v.len() < MIN_LEN {
        return;
    }
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    let held: usize = pool.iter().map(|v| v.len() * 4).sum();
    if held + v.len() * 4 <= MAX_BYTES {
        pool.push(v);
    }
}

/// Fills every pooled buffer with NaN, so that a test sees any value a kernel failed to
/// overwrite.
#[cfg(test)]
pub(crate) fn poison() {
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    pool.iter_mut().for_each(|v| v.fill(f32::NAN));
}

#[cfg(test)]
mod tests {
    #[test]
    fn buffers_are_reused_by_length() {
        // A length no kernel uses, so that parallel tests cannot take this buffer.
        let len = super::MIN_LEN + 12_345;
        let mut a = super::take(len);
        a[0] = 7.0;
        let ptr = a.as_ptr();
        super::give(a);
        let b = super::take(len);
        assert_eq!((b.as_ptr(), b[0]), (ptr, 7.0));
        // Small buffers are plain allocations.
        assert_eq!(super::take(10), vec![0.0; 10]);
    }
}
