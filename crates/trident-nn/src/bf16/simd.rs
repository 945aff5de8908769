use super::round;
use std::mem::MaybeUninit;

#[cfg(target_arch = "x86_64")]
pub(super) fn has_avx512_bf16() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    })
}

/// `dst[i] = round(src[i])`, every element of `dst` written.
pub(super) fn round_slice(src: &[f32], dst: &mut [MaybeUninit<u16>]) {
    assert_eq!(src.len(), dst.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx512_bf16() {
        // SAFETY: the CPU has the features the function is compiled for.
        return unsafe { x86::round_slice(src, dst) };
    }
    round_vectorised(src, dst)
}

#[inline(always)]
fn round_portable(src: &[f32], dst: &mut [MaybeUninit<u16>]) {
    dst.iter_mut().zip(src).for_each(|(d, &s)| {
        d.write(round(s));
    });
}

crate::math::dispatch!(
    /// The portable loop, compiled for AVX2 (8 lanes; the baseline build vectorises it
    /// 4 wide) where the CPU has it: where there is no AVX512-BF16 this rounding is all
    /// bf16 costs.
    round_vectorised, round_avx2, (src: &[f32], dst: &mut [MaybeUninit<u16>]) -> (), round_portable
);

/// `dst[i] = round(lo[i]) | round(hi[i]) << 16`: the pairs AMX's right operand holds.
pub(super) fn pair_slices(lo: &[f32], hi: &[f32], dst: &mut [u32]) {
    assert!(lo.len() == dst.len() && hi.len() == dst.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx512_bf16() {
        // SAFETY: as above.
        return unsafe { x86::pair_slices(lo, hi, dst) };
    }
    dst.iter_mut()
        .zip(lo.iter().zip(hi))
        .for_each(|(d, (&l, &h))| *d = round(l) as u32 | (round(h) as u32) << 16);
}

/// [`pair_slices`] for pair rows `0..pairs` of a whole 32-column panel (the rows of
/// `data` `ld` apart, from column `c0`) into `dst`, the panel: strip `s` of pair row
/// `i` at `(s · kp/2 + i) · 16`. Returns the pair rows written: all of them where the
/// CPU has AVX512-BF16, else none.
pub(super) fn pair_panel(
    data: &[f32],
    ld: usize,
    c0: usize,
    pairs: usize,
    kp: usize,
    dst: &mut [u32],
) -> usize {
    #[cfg(target_arch = "x86_64")]
    if has_avx512_bf16() && pairs > 0 {
        assert!(pairs <= kp / 2 && dst.len() >= kp * 16);
        assert!(data.len() >= (2 * pairs - 1) * ld + c0 + 32);
        // SAFETY: the features are there; every load and store lies inside the slices
        // (asserted above).
        unsafe { x86::pair_panel(data, ld, c0, pairs, kp, dst) };
        return pairs;
    }
    let _ = (data, ld, c0, pairs, kp, dst);
    0
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    /// Sixteen pairs of bf16 bits as words, `lo` in each word's low half: the pairs
    /// the packed right operand holds ([`super::super::amx`]).
    ///
    /// SAFETY: the CPU has AVX512F and AVX512BW.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(in crate::bf16) unsafe fn pair_words(lo: __m256i, hi: __m256i) -> __m512i {
        _mm512_or_si512(
            _mm512_cvtepu16_epi32(lo),
            _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(hi)),
        )
    }

    /// The first `n` (at most 16) of sixteen f32 from `lo` and from `hi`, rounded to
    /// bf16 and paired ([`pair_words`]) into `dst`; the lanes past `n` are neither read
    /// nor written.
    ///
    /// SAFETY: as `round_slice`; `n` values readable at `lo` and `hi`, writable at `dst`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn pair16(lo: *const f32, hi: *const f32, dst: *mut u32, n: usize) {
        let mask = mask16(n);
        let l: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, lo)));
        let h: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, hi)));
        _mm512_mask_storeu_epi32(dst.cast(), mask, pair_words(l, h));
    }

    /// SAFETY: the CPU has AVX512F, AVX512BW and AVX512-BF16; equal lengths.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn round_slice(src: &[f32], dst: &mut [MaybeUninit<u16>]) {
        assert_eq!(src.len(), dst.len());
        for i in (0..src.len()).step_by(32) {
            // The last 1–31 values through masks (short rows, as a convolution's
            // 14-wide ones, would otherwise be all tail).
            let left = (src.len() - i).min(32);
            let (lo_mask, hi_mask) = (mask16(left), mask16(left.saturating_sub(16)));
            let lo = _mm512_maskz_loadu_ps(lo_mask, src.as_ptr().add(i));
            let hi = _mm512_maskz_loadu_ps(hi_mask, src.as_ptr().add(i + 16));
            let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
            let mask = (u32::from(hi_mask) << 16) | u32::from(lo_mask);
            _mm512_mask_storeu_epi16(dst.as_mut_ptr().add(i).cast(), mask, v);
        }
    }

    /// The first `n` of 16 lanes (`n` at most 16).
    #[inline]
    fn mask16(n: usize) -> __mmask16 {
        ((1u32 << n.min(16)) - 1) as __mmask16
    }

    /// SAFETY: as `round_slice`; the panel's rows and strips inside `data` and `dst`
    /// (checked by `super::pair_panel`).
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn pair_panel(
        data: &[f32],
        ld: usize,
        c0: usize,
        pairs: usize,
        kp: usize,
        dst: &mut [u32],
    ) {
        let src = data.as_ptr().add(c0);
        for i in 0..pairs {
            let (lo, hi) = (src.add(2 * i * ld), src.add((2 * i + 1) * ld));
            for s in 0..2 {
                pair16(
                    lo.add(16 * s),
                    hi.add(16 * s),
                    dst.as_mut_ptr().add((s * (kp / 2) + i) * 16),
                    16,
                );
            }
        }
    }

    /// SAFETY: as `round_slice`.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn pair_slices(lo: &[f32], hi: &[f32], dst: &mut [u32]) {
        // The last 1–15 through the mask.
        for i in (0..dst.len()).step_by(16) {
            let n = (dst.len() - i).min(16);
            pair16(lo.as_ptr().add(i), hi.as_ptr().add(i), dst.as_mut_ptr().add(i), n);
        }
    }
}
