//! The weight gradient: output channels across the lanes, each tile summing over every
//! output position in registers.

use super::*;
use rayon::prelude::*;

/// Tap rows (one input channel's kernel row: `k` taps) per weight-gradient tile of `nb`
/// lane-blocks of output channels: as many as keep the tile's `rows · k · nb`
/// accumulators, its `nb` output-gradient vectors and a broadcast within the 32 vector
/// registers, at most 4.
pub(super) const fn weight_rows(nb: usize, k: usize) -> usize {
    let r = (31 - nb) / (k * nb);
    if r > 4 {
        4
    } else {
        r
    }
}

/// The tiles of a weight gradient: each `(first lane-block, lane-blocks, first tap row)`,
/// lane-blocks split as evenly as [`tiles`] splits them (at most 4 a tile), tap rows
/// (`c · k` of them, channel by channel) [`weight_rows`] at a time.
fn weight_tiles(g: &Geometry) -> Vec<(usize, usize, usize)> {
    let rows = g.c * g.k;
    tiles(g.o.div_ceil(LANES), 4)
        .flat_map(|(j0, nb)| {
            let per = weight_rows(nb, g.k);
            (0..rows.div_ceil(per)).map(move |i| (j0, nb, i * per))
        })
        .collect()
}

/// Whether [`weight_gradient`] runs for `g`: a 3 × 3 or 4 × 4 kernel (the two it is
/// compiled for), output channels filling at least half the lanes, and at least 16 tiles
/// to share among the threads (a first convolution's one input channel makes 1–4, one
/// thread's work: its weight gradient stays with the unfolded product).
pub(crate) fn suits_weight_gradient(g: &Geometry) -> bool {
    matches!(g.k, 3 | 4) && 2 * g.o >= LANES && weight_tiles(g).len() >= 16
}

/// How [`weight_gradient`] lays out a batch's images and output gradients, and how the
/// kernel walks them, in its arithmetic. Input offsets count elements (f32, or bf16 for
/// pairs) within one image.
/// - f32: each image zero-padded (`c` planes of `hp × wp`), its output gradients
///   channels-last (`oh · ow` positions of `ob` values); a step is one output position.
/// - bf16 pairs: each padded row rounded to bf16 and split by column phase (each plane
///   `hp` rows of `s` phase rows of `wq` values, phase `φ` holding padded columns `φ`,
///   `φ + s`, …, zeros past the row), so that the two inputs a tap reads for two
///   consecutive output positions lie side by side; the output gradients channels-last in
///   pairs of consecutive positions of a row (`oh` rows of `⌈ow/2⌉` words of `ob` pairs,
///   an odd row's last position paired with zero); a step is a pair of positions.
#[derive(Clone, Copy, Debug)]
pub(super) struct WeightLayout {
    pairs: bool,
    pub(super) oh: usize,
    /// Steps per output row.
    pub(super) steps: usize,
    /// Input elements per padded image, per channel plane, per tap row, per output row
    /// and per step along it.
    pub(super) image: usize,
    plane: usize,
    tap_row: usize,
    pub(super) out_row: usize,
    pub(super) step: usize,
    /// Each tap's (`kx`) input offset from its step's first.
    pub(super) taps: [usize; 4],
    /// Lanes of re-laid output gradients per position (or pair): `o` rounded up to 16.
    pub(super) ob: usize,
}

impl WeightLayout {
    fn new(g: &Geometry, arith: Arith) -> Self {
        let (hp, wp, s, k) = (g.h + 2 * g.padding, g.w + 2 * g.padding, g.stride, g.k);
        assert!(k <= 4, "direct weight gradient of a {k} × {k} kernel");
        let ob = g.o.div_ceil(LANES) * LANES;
        match arith {
            Arith::F32 => WeightLayout {
                pairs: false,
                oh: g.oh,
                steps: g.ow,
                image: g.c * hp * wp,
                plane: hp * wp,
                tap_row: wp,
                out_row: s * wp,
                step: s,
                taps: [0, 1, 2, 3],
                ob,
            },
            Arith::Bf16 => {
                // A phase row reaches the last pair's partner's last tap: ⌈ow/2⌉·2 − 1 +
                // (k − 1)/s; even, so that every image is whole words.
                let wq = (g.ow + 1 + (k - 1) / s).next_multiple_of(2);
                WeightLayout {
                    pairs: true,
                    oh: g.oh,
                    steps: g.ow.div_ceil(2),
                    image: g.c * hp * s * wq,
                    plane: hp * s * wq,
                    tap_row: s * wq,
                    out_row: s * s * wq,
                    step: 2,
                    taps: std::array::from_fn(|kx| (kx % s) * wq + kx / s),
                    ob,
                }
            }
        }
    }

    /// 4-byte words per padded image (two bf16 a word in pairs).
    fn image_words(&self) -> usize {
        if self.pairs {
            self.image / 2
        } else {
            self.image
        }
    }

    /// Words of re-laid output gradients per image.
    pub(super) fn dy_words(&self) -> usize {
        self.oh * self.steps * self.ob
    }
}

/// One weight-gradient tile's work over a chunk of images laid out as `layout` says: the
/// chunk's inputs and re-laid output gradients (as words), the tile's first tap row (tap
/// row `t` is channel `t / k`'s kernel row `t % k`) and first lane-block `j0`.
pub(super) struct WeightTile<'a> {
    pub(super) x: &'a [f32],
    pub(super) dy: &'a [f32],
    pub(super) layout: &'a WeightLayout,
    rows: usize,
    row0: usize,
    pub(super) j0: usize,
}

impl WeightTile<'_> {
    /// Images in the chunk.
    pub(super) fn images(&self) -> usize {
        self.x.len() / self.layout.image_words()
    }

    /// The tile's `r` tap rows' offsets in an image (past the last row: the last row
    /// again, its sums dropped by the caller); panics unless every read of `nb`
    /// lane-blocks and `k` taps lies inside the chunk.
    pub(super) fn offsets<const R: usize>(&self, k: usize, nb: usize) -> [usize; R] {
        let l = self.layout;
        assert!(self.row0 < self.rows && self.rows.is_multiple_of(k));
        let imgs = self.images();
        assert!(imgs > 0 && self.x.len() == imgs * l.image_words());
        assert!(self.dy.len() >= imgs * l.dy_words() && (self.j0 + nb) * LANES <= l.ob);
        let offset = |t: usize| (t / k) * l.plane + (t % k) * l.tap_row;
        let last_read = offset(self.rows - 1)
            + (l.oh - 1) * l.out_row
            + (l.steps - 1) * l.step
            + l.taps[..k].iter().max().expect("k ≥ 1")
            + usize::from(l.pairs);
        assert!(last_read < l.image, "{l:?}: a tap reads past the image");
        std::array::from_fn(|r| offset((self.row0 + r).min(self.rows - 1)))
    }
}

/// The weight gradient (`[o, c, k, k]`) of the convolution `g` of `x` (`[b, c, h, w]`)
/// for the output gradient `dy` (`[b, o, oh, ow]`), without unfolding patches, in
/// `arith`.
///
/// `dW[oc, ch, ky, kx] = Σ_n Σ_(y, x) dy[n, oc, y, x] · x[n, ch, y·s + ky − p, x·s + kx − p]`.
/// Output channels lie across the lanes (the output gradients re-laid channels-last,
/// [`WeightLayout`]); a tile of up to 4 lane-blocks by a few tap rows (an input
/// channel's kernel row, all `k` taps) holds its sums in registers while it walks every
/// output position: per position (in bf16, per pair of positions: `vdpbf16ps` adds both
/// products), one vector of output gradients per lane-block and one broadcast input per
/// tap, read from the zero-padded images. The unfolded form wrote a patch matrix
/// `k²/s²` times the images' size and had the GEMM copy it again into its panels.
///
/// Tiles run in parallel on rayon's pool; each sums the images in order (a chunk of images
/// at a time, its sums carried in memory between chunks), so the result does not depend
/// on the number of threads.
///
/// # Panics
/// Unless the CPU has AVX-512F (and AVX512-BF16 for [`Arith::Bf16`]), `g.k` is 3 or 4
/// and the slices hold the geometry.
pub(crate) fn weight_gradient(x: &[f32], dy: &[f32], g: Geometry, arith: Arith) -> Vec<f32> {
    weight_gradient_in(x, dy, g, arith, 32 << 20)
}

/// [`weight_gradient`], the images in batches of at most `batch_bytes` padded and
/// re-laid (at least one image a batch).
pub(super) fn weight_gradient_in(
    x: &[f32],
    dy: &[f32],
    g: Geometry,
    arith: Arith,
    batch_bytes: usize,
) -> Vec<f32> {
    let Geometry {
        b,
        c,
        h,
        w,
        o,
        k,
        stride: s,
        padding: p,
        oh,
        ow,
    } = g;
    assert!(cpu_has_avx512(), "direct convolution without AVX-512F");
    assert!(
        arith == Arith::F32 || crate::bf16::avx512_bf16(),
        "bf16 direct weight gradient without AVX512-BF16"
    );
    assert!(matches!(k, 3 | 4), "direct weight gradient of a {k} × {k} kernel");
    assert!(x.len() >= b * c * h * w && dy.len() >= b * o * oh * ow);
    assert!(
        (oh - 1) * s + k <= h + 2 * p && (ow - 1) * s + k <= w + 2 * p,
        "{g:?}"
    );
    let layout = WeightLayout::new(&g, arith);
    let (image, dy_image) = (layout.image_words(), layout.dy_words());
    let (chw, ohw) = (c * h * w, o * oh * ow);
    let tiles = weight_tiles(&g);
    // Runs of consecutive tiles, several per thread (this VM's threads are not equally
    // fast), each with its tiles' sums.
    let runs = (4 * rayon::current_num_threads()).clamp(1, tiles.len());
    let per_run = tiles.len().div_ceil(runs);
    let mut sums: Vec<Vec<f32>> = tiles
        .chunks(per_run)
        .map(|run| vec![0f32; run.iter().map(|&(_, nb, _)| tile_sums(nb, k)).sum()])
        .collect();
    // The images in batches of at most `batch_bytes` padded and re-laid (32 MiB: all of a
    // GAN's or the Fashion CNN's batch at once, large images a few at a time); within a
    // batch, each run walks chunks of images whose output gradients (four lane-blocks)
    // fill 256 KiB, kept in cache while the run's tiles go over them.
    let batch = (batch_bytes / (4 * (image + dy_image))).clamp(1, b);
    let chunk = (256 * 1024 / (layout.oh * layout.steps * 4 * LANES * 4)).clamp(1, batch);
    let mut padded = crate::scratch::take(batch * image);
    let mut dyt = crate::scratch::take(batch * dy_image);
    for m0 in (0..b).step_by(batch) {
        let imgs = batch.min(b - m0);
        // The batch's images padded and its output gradients re-laid, image by image in
        // parallel.
        let (padded, dyt) = (&mut padded[..imgs * image], &mut dyt[..imgs * dy_image]);
        padded
            .par_chunks_mut(image)
            .zip(x[m0 * chw..(m0 + imgs) * chw].par_chunks(chw))
            .for_each(|(out, img)| match arith {
                Arith::F32 => pad_into(img, (c, h, w), [p; 4], out),
                Arith::Bf16 => pad_phases(img, (c, h, w), (p, s), &layout, out),
            });
        dyt.par_chunks_mut(dy_image)
            .zip(dy[m0 * ohw..(m0 + imgs) * ohw].par_chunks(ohw))
            .for_each(|(out, img)| relay_output_gradients(img, (o, oh, ow), &layout, out));
        let (padded, dyt) = (&*padded, &*dyt);
        tiles
            .par_chunks(per_run)
            .zip(sums.par_iter_mut())
            .for_each(|(run, sums)| {
                for n0 in (0..imgs).step_by(chunk) {
                    let n1 = (n0 + chunk).min(imgs);
                    let mut at = 0;
                    for &(j0, nb, row0) in run {
                        let acc = &mut sums[at..at + tile_sums(nb, k)];
                        at += tile_sums(nb, k);
                        let tile = WeightTile {
                            x: &padded[n0 * image..n1 * image],
                            dy: &dyt[n0 * dy_image..n1 * dy_image],
                            layout: &layout,
                            rows: c * k,
                            row0,
                            j0,
                        };
                        #[cfg(target_arch = "x86_64")]
                        // SAFETY: the CPU has AVX-512F, and AVX512-BF16 for bf16 (asserted
                        // above); `WeightTile::offsets` (in the kernel) bounds every read.
                        unsafe {
                            match arith {
                                Arith::F32 => x86::weight(&tile, k, nb, acc),
                                Arith::Bf16 => x86::weight_pairs(&tile, k, nb, acc),
                            }
                        }
                    }
                }
            });
    }
    crate::scratch::give(padded);
    crate::scratch::give(dyt);
    place_sums(&g, tiles.chunks(per_run).zip(sums.iter().map(Vec::as_slice)))
}

/// Values of one weight-gradient tile's sums (`[row, kx, block, lane]`) for `nb`
/// lane-blocks of a `k × k` kernel.
const fn tile_sums(nb: usize, k: usize) -> usize {
    weight_rows(nb, k) * k * nb * LANES
}

/// The weight gradient `[o, c, k, k]` of `g` from its tiles' sums: `runs` pairs each run
/// of tiles with its sums, tile after tile ([`tile_sums`] each); tap rows past `c · k` (a
/// last tile's repeats) dropped.
fn place_sums<'a>(
    g: &Geometry,
    runs: impl Iterator<Item = (&'a [(usize, usize, usize)], &'a [f32])>,
) -> Vec<f32> {
    let Geometry { o, c, k, .. } = *g;
    let mut dw = vec![0f32; o * c * k * k];
    for (run, sums) in runs {
        let mut at = 0;
        for &(j0, nb, row0) in run {
            let acc = &sums[at..at + tile_sums(nb, k)];
            at += tile_sums(nb, k);
            for r in 0..weight_rows(nb, k) {
                let t = row0 + r;
                if t >= c * k {
                    break;
                }
                let (ch, ky) = (t / k, t % k);
                for kx in 0..k {
                    for j in 0..nb {
                        let lanes = &acc[((r * k + kx) * nb + j) * LANES..][..LANES];
                        for (lane, &v) in lanes.iter().enumerate() {
                            let oc = (j0 + j) * LANES + lane;
                            if oc < o {
                                dw[((oc * c + ch) * k + ky) * k + kx] = v;
                            }
                        }
                    }
                }
            }
        }
    }
    dw
}

/// One image (`[c, h, w]`) padded by `p` on every side, rounded to bf16 and split by the
/// stride `s`'s column phases as [`WeightLayout`] lays them out for pairs, into `out` (the image's words,
/// every one written).
fn pad_phases(
    img: &[f32],
    (c, h, w): (usize, usize, usize),
    (p, s): (usize, usize),
    l: &WeightLayout,
    out: &mut [f32],
) {
    let hp = h + 2 * p;
    // A padded row is `s` phase rows of `wq`.
    let wq = l.tap_row / s;
    // SAFETY: a word is two u16; any bits are a valid u16.
    let out = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u16>(), 2 * out.len()) };
    assert!(img.len() == c * h * w && out.len() == l.image && l.plane == hp * s * wq);
    // The whole image rounded at once (vectorised), then its rows placed.
    let mut rounded = crate::scratch::take((c * h * w).div_ceil(2));
    // SAFETY: as above.
    let bits = unsafe { std::slice::from_raw_parts_mut(rounded.as_mut_ptr().cast::<u16>(), c * h * w) };
    crate::bf16::round_bits(img, bits);
    #[cfg(target_arch = "x86_64")]
    let split = x86::PhaseSplit::new(w, p, s, wq);
    for (plane, src) in out.chunks_mut(l.plane).zip(bits.chunks(h * w)) {
        for (yy, dst) in plane.chunks_mut(s * wq).enumerate() {
            if yy < p || yy >= p + h {
                dst.fill(0);
                continue;
            }
            let row = &src[(yy - p) * w..][..w];
            #[cfg(target_arch = "x86_64")]
            if let Some(split) = &split {
                // SAFETY: `PhaseSplit::new` gives one only where the CPU has AVX512BW.
                unsafe { split.row(row, dst) };
                continue;
            }
            for (phase, d) in dst.chunks_mut(wq).enumerate() {
                for (i, v) in d.iter_mut().enumerate() {
                    *v = (i * s + phase)
                        .checked_sub(p)
                        .and_then(|col| row.get(col))
                        .copied()
                        .unwrap_or(0);
                }
            }
        }
    }
    crate::scratch::give(rounded);
}

/// One image's output gradients (`[o, oh, ow]`) re-laid as `l` says into `out` (its
/// words, every one written): channels-last ([`x86::channels_last`]), and for pairs the
/// rows' consecutive positions rounded and paired.
fn relay_output_gradients(
    img: &[f32],
    (o, oh, ow): (usize, usize, usize),
    l: &WeightLayout,
    out: &mut [f32],
) {
    let (positions, ob) = (oh * ow, l.ob);
    if !l.pairs {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX-512F (`weight_gradient_in` asserts it).
        unsafe {
            x86::channels_last(img, (o, positions, ob), out)
        }
        return;
    }
    let mut last = crate::scratch::take(positions * ob);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as above.
    unsafe {
        x86::channels_last(img, (o, positions, ob), &mut last)
    }
    // SAFETY: f32 and u32 have the same size and alignment; any bits are a valid u32.
    let words = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u32>(), out.len()) };
    let zeros = vec![0f32; ob];
    for (y, dst) in words[..oh * l.steps * ob].chunks_mut(l.steps * ob).enumerate() {
        for (m, d) in dst.chunks_mut(ob).enumerate() {
            let q = y * ow + 2 * m;
            let hi = if 2 * m + 1 < ow {
                &last[(q + 1) * ob..][..ob]
            } else {
                &zeros[..]
            };
            crate::bf16::pair_into(&last[q * ob..][..ob], hi, d);
        }
    }
    crate::scratch::give(last);
}

/// Splits `n` positions (or lane-blocks) into the fewest tiles of at most `max`, as even
/// as can be: a row of 7 on 6-wide tiles is 4 + 3, not 6 + 1 (a one-wide tile runs at a
/// fraction of the rate).
pub(super) fn tiles(n: usize, max: usize) -> impl Iterator<Item = (usize, usize)> {
    let count = n.div_ceil(max);
    let (base, extra) = (n / count, n % count);
    (0..count).map(move |i| (i * base + i.min(extra), base + usize::from(i < extra)))
}
