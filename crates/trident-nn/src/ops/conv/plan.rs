//! Where each patch row of a convolution reads its input: the copies (runs) of a geometry
//! worked out once, and the phase layout of strided images.

use super::Conv;
use candle_core::{bail, Result};
use std::borrow::Cow;
use std::mem::MaybeUninit;

/// [`Conv::runs`] collected for one geometry `(c, h, w, oh, ow)`, with where each patch
/// row's runs start (`starts[row]..starts[row + 1]`; a row's runs are consecutive).
#[derive(Clone)]
pub(super) struct Plan {
    dims: (usize, usize, usize, usize, usize),
    pub(super) runs: Vec<Run>,
    pub(super) starts: Vec<usize>,
}

impl Plan {
    pub(super) fn new(conv: &Conv, dims: (usize, usize, usize, usize, usize)) -> Plan {
        let (c, h, w, oh, ow) = dims;
        let mut runs = Vec::new();
        conv.runs(c, h, w, oh, ow, |run| runs.push(run));
        let rows = c * conv.k * conv.k;
        let mut starts = Vec::with_capacity(rows + 1);
        let mut at = 0;
        for row in 0..=rows {
            while at < runs.len() && runs[at].row < row {
                at += 1;
            }
            starts.push(at);
        }
        Plan { dims, runs, starts }
    }

    /// The runs of patch row `row`.
    pub(super) fn row(&self, row: usize) -> &[Run] {
        &self.runs[self.starts[row]..self.starts[row + 1]]
    }
}

/// One run of [`Conv::runs`]: output positions `at..at + len` of patch row `row` read
/// the input's phase layout at `from..from + len`, except the run's gaps: in every
/// `period` positions from `at` the first `keep` are inside the image and the rest (up to
/// the run's end) padding.
#[derive(Clone, Copy)]
pub(super) struct Run {
    pub(super) row: usize,
    pub(super) at: usize,
    pub(super) from: usize,
    pub(super) len: usize,
    keep: usize,
    period: usize,
}

/// Zeroes `s`, a padding gap of one or two values written as stores: `fill` on a span of
/// unknown length is a call to `memset`, whose set-up costs more than the value or two a
/// gap holds — and a stride-1 convolution has a gap per output row of each of its
/// left- and right-column taps (memset was 11 % of a conv autoencoder's samples).
#[inline(always)]
pub(super) fn zero_short<T: Copy + Default>(s: &mut [T]) {
    match s {
        [a] => *a = T::default(),
        [a, b] => (*a, *b) = (T::default(), T::default()),
        _ => s.fill(T::default()),
    }
}

/// `dst.copy_from_slice(src)` for the runs of a convolution's patches: up to 64 values (a
/// plane's row, or a 7 × 7 plane) inline in blocks of 16 values rather than a call to
/// `memmove` per run (with the unfolding around them, 13 % of a bf16 GAN critic
/// convolution's samples).
#[inline(always)]
pub(super) fn copy_short<T: Copy>(dst: &mut [T], src: &[T]) {
    let src = &src[..dst.len()];
    if dst.len() > 64 {
        // Longer runs (a 28 × 28 plane's taps) copy faster through `memmove`'s wider loop.
        return dst.copy_from_slice(src);
    }
    let (blocks, tail) = dst.as_chunks_mut::<16>();
    let (from, rest) = src.as_chunks::<16>();
    for (d, s) in blocks.iter_mut().zip(from) {
        *d = *s; // a block of 16 as one value: vector moves
    }
    for (d, s) in tail.iter_mut().zip(rest) {
        *d = *s;
    }
}

impl Run {
    /// The gaps, as ranges of positions from the run's start.
    pub(super) fn gaps(self) -> impl Iterator<Item = std::ops::Range<usize>> {
        let gap = self.period - self.keep;
        (0..if gap == 0 { 0 } else { self.len / self.period })
            .map(move |t| t * self.period + self.keep..(t + 1) * self.period)
    }
}

impl Conv {
    /// `(b, c, h, w, oh, ow)` of an input `[b, c, h, w]`.
    pub(super) fn geometry(&self, dims: &[usize]) -> Result<(usize, usize, usize, usize, usize, usize)> {
        let &[b, c, h, w] = dims else {
            bail!("conv2d: expected [b, c, h, w], got {dims:?}")
        };
        let oh = (h + 2 * self.padding - self.k) / self.stride + 1;
        let ow = (w + 2 * self.padding - self.k) / self.stride + 1;
        Ok((b, c, h, w, oh, ow))
    }

    /// The size `(rows, columns)` of the phase planes an `h × w` input is split into at this
    /// stride (see [`Self::runs`]): `⌈h/s⌉ × ⌈w/s⌉`.
    pub(super) fn phase_plane(&self, h: usize, w: usize) -> (usize, usize) {
        (h.div_ceil(self.stride), w.div_ceil(self.stride))
    }

    /// Calls `f(run)` for every [`Run`] of one tap `(ch, dy, dx)` (row `(ch·k + dy)·k + dx`
    /// of the transposed patches `[c·k·k, oh·ow]`): output positions `at..at + len` of that
    /// row read the input's phase layout at `from..from + len`, but for the run's gaps.
    /// Positions in no run, and in a run's gaps, are zero padding.
    ///
    /// The phase layout of an input `[c, h, w]` at stride `s` splits each channel into `s ×
    /// s` phase planes of [`Self::phase_plane`]'s size, `[c, s, s, ⌈h/s⌉, ⌈w/s⌉]`: input
    /// `(iy, ix)` lies in plane `(iy mod s, ix mod s)` at `(iy / s, ix / s)`, so the inputs a
    /// tap reads along an output row (every `s`-th) lie next to each other; at stride 1 it
    /// is the image itself. Where output rows are as long as phase rows (`ow` equal to the
    /// phase plane's width) one run spans all the output rows a tap reads inside the image,
    /// its gaps the columns that fall in the padding (a 1 × 1 convolution's patches are
    /// one run per channel); otherwise each output row is a run of its own.
    #[inline]
    pub(super) fn runs(&self, c: usize, h: usize, w: usize, oh: usize, ow: usize, mut f: impl FnMut(Run)) {
        let (k, s, p) = (self.k, self.stride, self.padding);
        let (hp, wp) = self.phase_plane(h, w);
        // Output positions whose input i = o·s + d − p lies in 0..n:
        // o ∈ [ceil((p − d)/s), ceil((n + p − d)/s)), at most `outs`.
        let inside = |d: usize, n: usize, outs: usize| {
            let lo = p.saturating_sub(d).div_ceil(s).min(outs);
            let hi = (n + p).saturating_sub(d).div_ceil(s).min(outs).max(lo);
            lo..hi
        };
        // Tap d reads phase r at offset q: o·s + d − p = (o + q)·s + r.
        let phase = |d: usize| {
            let e = d as isize - p as isize;
            (e.rem_euclid(s as isize) as usize, e.div_euclid(s as isize))
        };
        for ch in 0..c {
            for dy in 0..k {
                let ys = inside(dy, h, oh);
                if ys.is_empty() {
                    continue;
                }
                let (ry, qy) = phase(dy);
                for dx in 0..k {
                    let xs = inside(dx, w, ow);
                    if xs.is_empty() {
                        continue;
                    }
                    let (rx, qx) = phase(dx);
                    let row = (ch * k + dy) * k + dx;
                    let plane = ((ch * s + ry) * s + rx) * hp * wp;
                    // Inside the image, y + qy ≥ 0 and xs.start + qx ≥ 0.
                    let input = |y: usize| {
                        plane + (y as isize + qy) as usize * wp + (xs.start as isize + qx) as usize
                    };
                    if ow == wp {
                        f(Run {
                            row,
                            at: ys.start * ow + xs.start,
                            from: input(ys.start),
                            len: (ys.len() - 1) * ow + xs.len(),
                            keep: xs.len(),
                            period: ow,
                        });
                    } else {
                        for y in ys.clone() {
                            f(Run {
                                row,
                                at: y * ow + xs.start,
                                from: input(y),
                                len: xs.len(),
                                keep: xs.len(),
                                period: ow,
                            });
                        }
                    }
                }
            }
        }
    }

    /// The [`Plan`] of the geometry `(c, h, w, oh, ow)`: [`Self::plan`] when that is its
    /// geometry (the first one asked for), else one worked out for this call.
    pub(super) fn plan_for(&self, dims: (usize, usize, usize, usize, usize)) -> Cow<'_, Plan> {
        match self.plan.get_or_init(|| Plan::new(self, dims)) {
            plan if plan.dims == dims => Cow::Borrowed(plan),
            _ => Cow::Owned(Plan::new(self, dims)),
        }
    }

    /// Values of the phase layout of a `[c, h, w]` input ([`Self::runs`]).
    pub(super) fn phase_len(&self, c: usize, h: usize, w: usize) -> usize {
        let (hp, wp) = self.phase_plane(h, w);
        c * self.stride * self.stride * hp * wp
    }

    /// Image `img` (`[c, h, w]`) into its phase layout `ph` ([`Self::runs`]); positions
    /// past the image's edge are left as they were (no run reads them).
    pub(super) fn to_phases<T: Copy>(&self, img: &[T], (c, h, w): (usize, usize, usize), ph: &mut [T]) {
        let s = self.stride;
        let (hp, wp) = self.phase_plane(h, w);
        for (r, src) in img[..c * h * w].chunks(w).enumerate() {
            let (ch, iy) = (r / h, r % h);
            let at = ((ch * s + iy % s) * s) * hp * wp + (iy / s) * wp;
            if s == 2 {
                // The even and odd columns, as pairs: a loop the compiler vectorises (the
                // strided one below was 12 % of a bf16 GAN critic convolution's forward
                // pass).
                let (even, odd) = ph[at..].split_at_mut(hp * wp);
                let (even, odd) = (&mut even[..w / 2], &mut odd[..w / 2]);
                for ((e, o), two) in even.iter_mut().zip(odd).zip(src.chunks_exact(2)) {
                    (*e, *o) = (two[0], two[1]);
                }
                if w % 2 == 1 {
                    ph[at + w / 2] = src[w - 1];
                }
                continue;
            }
            for rx in 0..s {
                let dst = &mut ph[at + rx * hp * wp..][..wp];
                dst.iter_mut()
                    .zip(src[rx..].iter().step_by(s))
                    .for_each(|(d, v)| *d = *v);
            }
        }
    }

    /// Writes the image `d` (`[c, h, w]`, every value) from its phase layout `ph`
    /// ([`Self::runs`]): the inverse of [`Self::to_phases`].
    pub(super) fn phases_to_image(
        &self,
        ph: &[f32],
        (c, h, w): (usize, usize, usize),
        d: &mut [MaybeUninit<f32>],
    ) {
        let s = self.stride;
        let (hp, wp) = self.phase_plane(h, w);
        for (r, dst) in d[..c * h * w].chunks_mut(w).enumerate() {
            let (ch, iy) = (r / h, r % h);
            let at = ((ch * s + iy % s) * s) * hp * wp + (iy / s) * wp;
            if s == 2 {
                // As in `to_phases`: pairs, not a strided loop.
                let (even, odd) = (&ph[at..][..w / 2], &ph[at + hp * wp..][..w / 2]);
                for ((two, &e), &o) in dst.chunks_exact_mut(2).zip(even).zip(odd) {
                    (two[0], two[1]) = (MaybeUninit::new(e), MaybeUninit::new(o));
                }
                if w % 2 == 1 {
                    dst[w - 1] = MaybeUninit::new(ph[at + w / 2]);
                }
                continue;
            }
            for rx in 0..s {
                let src = &ph[at + rx * hp * wp..][..wp];
                dst[rx..]
                    .iter_mut()
                    .step_by(s)
                    .zip(src)
                    .for_each(|(d, v)| *d = MaybeUninit::new(*v));
            }
        }
    }
}
