//! The AMX kernel. Operands are packed into zero-padded bf16 buffers, tile by tile,
//! so that every tile a kernel loads is 1 KiB of contiguous memory (64-byte rows, one
//! cache line each): the left one in strips of 16 rows, each strip a run of `Kp/32`
//! tiles of 16 rows × 32 values (`[Mp/16][Kp/32][16][32]`); the right one in strips of
//! 16 columns laid out as AMX wants, each a run of `Kp/2` rows holding the pairs of
//! consecutive k for 16 columns (`[Np/16][Kp/2][16][2]`). Each task computes 32×32
//! blocks of the output (two strips by two strips) in four accumulator tiles. Against
//! row-major operands (tile rows a whole operand row apart) the contiguous tiles ran
//! the tile loop at 1,417–1,690 GFLOP/s on one core against 492–1,435 (Intel Xeon
//! with AMX, six interleaved runs).
use super::{OnceLock, Operand};
use rayon::prelude::*;
use std::arch::asm;

/// Block edge: two 16-row tiles by two 16-column tiles.
const B: usize = 32;

static USABLE: OnceLock<bool> = OnceLock::new();

fn usable() -> bool {
    *USABLE.get_or_init(|| {
        if std::env::var("TRIDENT_AMX").is_ok_and(|v| v.eq_ignore_ascii_case("off")) {
            return false;
        }
        // CPUID.(EAX=7,ECX=0):EDX bit 24 AMX-TILE, bit 22 AMX-BF16.
        // SAFETY: CPUID leaf 7 exists on every x86-64 CPU that runs this binary
        // (leaf 0 reports the highest leaf; checked first).
        #[allow(unused_unsafe)] // `__cpuid` is safe to call from Rust 1.87 on.
        let leaf7 = unsafe {
            if std::arch::x86_64::__cpuid(0).eax < 7 {
                return false;
            }
            std::arch::x86_64::__cpuid_count(7, 0)
        };
        if leaf7.edx & (1 << 24) == 0 || leaf7.edx & (1 << 22) == 0 {
            return false;
        }
        request_tile_state()
    })
}

/// Asks Linux for permission to use the AMX tile data state (process-wide).
fn request_tile_state() -> bool {
    #[cfg(target_os = "linux")]
    {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: arch_prctl with these arguments only changes the process's permitted
        // extended state; it returns -1 where the kernel does not know the request.
        unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// The tile configuration: palette 1, eight tiles of 16 rows × 64 bytes.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

const CONFIG: TileConfig = {
    let mut c = TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [0; 16],
        rows: [0; 16],
    };
    let mut t = 0;
    while t < 8 {
        c.colsb[t] = 64;
        c.rows[t] = 16;
        t += 1;
    }
    c
};

fn round_up(x: usize) -> usize {
    x.div_ceil(B) * B
}

/// A packing buffer whose first value sits on a 64-byte boundary, so that every row a
/// tile (or a zmm register) loads is one whole cache line. From the allocator a large
/// buffer starts 16 bytes past a page, and each 64-byte row then straddles two lines:
/// AMX's `tileloadd` ran 7x slower (22 against 3.2 ns) and the 2 × 2-tile loop 2.7x
/// slower (543 against 1,454 GFLOP/s on one core, Intel Xeon with AMX) on such rows.
/// The storage is a recycled f32 buffer ([`crate::scratch`]), so its contents are
/// unspecified: the packing writes every value, padding included.
struct Aligned<T> {
    buf: Vec<f32>,
    start: usize,
    len: usize,
    _of: std::marker::PhantomData<T>,
}

impl<T: Copy> Aligned<T> {
    /// `len` values of `T` (`u16` or `u32`), contents unspecified.
    fn unfilled(len: usize) -> Self {
        const { assert!(std::mem::align_of::<T>() <= 4 && std::mem::size_of::<T>() <= 4) };
        let floats = (len * std::mem::size_of::<T>()).div_ceil(4);
        let buf = crate::scratch::take(floats + 16);
        let start = buf.as_ptr().align_offset(64);
        Aligned {
            buf,
            start,
            len,
            _of: std::marker::PhantomData,
        }
    }
}

impl<T> std::ops::Deref for Aligned<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `unfilled` sized `buf` to hold `len` values of T (at most 4 bytes,
        // alignment at most 4) from `start`; any bit pattern is a valid u16 or u32.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().add(self.start).cast(), self.len) }
    }
}

impl<T> std::ops::DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` makes the view unique.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr().add(self.start).cast(), self.len) }
    }
}

impl<T> Drop for Aligned<T> {
    fn drop(&mut self) {
        crate::scratch::give(std::mem::take(&mut self.buf));
    }
}

/// Tile rows and strips: a strip is 16 rows (or 16 columns), a tile 16 × 32 values.
const STRIP: usize = 16;

/// A 32 × 32 f32 block on a 64-byte boundary (the tiles are stored into it).
#[repr(C, align(64))]
struct Block([f32; B * B]);

/// An element type operands are packed from.
trait Elem: Copy + Sync {
    fn bits(self) -> u16;
    /// `dst[i] = src[i].bits()`.
    fn bits_slice(src: &[Self], dst: &mut [u16]) {
        dst.iter_mut().zip(src).for_each(|(d, s)| *d = s.bits());
    }
    /// `dst[i] = lo[i].bits() | hi[i].bits() << 16`.
    fn pair_slices(lo: &[Self], hi: &[Self], dst: &mut [u32]) {
        dst.iter_mut()
            .zip(lo.iter().zip(hi))
            .for_each(|(d, (l, h))| *d = l.bits() as u32 | (h.bits() as u32) << 16);
    }
    /// Pair rows `0..pairs` of the 32-column panel at column `c0` of `data` (rows `ld`
    /// apart) into `dst` (the panel, [`pack_rhs`]'s layout), where a vector path does
    /// it: returns how many pair rows it wrote (0: none, the caller does them).
    fn pair_panel(_: &[Self], _: usize, _: usize, _: usize, _: usize, _: &mut [u32]) -> usize {
        0
    }
}
impl Elem for f32 {
    #[inline(always)]
    fn bits(self) -> u16 {
        super::round(self)
    }
    fn bits_slice(src: &[f32], dst: &mut [u16]) {
        super::round_bits(src, dst)
    }
    fn pair_slices(lo: &[f32], hi: &[f32], dst: &mut [u32]) {
        super::simd::pair_slices(lo, hi, dst)
    }
    fn pair_panel(data: &[f32], ld: usize, c0: usize, pairs: usize, kp: usize, dst: &mut [u32]) -> usize {
        super::simd::pair_panel(data, ld, c0, pairs, kp, dst)
    }
}
impl Elem for half::bf16 {
    #[inline(always)]
    fn bits(self) -> u16 {
        self.to_bits()
    }
}

/// op(a) `m × k` into strips of tiles, `[mp/16][kp/32][16][32]` bf16, zero-padded.
fn pack_lhs(a: &Operand, m: usize, k: usize, mp: usize, kp: usize, serial: bool) -> Aligned<u16> {
    match *a {
        Operand::F32(x) => pack_lhs_from(x.data, x.ld, x.trans, m, k, mp, kp, serial),
        Operand::Bf16 { data, ld, trans } => pack_lhs_from(data, ld, trans, m, k, mp, kp, serial),
    }
}

/// `f(i, chunk i)` for the `size`-value chunks of `out`, in parallel unless `serial`.
fn chunks<T: Send>(out: &mut [T], size: usize, serial: bool, f: impl Fn(usize, &mut [T]) + Sync + Send) {
    if serial {
        out.chunks_mut(size).enumerate().for_each(|(i, c)| f(i, c));
    } else {
        out.par_chunks_mut(size).enumerate().for_each(|(i, c)| f(i, c));
    }
}

/// Where value `p` of row `r` (of a 32-row block) lies in the block's two strips.
#[inline(always)]
fn lhs_at(r: usize, p: usize, kp: usize) -> usize {
    (r / STRIP) * STRIP * kp + (p / B) * STRIP * B + (r % STRIP) * B + p % B
}

#[allow(clippy::too_many_arguments)]
fn pack_lhs_from<E: Elem>(
    data: &[E],
    ld: usize,
    trans: bool,
    m: usize,
    k: usize,
    mp: usize,
    kp: usize,
    serial: bool,
) -> Aligned<u16> {
    let mut out = Aligned::unfilled(mp * kp);
    chunks(&mut out, B * kp, serial, |bi, dst| {
        let r0 = bi * B;
        let rows = m.saturating_sub(r0).min(B);
        // The padding (the values are written below): rows past m, and each row's
        // values past k, which lie in its last 32 (kp − k < 32). Zeroing the whole
        // block was a second pass over it for every product not a multiple of 32 deep
        // (a convolution's weight gradient, 245 images' positions deep).
        for r in rows..B {
            (0..kp)
                .step_by(B)
                .for_each(|p| dst[lhs_at(r, p, kp)..][..B].fill(0));
        }
        if k < kp {
            (0..rows).for_each(|r| dst[lhs_at(r, k, kp)..][..kp - k].fill(0));
        }
        if trans {
            // op(a) row r is stored column r: transpose 32 × 32 squares through a
            // local block, reading and writing 32 contiguous values at a time.
            let mut sq = [[0u16; B]; B];
            for p0 in (0..k).step_by(B) {
                let ps = (k - p0).min(B);
                for (dp, line) in sq.iter_mut().enumerate().take(ps) {
                    let src = &data[(p0 + dp) * ld + r0..][..rows];
                    E::bits_slice(src, &mut line[..rows]);
                }
                for r in 0..rows {
                    let line = &mut dst[lhs_at(r, p0, kp)..][..ps];
                    line.iter_mut().enumerate().for_each(|(dp, d)| *d = sq[dp][r]);
                }
            }
        } else {
            for r in 0..rows {
                let src = &data[(r0 + r) * ld..][..k];
                for (t, part) in src.chunks(B).enumerate() {
                    E::bits_slice(part, &mut dst[lhs_at(r, t * B, kp)..][..part.len()]);
                }
            }
        }
    });
    out
}

/// op(b) `k × n` into panels of 32 columns, each two strips of 16 columns,
/// `[np/16][kp/2][16]` pairs of bf16 (the values at k = 2i and 2i + 1 of one column in
/// one 32-bit word, low half first).
fn pack_rhs(b: &Operand, k: usize, n: usize, kp: usize, np: usize, serial: bool) -> Aligned<u32> {
    match *b {
        Operand::F32(x) => pack_rhs_from(x.data, x.ld, x.trans, k, n, kp, np, serial),
        Operand::Bf16 { data, ld, trans } => pack_rhs_from(data, ld, trans, k, n, kp, np, serial),
    }
}

/// Where pair row `i` of column `j` (of a 32-column panel) lies in the panel.
#[inline(always)]
fn rhs_at(i: usize, j: usize, kp: usize) -> usize {
    (j / STRIP) * (kp / 2) * STRIP + i * STRIP + j % STRIP
}

#[allow(clippy::too_many_arguments)]
fn pack_rhs_from<E: Elem>(
    data: &[E],
    ld: usize,
    trans: bool,
    k: usize,
    n: usize,
    kp: usize,
    np: usize,
    serial: bool,
) -> Aligned<u32> {
    let panel = kp / 2 * B;
    let mut out = Aligned::unfilled(np / B * panel);
    let pair = |lo: u16, hi: u16| lo as u32 | (hi as u32) << 16;
    chunks(&mut out, panel, serial, |pi, dst| {
        let c0 = pi * B;
        let cols = n.saturating_sub(c0).min(B);
        if cols < B || k < kp {
            dst.fill(0); // the padding; the values are written below
        }
        if trans {
            // Stored transposed: column j of op(b) is contiguous. Rounded as a run, then
            // scattered a pair at a time.
            let mut line = vec![0u16; k.next_multiple_of(2)];
            for jj in 0..cols {
                E::bits_slice(&data[(c0 + jj) * ld..][..k], &mut line[..k]);
                for (i, two) in line.chunks_exact(2).enumerate() {
                    dst[rhs_at(i, jj, kp)] = pair(two[0], two[1]);
                }
            }
        } else {
            // A whole panel's pairs of f32 rows in one vectorised pass where the CPU
            // has AVX512-BF16 (a call per 16 values was 5 % of a bf16 MiniLM step).
            let done = if cols == B {
                E::pair_panel(data, ld, c0, k / 2, kp, dst)
            } else {
                0
            };
            for i in done..k.div_ceil(2) {
                for j0 in (0..cols).step_by(STRIP) {
                    let w = (cols - j0).min(STRIP);
                    let lo = &data[2 * i * ld + c0 + j0..][..w];
                    let line = &mut dst[rhs_at(i, j0, kp)..][..w];
                    if 2 * i + 1 < k {
                        E::pair_slices(lo, &data[(2 * i + 1) * ld + c0 + j0..][..w], line);
                    } else {
                        line.iter_mut().zip(lo).for_each(|(d, l)| *d = pair(l.bits(), 0));
                    }
                }
            }
        }
    });
    out
}

use crate::blas::SharedOut as Out;

/// Which instructions multiply the packed blocks.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Kernel {
    /// AMX tiles (`tdpbf16ps`).
    Tiles,
    /// AVX512-BF16 (`vdpbf16ps`) in zmm registers.
    Dot,
}

/// The kernel this CPU runs bf16 products on: AMX tiles where usable, else
/// AVX512-BF16 (`TRIDENT_BF16_DOT=off` refuses it), else none.
pub(super) fn kernel() -> Option<Kernel> {
    static KERNEL: OnceLock<Option<Kernel>> = OnceLock::new();
    *KERNEL.get_or_init(|| {
        if usable() {
            Some(Kernel::Tiles)
        } else if !std::env::var("TRIDENT_BF16_DOT").is_ok_and(|v| v.eq_ignore_ascii_case("off"))
            && super::simd::has_avx512_bf16()
        {
            Some(Kernel::Dot)
        } else {
            None
        }
    })
}

/// `c = op(a) · op(b) + beta · c` on `kernel`, on the calling thread alone with `serial`;
/// the operands checked by the caller to hold op(a) `m × k` and op(b) `k × n`.
///
/// SAFETY: `c` points at `m · n` f32 no one else accesses, initialised unless `beta`
/// is 0 (then nothing of it is read).
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm(
    kernel: Kernel,
    m: usize,
    n: usize,
    k: usize,
    a: Operand,
    b: Operand,
    beta: f32,
    c: *mut f32,
    serial: bool,
) {
    // A transposed operand packs slowly (a transpose on the left, a pair at a time on
    // the right). When one of the two is transposed, compute cᵀ = op(b)ᵀ · op(a)ᵀ
    // instead where that moves the transpose onto the smaller operand, and store the
    // blocks transposed: a transposed left operand larger than the right one (a weight
    // gradient's output gradient against its input), or a transposed right operand
    // larger than the left one by more pairs than the output has values, since the
    // transposed store writes them one at a time (a convolution's patches against its
    // output gradient, for its weight gradient; not a linear layer's weight against its
    // input, whose output is large).
    let transposed =
        (a.trans() && !b.trans() && n < m) || (!a.trans() && b.trans() && m < n && (n - m) * k > m * n);
    let (m, n, a, b) = if transposed {
        (n, m, b.t(), a.t())
    } else {
        (m, n, a, b)
    };
    let (mp, np, kp) = (round_up(m), round_up(n), round_up(k));
    let (pa, pb) = if serial {
        (pack_lhs(&a, m, k, mp, kp, true), pack_rhs(&b, k, n, kp, np, true))
    } else {
        rayon::join(
            || pack_lhs(&a, m, k, mp, kp, false),
            || pack_rhs(&b, k, n, kp, np, false),
        )
    };
    // SAFETY: the caller's promise on `c`.
    unsafe { multiply(kernel, (&pa, &pb), (m, n, k), beta, c, transposed, serial) }
}

/// op(a) `m × k` packed once for several products ([`gemm_packed`]).
pub(super) struct PackedLhs {
    data: Aligned<u16>,
    pub(super) m: usize,
    pub(super) k: usize,
}

/// Packs op(a) `m × k` (checked by the caller) on the calling thread.
pub(super) fn pack(a: Operand, m: usize, k: usize) -> PackedLhs {
    PackedLhs {
        data: pack_lhs(&a, m, k, round_up(m), round_up(k), true),
        m,
        k,
    }
}

/// [`gemm`] of a packed left operand, on the calling thread.
///
/// SAFETY: as [`gemm`]'s, with op(b) `a.k × n` checked by the caller.
pub(super) unsafe fn gemm_packed(
    kernel: Kernel,
    a: &PackedLhs,
    n: usize,
    b: Operand,
    beta: f32,
    c: *mut f32,
) {
    let (m, k) = (a.m, a.k);
    let (np, kp) = (round_up(n), round_up(k));
    let pb = pack_rhs(&b, k, n, kp, np, true);
    multiply(kernel, (&a.data, &pb), (m, n, k), beta, c, false, true)
}

/// [`gemm_packed`] with `beta = 0` and a right operand given by rows
/// ([`super::Rows`]).
///
/// SAFETY: `c` points at `a.m · n` f32 (written, not read), `b` `a.k × n` checked by
/// the caller.
pub(super) unsafe fn gemm_packed_rows(kernel: Kernel, a: &PackedLhs, b: super::Rows, c: *mut f32) {
    let (m, k, n) = (a.m, a.k, b.cols);
    let pb = pack_rhs_rows(&b, round_up(k), round_up(n));
    multiply(kernel, (&a.data, &pb), (m, n, k), 0.0, c, false, true)
}

/// `c = op(a) · bᵀ + beta · c` ([`super::gemm_serial_rows_t`]) on `kernel`, on the
/// calling thread, as `cᵀ = b · op(a)ᵀ` stored transposed; checked by the caller.
pub(super) fn gemm_rows_t(kernel: Kernel, m: usize, a: Operand, b: super::Rows, beta: f32, c: &mut [f32]) {
    let (n, k) = (b.rows, b.cols);
    let (np, mp, kp) = (round_up(n), round_up(m), round_up(k));
    let pa = pack_lhs_rows(&b, np, kp);
    let pb = pack_rhs(&a.t(), k, m, kp, mp, true);
    // SAFETY: `c` holds the m · n initialised values (checked by the caller).
    unsafe { multiply(kernel, (&pa, &pb), (n, m, k), beta, c.as_mut_ptr(), true, true) }
}

/// The rows of `a` (`rows × cols`, the left operand `m × k`) packed as [`pack_lhs`]
/// does, each row made into a scratch row and copied from there.
fn pack_lhs_rows(a: &super::Rows, mp: usize, kp: usize) -> Aligned<u16> {
    let (m, k) = (a.rows, a.cols);
    let mut out = Aligned::unfilled(mp * kp);
    let mut row = vec![0u16; k];
    for (bi, dst) in out.chunks_mut(B * kp).enumerate() {
        let r0 = bi * B;
        let rows = m.saturating_sub(r0).min(B);
        for r in 0..rows {
            (a.fill)(r0 + r, &mut row);
            for (t, part) in row.chunks(B).enumerate() {
                dst[lhs_at(r, t * B, kp)..][..part.len()].copy_from_slice(part);
            }
            if k < kp {
                dst[lhs_at(r, k, kp)..][..kp - k].fill(0);
            }
        }
        for r in rows..B {
            (0..kp)
                .step_by(B)
                .for_each(|p| dst[lhs_at(r, p, kp)..][..B].fill(0));
        }
    }
    out
}

/// The rows of `b` (`k × n`, the right operand) packed as [`pack_rhs`] does, two rows
/// at a time: each pair made into scratch rows and interleaved into every panel.
fn pack_rhs_rows(b: &super::Rows, kp: usize, np: usize) -> Aligned<u32> {
    let (k, n) = (b.rows, b.cols);
    let panel = kp / 2 * B;
    let mut out = Aligned::unfilled(np / B * panel);
    // The pair's two rows, zero past n (the last panel's padding columns).
    let (mut lo, mut hi) = (vec![0u16; np], vec![0u16; np]);
    for i in 0..kp / 2 {
        if 2 * i < k {
            (b.fill)(2 * i, &mut lo[..n]);
            if 2 * i + 1 < k {
                (b.fill)(2 * i + 1, &mut hi[..n]);
            } else {
                hi.fill(0);
            }
        } else {
            lo.fill(0);
            hi.fill(0);
        }
        interleave(&lo, &hi, &mut out, i, kp);
    }
    out
}

/// Pair row `i` of every strip of 16 columns of a packed right operand (`[np/16][kp/2][16]`
/// pairs, [`pack_rhs`]) from the pair's two rows `lo` and `hi` (`np` values each): the
/// `lo` value in the low half of each word. With AVX-512 sixteen words at a time (the
/// compiler left the loop scalar: 10 % of a bf16 convolution's forward pass).
fn interleave(lo: &[u16], hi: &[u16], out: &mut [u32], i: usize, kp: usize) {
    let strips = lo.len().min(hi.len()) / STRIP;
    assert!(i < kp / 2 && out.len() >= strips * (kp / 2) * STRIP);
    if avx512() {
        // SAFETY: the CPU has the features; the strips lie inside the three slices
        // (asserted above).
        return unsafe { interleave_avx512(lo, hi, out, i, kp, strips) };
    }
    for s in 0..strips {
        let line = &mut out[(s * (kp / 2) + i) * STRIP..][..STRIP];
        let (l, h) = (&lo[s * STRIP..][..STRIP], &hi[s * STRIP..][..STRIP]);
        for j in 0..STRIP {
            line[j] = l[j] as u32 | (h[j] as u32) << 16;
        }
    }
}

/// SAFETY: AVX512F and AVX512BW; `lo` and `hi` hold `strips · 16` values, `out`
/// `strips · kp/2 · 16`, `i < kp/2`.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn interleave_avx512(lo: &[u16], hi: &[u16], out: &mut [u32], i: usize, kp: usize, strips: usize) {
    use std::arch::x86_64::*;
    for s in 0..strips {
        let l = _mm256_loadu_si256(lo.as_ptr().add(s * STRIP).cast());
        let h = _mm256_loadu_si256(hi.as_ptr().add(s * STRIP).cast());
        let v = super::simd::x86::pair_words(l, h);
        _mm512_storeu_si512(out.as_mut_ptr().add((s * (kp / 2) + i) * STRIP).cast(), v);
    }
}

/// The products of packed operands into `c` (`m × n`, or its transpose `n × m` when
/// `transposed`), on the calling thread alone with `serial`.
///
/// SAFETY: as [`gemm`]'s; `pa` and `pb` packed from op(a) `m × k` and op(b) `k × n`.
unsafe fn multiply(
    kernel: Kernel,
    (pa, pb): (&[u16], &[u32]),
    (m, n, k): (usize, usize, usize),
    beta: f32,
    c: *mut f32,
    transposed: bool,
    serial: bool,
) {
    let (mp, np, kp) = (round_up(m), round_up(n), round_up(k));
    let (mblocks, nblocks) = (mp / B, np / B);
    // Contiguous ranges of row blocks per task (each task's rows of `a` stay in its
    // cache while it walks every panel of `b`), or of column panels when there are
    // fewer row blocks than threads.
    let threads = rayon::current_num_threads().max(1);
    let small = m * n * k < (1 << 20);
    let tasks = if small || serial { 1 } else { threads };
    let split_rows = mblocks >= tasks;
    let parts = if split_rows { mblocks } else { nblocks };
    let per = parts.div_ceil(tasks.min(parts));
    let out = Out(c);
    let task = move |t: usize| {
        let range = (t * per)..((t + 1) * per).min(parts);
        let (rows, cols) = if split_rows {
            (range, 0..nblocks)
        } else {
            (0..mblocks, range)
        };
        let mut acc = Block([0f32; B * B]);
        let acc = &mut acc.0;
        if kernel == Kernel::Dot {
            // SAFETY: the CPU has AVX512F and AVX512-BF16 (`kernel`); packed
            // buffers are padded to whole blocks, so every load reads inside them;
            // `store` writes only this task's blocks, inside `c`.
            unsafe {
                for nb in cols {
                    let panel = pb.as_ptr().add(nb * kp / 2 * B);
                    for mb in rows.clone() {
                        let a = pa.as_ptr().add(mb * B * kp);
                        let (r0, c0) = (mb * B, nb * B);
                        if !transposed && r0 + B <= m && c0 + B <= n {
                            // A whole block of the output, written from the registers.
                            dot_block(a, kp, panel, (out.0.add(r0 * n + c0), n), beta);
                        } else {
                            dot_block(a, kp, panel, (acc.as_mut_ptr(), B), 0.0);
                            store(acc, out, r0, c0, m, n, beta, transposed);
                        }
                    }
                }
            }
            return;
        }
        // SAFETY: AMX is usable (checked by the caller through `usable`, which also
        // obtained the tile permission); CONFIG describes the eight 16×64-byte tiles
        // `block` uses; packed buffers are padded to whole blocks, so every tile load
        // reads inside them; `store` writes only this task's blocks, inside `c`.
        unsafe {
            asm!("ldtilecfg [{}]", in(reg) &CONFIG as *const TileConfig, options(nostack, readonly));
            for nb in cols {
                let panel = pb.as_ptr().add(nb * kp / 2 * B) as *const u16;
                for mb in rows.clone() {
                    block(pa.as_ptr().add(mb * B * kp), kp, panel, acc.as_mut_ptr());
                    store(acc, out, mb * B, nb * B, m, n, beta, transposed);
                }
            }
            asm!("tilerelease", options(nostack, nomem));
        }
    };
    if serial {
        (0..parts.div_ceil(per)).for_each(task);
    } else {
        (0..parts.div_ceil(per)).into_par_iter().for_each(task);
    }
}

/// One 32×32 output block: `acc = a[32, kp] · panel[kp, 32]`.
///
/// SAFETY: tiles configured by CONFIG; `a` points at two strips of `16 · kp` bf16 and
/// `panel` at two strips of `kp · 16` bf16 (`kp` a multiple of 32, packed as above),
/// `acc` at 32 × 32 f32.
#[inline(always)]
unsafe fn block(a: *const u16, kp: usize, panel: *const u16, acc: *mut f32) {
    asm!(
        "tilezero tmm0",
        "tilezero tmm1",
        "tilezero tmm2",
        "tilezero tmm3",
        options(nostack, nomem)
    );
    let (a1, b1) = (a.add(STRIP * kp), panel.add(STRIP * kp));
    let mut p = 0;
    while p < kp {
        // Tile p / 32 of each strip: 16 rows of 64 bytes, contiguous.
        let at = p * STRIP;
        asm!(
            "tileloadd tmm4, [{a0} + {s}*1]",
            "tileloadd tmm5, [{a1} + {s}*1]",
            "tileloadd tmm6, [{b0} + {s}*1]",
            "tileloadd tmm7, [{b1} + {s}*1]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            a0 = in(reg) a.add(at),
            a1 = in(reg) a1.add(at),
            b0 = in(reg) panel.add(at),
            b1 = in(reg) b1.add(at),
            s = in(reg) 64usize,
            options(nostack, readonly)
        );
        p += B;
    }
    asm!(
        "tilestored [{c0} + {s}*1], tmm0",
        "tilestored [{c1} + {s}*1], tmm1",
        "tilestored [{c2} + {s}*1], tmm2",
        "tilestored [{c3} + {s}*1], tmm3",
        c0 = in(reg) acc,
        c1 = in(reg) acc.add(16),
        c2 = in(reg) acc.add(16 * B),
        c3 = in(reg) acc.add(16 * B + 16),
        s = in(reg) 4 * B,
        options(nostack)
    );
}

/// One 32×32 output block with AVX512-BF16: `c = a[32, kp] · panel[kp, 32] + beta · c`
/// for `c` 32 rows of 32 values `ldc` apart, eight rows at a time in 16 zmm
/// accumulators. Each step broadcasts one row's pair of bf16 (k = 2p, 2p + 1) and
/// multiplies it by the panel's pairs for 32 columns: `vdpbf16ps` adds both products
/// into each f32 lane, as `tdpbf16ps` does per tile row. With `beta = 0` nothing of `c`
/// is read. (Written straight into the output, not through a block on the stack and a
/// copy, which for a product only 64 or 128 deep, as a convolution's input gradient,
/// is a 4 KiB store and copy per 32 × 32 × 128 multiply-adds; `gemm_layouts`' bf16
/// products ran 3.42 / 3.56 / 4.83 ms against 3.80 / 3.78 / 4.97, fastest of three.)
///
/// SAFETY: the CPU has AVX512F and AVX512-BF16; `a` and `panel` point at a block and a
/// panel packed as above (`kp` a multiple of 32), `c` at 32 rows of 32 f32 `ldc` apart,
/// initialised unless `beta` is 0.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn dot_block(a: *const u16, kp: usize, panel: *const u32, (out, ldc): (*mut f32, usize), beta: f32) {
    use std::arch::x86_64::*;
    let panel1 = panel.add(kp / 2 * STRIP);
    for r0 in (0..B).step_by(8) {
        let mut c = [[_mm512_setzero_ps(); 2]; 8];
        for p in 0..kp / 2 {
            let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(panel.add(p * STRIP).cast()));
            let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(panel1.add(p * STRIP).cast()));
            for (r, c) in c.iter_mut().enumerate() {
                let pair = a.add(lhs_at(r0 + r, 2 * p, kp)).cast::<i32>().read_unaligned();
                let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                c[0] = _mm512_dpbf16_ps(c[0], av, b0);
                c[1] = _mm512_dpbf16_ps(c[1], av, b1);
            }
        }
        for (r, c) in c.iter().enumerate() {
            let row = out.add((r0 + r) * ldc);
            if beta == 0.0 {
                _mm512_storeu_ps(row, c[0]);
                _mm512_storeu_ps(row.add(16), c[1]);
            } else {
                let b = _mm512_set1_ps(beta);
                _mm512_storeu_ps(row, _mm512_fmadd_ps(b, _mm512_loadu_ps(row), c[0]));
                _mm512_storeu_ps(
                    row.add(16),
                    _mm512_fmadd_ps(b, _mm512_loadu_ps(row.add(16)), c[1]),
                );
            }
        }
    }
}

/// Writes the valid part of a 32×32 block at (r0, c0) into the `m × n` output, or at
/// (c0, r0) into its `n × m` transpose.
///
/// SAFETY: `out` points at `m · n` f32 and no other task writes this block.
#[allow(clippy::too_many_arguments)]
unsafe fn store(
    acc: &[f32; B * B],
    out: Out,
    r0: usize,
    c0: usize,
    m: usize,
    n: usize,
    beta: f32,
    transposed: bool,
) {
    let (rows, cols) = ((m - r0).min(B), (n - c0).min(B));
    // Through raw pointers: with beta = 0 the output may be memory not yet written.
    if transposed && rows == B && cols == B && avx512() {
        return store_transposed(acc, out.0.add(c0 * m + r0), m, beta);
    }
    if transposed {
        for c in 0..cols {
            let dst = out.0.add((c0 + c) * m + r0);
            for r in 0..rows {
                let (s, d) = (acc[r * B + c], dst.add(r));
                d.write(if beta == 0.0 { s } else { s + beta * d.read() });
            }
        }
        return;
    }
    for r in 0..rows {
        let dst = out.0.add((r0 + r) * n + c0);
        let src = &acc[r * B..r * B + cols];
        if beta == 0.0 && cols == B {
            // A whole row as one 128-byte value: two vector stores, where the copy of
            // a length known only at run time was a call to memcpy per row (2 % of a
            // bf16 DCGAN epoch's samples).
            dst.cast::<[f32; B]>()
                .write_unaligned(src.as_ptr().cast::<[f32; B]>().read());
        } else if beta == 0.0 {
            for (j, &s) in src.iter().enumerate() {
                dst.add(j).write(s);
            }
        } else {
            // With beta ≠ 0 the output holds values: as a slice, so the loop is vectorised.
            let dst = std::slice::from_raw_parts_mut(dst, cols);
            dst.iter_mut().zip(src).for_each(|(d, s)| *d = s + beta * *d);
        }
    }
}
/// Whether the CPU has AVX512F (and BW): the vector forms of the packing and of the
/// transposed store.
fn avx512() -> bool {
    static AVX512: OnceLock<bool> = OnceLock::new();
    *AVX512.get_or_init(|| is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw"))
}

/// A whole 32 × 32 block written transposed: `dst[c · ldd + r] = acc[r][c] + beta ·
/// dst[…]`, as four 16 × 16 transposes in registers. (A value at a time, 32 values
/// apart, it was 3 % of a bf16 WGAN epoch: the weight gradient of a convolution is
/// computed transposed, [`gemm_rows_t`].)
///
/// SAFETY: AVX512F; `dst` points at 32 rows of 32 f32 `ldd` apart, initialised
/// unless `beta` is 0, that no other task writes.
#[target_feature(enable = "avx512f")]
unsafe fn store_transposed(acc: &[f32; B * B], dst: *mut f32, ldd: usize, beta: f32) {
    use std::arch::x86_64::*;
    for rb in [0, 16] {
        for cb in [0, 16] {
            let r: [__m512; 16] =
                std::array::from_fn(|i| _mm512_loadu_ps(acc.as_ptr().add((rb + i) * B + cb)));
            for (c, col) in super::transpose16(&r).into_iter().enumerate() {
                let d = dst.add((cb + c) * ldd + rb);
                let v = if beta == 0.0 {
                    col
                } else {
                    _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_loadu_ps(d), col)
                };
                _mm512_storeu_ps(d, v);
            }
        }
    }
}
