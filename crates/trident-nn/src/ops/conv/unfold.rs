//! Unfolding a group of images' patches a row at a time, and folding the input gradient
//! back.

use super::plan::{copy_short, zero_short, Plan};
use super::Conv;
use std::borrow::Cow;
use std::mem::MaybeUninit;

impl Conv {
    /// The patches of the `imgs` images `x` (`[imgs, c, h, w]`) of geometry `dims`, made a
    /// patch row at a time ([`Unfold`]); with `bits`, for a bf16 product, from the images
    /// rounded to bf16 once here (the unfolded rows, up to `k·k` times as many values, are
    /// then copied as bf16, not each rounded).
    pub(super) fn unfold<'a>(
        &'a self,
        x: &'a [f32],
        imgs: usize,
        dims: (usize, usize, usize, usize, usize),
        bits: bool,
    ) -> Unfold<'a> {
        let (c, h, w, _, _) = dims;
        let chw = c * h * w;
        let x = &x[..imgs * chw];
        let per = if self.stride == 1 {
            chw
        } else {
            self.phase_len(c, h, w)
        };
        let src = match (bits, self.stride) {
            (false, 1) => Src::Images(x),
            (false, _) => {
                let mut ph = crate::scratch::take(imgs * per);
                for (img, p) in x.chunks(chw).zip(ph.chunks_mut(per)) {
                    self.to_phases(img, (c, h, w), p);
                }
                Src::Phases(ph)
            }
            (true, s) => {
                let mut rounded = Bits::new(imgs * chw);
                crate::bf16::round_bits(x, rounded.as_mut());
                if s == 1 {
                    Src::Bits(rounded)
                } else {
                    let mut ph = Bits::new(imgs * per);
                    for (img, p) in rounded.as_ref().chunks(chw).zip(ph.as_mut().chunks_mut(per)) {
                        self.to_phases(img, (c, h, w), p);
                    }
                    Src::Bits(ph)
                }
            }
        };
        Unfold {
            src,
            plan: self.plan_for(dims),
            imgs,
            per,
            ohw: dims.3 * dims.4,
        }
    }

    /// Writes the image gradient `d` (`[c, h, w]`, every value written; it need not be
    /// initialised) from the transposed patch gradients in columns `col0..col0 + oh·ow` of
    /// `dcols_t` (`[c·k·k, ld]`): the adjoint of [`Self::unfold`]. The gradients of
    /// padding positions inside runs are zeroed on the way (they belong to no input). At
    /// stride 1 the runs are added onto `d` zeroed here; above it onto the phase layout
    /// (zeroed here, about as large), which is then copied out to `d`. (The whole `dx` was
    /// zero-filled by one thread before the groups' folds added into it, and at a stride
    /// above 1 added onto once more: 3 % of a bf16 WGAN epoch's samples were that
    /// `memset`, AMD EPYC Zen 4.)
    pub(super) fn fold(
        &self,
        dcols_t: &mut [f32],
        dims: (usize, usize, usize, usize, usize),
        (ld, col0): (usize, usize),
        d: &mut [MaybeUninit<f32>],
    ) {
        let (c, h, w, _, _) = dims;
        let mut add = |dst: &mut [f32]| {
            for &run in &self.plan_for(dims).runs {
                let g = &mut dcols_t[run.row * ld + col0 + run.at..][..run.len];
                for gap in run.gaps() {
                    zero_short(&mut g[gap]);
                }
                dst[run.from..run.from + run.len]
                    .iter_mut()
                    .zip(&*g)
                    .for_each(|(d, g)| *d += g);
            }
        };
        let d = &mut d[..c * h * w];
        if self.stride == 1 {
            d.fill(MaybeUninit::new(0.0));
            // SAFETY: every value was just written.
            add(unsafe { &mut *(d as *mut [MaybeUninit<f32>] as *mut [f32]) });
        } else {
            let mut phases = crate::scratch::take(self.phase_len(c, h, w));
            phases.fill(0.0);
            add(&mut phases);
            self.phases_to_image(&phases, (c, h, w), d);
            crate::scratch::give(phases);
        }
    }

    /// Images per matrix product: one for planes of 128 or more outputs; for smaller ones
    /// enough for about 256 columns (a product only a few dozen columns wide spends much of
    /// its time packing the weight, once per image), with
    /// their patches within 1 MiB (so they stay in cache between unfolding and the product)
    /// and at most an equal share of the batch per thread. Down to half that size, a size
    /// that makes the number of groups a multiple of the threads is preferred, so every
    /// thread gets as many (a WGAN critic's batch of 64 in groups of 5 gave one thread 7
    /// groups and the other 6; in groups of 4, 8 each).
    pub(super) fn group(b: usize, ckk: usize, ohw: usize) -> usize {
        if ohw >= 128 {
            return 1;
        }
        let threads = rayon::current_num_threads().max(1);
        let columns = 256usize.div_ceil(ohw);
        let in_cache = (1 << 18) / (ckk * ohw).max(1);
        let share = b.div_ceil(threads);
        let g = columns.min(in_cache).min(share).max(1);
        (g.div_ceil(2).max(1)..=g)
            .rev()
            .find(|&g| b.div_ceil(g).is_multiple_of(threads))
            .unwrap_or(g)
    }
}

/// What the patch rows of a group of images are read from: the images themselves (stride
/// 1), their phase layouts ([`Conv::runs`]) in a scratch buffer, or either rounded to bf16
/// (for a bf16 product).
pub(super) enum Src<'a> {
    Images(&'a [f32]),
    Phases(Vec<f32>),
    Bits(Bits),
}

/// bf16 values (their bits) in a recycled f32 buffer ([`crate::scratch`]), contents
/// unspecified until written.
pub(super) struct Bits {
    buf: Vec<f32>,
    len: usize,
}

impl Bits {
    fn new(len: usize) -> Self {
        Bits {
            buf: crate::scratch::take(len.div_ceil(2)),
            len,
        }
    }
}

impl AsRef<[u16]> for Bits {
    fn as_ref(&self) -> &[u16] {
        // SAFETY: `buf` holds ⌈len/2⌉ f32, so `len` u16 (alignment 2 ≤ 4) from its start;
        // any bits are a valid u16.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().cast(), self.len) }
    }
}

impl AsMut<[u16]> for Bits {
    fn as_mut(&mut self) -> &mut [u16] {
        // SAFETY: as in `as_ref`, and `&mut self` makes the view unique.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr().cast(), self.len) }
    }
}

impl Drop for Bits {
    fn drop(&mut self) {
        crate::scratch::give(std::mem::take(&mut self.buf));
    }
}

/// The transposed patches of a group of images, `[c·k·k, imgs·oh·ow]` (one row per tap,
/// each image's `oh·ow` positions side by side), made a row at a time: into an f32 matrix
/// for f32 products ([`Self::write_matrix`]), or, from images rounded to bf16
/// ([`Conv::unfold`]'s `bits`), straight into a packed bf16 operand ([`Self::rows`],
/// [`crate::bf16::Rows`]).
pub(super) struct Unfold<'a> {
    src: Src<'a>,
    /// The op's own plan, or one made for another geometry.
    plan: Cow<'a, Plan>,
    pub(super) imgs: usize,
    /// Values of `src` per image.
    per: usize,
    pub(super) ohw: usize,
}

impl Unfold<'_> {
    /// Patch row `r` of every image into `dst` (`imgs · oh · ow` values, each written once)
    /// from `src` (`per` values an image): its runs copied as slices, zero where the tap
    /// falls in the padding.
    fn row_of<T: Copy + Default>(&self, src: &[T], r: usize, dst: &mut [T]) {
        let runs = self.plan.row(r);
        for (j, out) in dst[..self.imgs * self.ohw].chunks_exact_mut(self.ohw).enumerate() {
            let src = &src[j * self.per..];
            // Taps' runs come in position order; what lies between them is padding.
            let mut next = 0;
            for &run in runs {
                if run.at > next {
                    zero_short(&mut out[next..run.at]);
                }
                let o = &mut out[run.at..run.at + run.len];
                copy_short(o, &src[run.from..run.from + run.len]);
                for gap in run.gaps() {
                    zero_short(&mut o[gap]);
                }
                next = run.at + run.len;
            }
            zero_short(&mut out[next..]);
        }
    }

    /// The number of patch rows, `c·k·k`.
    pub(super) fn len(&self) -> usize {
        self.plan.starts.len() - 1
    }

    /// Whether the rows are made in bf16 ([`Self::rows`]), not f32.
    pub(super) fn in_bf16(&self) -> bool {
        matches!(self.src, Src::Bits(_))
    }

    /// The whole matrix `[c·k·k, imgs·oh·ow]` into `cols` (every value written), from f32
    /// images.
    pub(super) fn write_matrix(&self, cols: &mut [f32]) {
        let src = match &self.src {
            Src::Images(x) => *x,
            Src::Phases(ph) => &ph[..],
            Src::Bits(_) => unreachable!("an f32 matrix is unfolded from f32 images"),
        };
        let wide = self.imgs * self.ohw;
        if wide == 0 {
            return;
        }
        for (r, row) in cols[..self.len() * wide].chunks_mut(wide).enumerate() {
            self.row_of(src, r, row);
        }
    }

    /// The patch rows as a [`crate::bf16::Rows`] source, for `f` to use; from images
    /// rounded to bf16.
    pub(super) fn rows<R>(&self, f: impl FnOnce(crate::bf16::Rows) -> R) -> R {
        let Src::Bits(bits) = &self.src else {
            unreachable!("bf16 rows are unfolded from images rounded to bf16")
        };
        let fill = |r: usize, dst: &mut [u16]| self.row_of(bits.as_ref(), r, dst);
        f(crate::bf16::Rows {
            rows: self.len(),
            cols: self.imgs * self.ohw,
            fill: &fill,
        })
    }
}

impl Drop for Unfold<'_> {
    fn drop(&mut self) {
        if let Src::Phases(ph) = &mut self.src {
            crate::scratch::give(std::mem::take(ph));
        }
    }
}
