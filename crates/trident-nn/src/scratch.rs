//! Recycled f32 buffers for the fused training ops.
//!
//! A training step allocates the same large intermediates every step (MiniLM: 21 MB per
//! encoder layer kept for the backward pass, as much again in temporaries). Fresh
//! `vec![0.0; n]` buffers are zero-filled by one thread before the kernels overwrite them
//! (5 % of a step's samples were `memset`); buffers taken from here are reused as they
//! are. Only kernels that overwrite every value take from here.

use std::mem::MaybeUninit;
use std::sync::Mutex;

/// Buffers smaller than this are not worth keeping.
const MIN_LEN: usize = 1 << 14;
/// At most this many bytes are kept.
const MAX_BYTES: usize = 1 << 30;

static POOL: Mutex<Vec<Vec<f32>>> = Mutex::new(Vec::new());

/// A buffer of `len` values with unspecified contents (left from an earlier use, or
/// zero): the caller must overwrite every value before reading any.
///
/// The smallest pooled buffer that holds `len` values, and is at most twice as large, is
/// reused (cut to `len`): batches of text vary in length, and reusing only exact lengths
/// filled the pool with buffers of lengths that never came back (the heap grew by about
/// 15 MiB a step on the MiniLM fine-tune).
pub(crate) fn take(len: usize) -> Vec<f32> {
    if len >= MIN_LEN {
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        let best = pool
            .iter()
            .enumerate()
            .filter(|(_, v)| v.len() >= len && v.len() <= 2 * len)
            .min_by_key(|(_, v)| v.len())
            .map(|(i, _)| i);
        if let Some(i) = best {
            let mut v = pool.swap_remove(i);
            v.truncate(len);
            return v;
        }
    }
    vec![0.0; len]
}

/// A new vector of `len` values, each written by `write`, without zero-filling it first.
///
/// An op's output goes to candle and is freed there, so it cannot come from the pool; and
/// `vec![0.0; len]` on memory the heap has had before is a `memset`, a whole pass over the
/// output before the kernel's own (4.5 % of a DCGAN epoch's samples and 5.4 % of the
/// Fashion CNN step's on an AMD EPYC Zen 4, 2026-12-06). `write` gets the values as
/// [`MaybeUninit`] and must write every one; in debug builds (the tests) they hold NaN
/// before it runs, so a value a kernel leaves unwritten shows as NaN where the tests
/// compare with a reference.
///
/// # Safety
/// `write` must initialise every element of the slice it is given.
pub(crate) unsafe fn written(len: usize, write: impl FnOnce(&mut [MaybeUninit<f32>])) -> Vec<f32> {
    let mut v: Vec<f32> = Vec::with_capacity(len);
    let spare = &mut v.spare_capacity_mut()[..len];
    if cfg!(debug_assertions) {
        spare.fill(MaybeUninit::new(f32::NAN));
    }
    write(spare);
    // SAFETY: the caller's promise: `write` initialised all `len` values.
    unsafe { v.set_len(len) };
    v
}

/// Returns a buffer for reuse, at its full capacity (the part beyond its length is
/// zero-filled, which is all the writing a reused buffer costs).
pub(crate) fn give(mut v: Vec<f32>) {
    let cap = v.capacity();
    if cap < MIN_LEN {
        return;
    }
    v.resize(cap, 0.0);
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    let held: usize = pool.iter().map(|v| v.len() * 4).sum();
    if held + cap * 4 <= MAX_BYTES {
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
    fn written_outputs_hold_what_was_written_and_nan_where_a_test_build_left_a_gap() {
        // SAFETY: every value written.
        let v = unsafe {
            super::written(5, |o| {
                o.iter_mut().enumerate().for_each(|(i, v)| {
                    v.write(i as f32);
                })
            })
        };
        assert_eq!(v, [0.0, 1.0, 2.0, 3.0, 4.0]);
        if cfg!(debug_assertions) {
            // SAFETY: in debug builds `written` initialises every value (NaN) before
            // `write` runs, so leaving one out is not undefined there; it shows as NaN.
            let v = unsafe {
                super::written(3, |o| {
                    o[0].write(1.0);
                })
            };
            assert_eq!(v[0], 1.0);
            assert!(v[1].is_nan() && v[2].is_nan(), "{v:?}");
        }
    }

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
        // A shorter request reuses the smallest buffer that holds it (at most twice its
        // size), cut to length; returned, it is whole again.
        // (Lengths far above what the other unit tests' kernels ask for.)
        let (big, small) = ((1 << 22) + 77, (3 << 20) + 77);
        let c = super::take(big);
        let ptr = c.as_ptr();
        super::give(c);
        let d = super::take(small);
        assert_eq!((d.as_ptr(), d.len()), (ptr, small));
        super::give(d);
        let e = super::take(big);
        assert_eq!((e.as_ptr(), e.len()), (ptr, big));
        // Too large a buffer for the request is left for others.
        super::give(e);
        let f = super::take((1 << 21) - 5);
        assert_ne!(f.as_ptr(), ptr);
        let _ = super::take(big);
    }
}
