//! Single-precision GEMM for the dense layers: OpenBLAS when the machine has it, the `gemm`
//! crate (candle's own kernel) otherwise.
//!
//! Why not candle's matmul: measured here on the MiniLM feed-forward shape
//! (1024 × 384 · 384 × 1536, 2 threads) candle 0.11's matmul reaches 40 GFLOP/s, Debian's
//! OpenBLAS 0.3.21 175–190 GFLOP/s and PyTorch 195 (`examples/gemm_layouts.rs`,
//! `docs/PERFORMANCE.md`). Training time is mostly GEMM, so this is the first lever.
//!
//! OpenBLAS is loaded at run time (`libloading`) rather than linked, for two reasons:
//! - OpenBLAS picks its kernels in a library constructor from the CPU model, and on virtual
//!   machines that hide the model (this one reports "Intel Xeon Processor") it falls back to
//!   its generic "Prescott" kernels at 57 GFLOP/s. Loading it ourselves lets us set
//!   `OPENBLAS_CORETYPE` from the instruction sets the CPU actually reports first (unless
//!   the user already set it).
//! - A machine without OpenBLAS still runs, on the `gemm` crate.
//!
//! OpenBLAS runs single-threaded here; [`gemm`] splits the rows of the output across
//! rayon's pool instead, so the process has one thread pool (the rest of our kernels and
//! candle's use rayon) and two pools never spin against each other on few cores.
//!
//! Which library: on Intel CPUs Intel MKL's single dynamic library (`libmkl_rt`, e.g. from
//! PyPI's `mkl` wheel, found in the loader's path or where pip installs it) when it is
//! there, OpenBLAS otherwise; on other CPUs OpenBLAS. On an Intel Xeon without AMX, MKL's
//! products made the MiniLM training step 1.26–1.41x faster than OpenBLAS's SkylakeX
//! kernels; on AMD EPYC Zen 4 the two are level (`docs/PERFORMANCE.md`). MKL runs
//! sequentially for the same reason as OpenBLAS, and in its conditional-reproducibility
//! mode (`MKL_CBWR=AUTO` unless the user set it) so that a result does not depend on how a
//! buffer happens to be aligned: a resumed run repeats the uninterrupted one exactly.
//! `TRIDENT_BLAS=mkl` or `=openblas` picks one (and nothing else), `=off` the `gemm` crate,
//! `=/path/libopenblas.so` a library.

use rayon::prelude::*;
use std::mem::MaybeUninit;
use std::sync::OnceLock;

type SgemmFn = unsafe extern "C" fn(
    order: i32,
    ta: i32,
    tb: i32,
    m: i32,
    n: i32,
    k: i32,
    alpha: f32,
    a: *const f32,
    lda: i32,
    b: *const f32,
    ldb: i32,
    beta: f32,
    c: *mut f32,
    ldc: i32,
);

const ROW_MAJOR: i32 = 101;
const NO_TRANS: i32 = 111;
const TRANS: i32 = 112;

/// A CBLAS library loaded at run time: OpenBLAS or Intel MKL.
struct Cblas {
    sgemm: SgemmFn,
    /// Intel MKL (else OpenBLAS or a library the user named).
    mkl: bool,
    description: String,
    // Keeps the library mapped for the life of the process.
    _lib: libloading::Library,
}

static BLAS: OnceLock<Option<Cblas>> = OnceLock::new();

/// OpenBLAS's kernel family for this CPU, from the instruction sets it reports.
fn core_type() -> Option<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512dq")
        {
            return Some("SkylakeX");
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            return Some("Haswell");
        }
    }
    None
}

/// A library to look for.
#[derive(Debug, PartialEq)]
enum Library {
    Mkl,
    OpenBlas,
    /// A file the user named.
    Path(String),
}

/// The libraries to try, in order, for `TRIDENT_BLAS=choice` (empty: unset) on an Intel CPU
/// or not.
fn library_order(choice: &str, intel: bool) -> Vec<Library> {
    match choice.to_ascii_lowercase().as_str() {
        "" if intel => vec![Library::Mkl, Library::OpenBlas],
        "" => vec![Library::OpenBlas],
        "off" => vec![],
        "mkl" => vec![Library::Mkl],
        "openblas" => vec![Library::OpenBlas],
        _ => vec![Library::Path(choice.to_string())],
    }
}

/// Whether the CPU's vendor is Intel (`GenuineIntel`).
fn intel_cpu() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let r = std::arch::x86_64::__cpuid(0);
        let vendor: Vec<u8> = [r.ebx, r.edx, r.ecx]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        vendor == b"GenuineIntel"
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

fn load() -> Option<Cblas> {
    let choice = std::env::var("TRIDENT_BLAS").unwrap_or_default();
    let intel = intel_cpu();
    let order = library_order(&choice, intel);
    // Why this library, for the start-up line.
    let why = match (choice.is_empty(), intel) {
        (false, _) => format!("TRIDENT_BLAS={choice}"),
        (true, true) => "Intel CPU: MKL first, TRIDENT_BLAS=openblas for OpenBLAS".into(),
        (true, false) => String::new(),
    };
    if order.contains(&Library::OpenBlas) {
        set_openblas_core_type();
    }
    let may_be_mkl = order.iter().any(|l| *l != Library::OpenBlas);
    if may_be_mkl && std::env::var_os("MKL_CBWR").is_none() {
        // Read by MKL when it first runs; this runs once, before any MKL code exists in the
        // process.
        std::env::set_var("MKL_CBWR", "AUTO");
    }
    // MKL comes first where it is tried, so anything else found means it was missing.
    let wanted_mkl = order.contains(&Library::Mkl);
    for library in order {
        let names = match library {
            Library::Mkl => mkl_candidates(),
            Library::OpenBlas => vec![
                "libopenblas.so.0".into(),
                "libopenblas.so".into(),
                "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0".into(),
                "libopenblas.dylib".into(),
            ],
            Library::Path(p) => vec![p],
        };
        if let Some(mut found) = names.into_iter().find_map(|name| open(&name)) {
            let mut notes: Vec<String> = Vec::new();
            if !why.is_empty() {
                notes.push(why.clone());
            }
            if wanted_mkl && !found.mkl {
                notes.push("Intel MKL not found: `pip install mkl` for faster products on Intel CPUs".into());
            }
            if !notes.is_empty() {
                found.description = format!("{} [{}]", found.description, notes.join("; "));
            }
            return Some(found);
        }
    }
    None
}

/// Sets `OPENBLAS_CORETYPE` from this CPU's instruction sets unless the environment chose a
/// family.
fn set_openblas_core_type() {
    // A kernel family the environment chose is kept, but named when this CPU has a better
    // one: an image that sets OPENBLAS_CORETYPE=Haswell runs half as fast on an AVX-512 CPU
    // (measured on AMD EPYC Zen 5: 215 against 410 GFLOP/s).
    if let (Err(_), Some(core)) = (std::env::var("OPENBLAS_CORETYPE"), core_type()) {
        // Read by OpenBLAS's constructor when the library is loaded. This runs once, before
        // any OpenBLAS code exists in the process.
        std::env::set_var("OPENBLAS_CORETYPE", core);
    }
}

/// A note when `OPENBLAS_CORETYPE` names a worse kernel family than this CPU's own.
fn core_type_note() -> String {
    match (std::env::var("OPENBLAS_CORETYPE"), core_type()) {
        (Ok(set), Some(best)) if !set.eq_ignore_ascii_case(best) => {
            format!("; OPENBLAS_CORETYPE={set} is set, this CPU has {best} kernels: unset it to use them")
        }
        _ => String::new(),
    }
}

/// Opens the CBLAS library `name` (MKL or OpenBLAS, told apart by their own symbols) and
/// sets it to run on the calling thread.
fn open(name: &str) -> Option<Cblas> {
    // SAFETY: loading OpenBLAS or MKL runs its constructor, which only sets up its kernels
    // and buffers; the symbols below have the C signatures of their cblas.h / mkl.h.
    let lib = unsafe { libloading::Library::new(name) }.ok()?;
    let sgemm = *unsafe { lib.get::<SgemmFn>(b"cblas_sgemm\0") }.ok()?;
    // MKL: sequential (`MKL_THREADING_SEQUENTIAL`), set before any other MKL call.
    if let Ok(set_layer) =
        unsafe { lib.get::<unsafe extern "C" fn(i32) -> i32>(b"MKL_Set_Threading_Layer\0") }
    {
        unsafe { set_layer(1) };
        return Some(Cblas {
            sgemm,
            mkl: true,
            description: format!("Intel MKL ({name}, sequential)"),
            _lib: lib,
        });
    }
    let core = unsafe {
        if let Ok(set_threads) = lib.get::<unsafe extern "C" fn(i32)>(b"openblas_set_num_threads\0") {
            set_threads(1);
        }
        match lib.get::<unsafe extern "C" fn() -> *const std::os::raw::c_char>(b"openblas_get_corename\0") {
            Ok(f) => {
                let p = f();
                if p.is_null() {
                    String::from("?")
                } else {
                    std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
                }
            }
            Err(_) => String::from("?"),
        }
    };
    Some(Cblas {
        sgemm,
        mkl: false,
        description: format!("OpenBLAS ({name}, {core} kernels{})", core_type_note()),
        _lib: lib,
    })
}

/// Where MKL's `libmkl_rt` is looked for: the loader's own search path, then the
/// `lib` folder of each Python environment pip may have installed the `mkl` wheel into.
fn mkl_candidates() -> Vec<String> {
    let names = ["libmkl_rt.so.3", "libmkl_rt.so.2", "libmkl_rt.so"];
    let mut out: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    for prefix in trident_data::python::prefixes() {
        for n in names {
            let path = prefix.join("lib").join(n);
            if path.is_file() {
                out.push(path.display().to_string());
            }
        }
    }
    out
}

fn blas() -> Option<&'static Cblas> {
    BLAS.get_or_init(load).as_ref()
}

/// Which GEMM the dense layers use, for logs and benchmark reports.
pub fn backend() -> String {
    match blas() {
        Some(b) => b.description.clone(),
        None => "gemm crate (no OpenBLAS or MKL found, or TRIDENT_BLAS=off)".into(),
    }
}

/// One operand of a GEMM: a row-major matrix in `data` with leading dimension `ld`, used
/// transposed when `trans`.
#[derive(Clone, Copy)]
pub struct Mat<'a> {
    /// The elements, row-major.
    pub data: &'a [f32],
    /// Distance between the starts of consecutive stored rows.
    pub ld: usize,
    /// Use the stored matrix transposed.
    pub trans: bool,
}

impl<'a> Mat<'a> {
    /// A contiguous `rows × cols` matrix (as stored), used as is.
    pub fn new(data: &'a [f32], cols: usize) -> Self {
        Mat {
            data,
            ld: cols,
            trans: false,
        }
    }

    /// The same storage used transposed.
    pub fn t(self) -> Self {
        Mat {
            trans: !self.trans,
            ..self
        }
    }

    /// Elements needed for op(self) of shape `rows × cols`.
    fn need(&self, rows: usize, cols: usize) -> usize {
        let (r, c) = if self.trans { (cols, rows) } else { (rows, cols) };
        if r == 0 || c == 0 {
            0
        } else {
            (r - 1) * self.ld + c
        }
    }

    /// op(self) restricted to rows `r0..` (of op(self)).
    fn rows_from(self, r0: usize) -> Self {
        let off = if self.trans { r0 } else { r0 * self.ld };
        Mat {
            data: &self.data[off.min(self.data.len())..],
            ..self
        }
    }
}

/// Panics unless every operand covers what a GEMM of these dimensions reads or writes:
/// the kernels below are unsafe code that trusts these extents.
fn check_extents(m: usize, n: usize, k: usize, a: &Mat, b: &Mat, c_len: usize, ldc: usize) {
    assert!(a.data.len() >= a.need(m, k), "gemm: lhs too short");
    assert!(b.data.len() >= b.need(k, n), "gemm: rhs too short");
    assert!(ldc >= n, "gemm: output rows overlap");
    assert!(m == 0 || c_len >= (m - 1) * ldc + n, "gemm: output too short");
}

/// `c = alpha · op(a) · op(b) + beta · c` for `c` of shape `m × n` (row-major, leading
/// dimension `n`), `op(a)`: `m × k`, `op(b)`: `k × n`, on the calling thread.
#[allow(clippy::too_many_arguments)]
pub fn gemm_serial(m: usize, n: usize, k: usize, alpha: f32, a: Mat, b: Mat, beta: f32, c: &mut [f32]) {
    gemm_serial_ld(m, n, k, alpha, a, b, beta, c, n)
}

/// [`gemm_serial`] into rows of `c` that are `ldc` apart (a column block of a wider matrix).
#[allow(clippy::too_many_arguments)]
pub fn gemm_serial_ld(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: Mat,
    b: Mat,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
) {
    check_extents(m, n, k, &a, &b, c.len(), ldc);
    // SAFETY: `c` is initialised and as long as checked.
    unsafe { gemm_serial_raw(m, n, k, alpha, a, b, beta, c.as_mut_ptr(), ldc) }
}

/// `c = alpha · op(a) · op(b)` ([`gemm_serial`] with `beta = 0`) into an output that need
/// not be initialised: every one of its `m × n` values is written, as BLAS does with
/// `beta = 0` (it reads nothing of `c`), so a new output is not zero-filled first.
pub fn gemm_serial_into(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: Mat,
    b: Mat,
    c: &mut [MaybeUninit<f32>],
) {
    check_extents(m, n, k, &a, &b, c.len(), n);
    // SAFETY: as long as checked; with beta = 0 nothing of `c` is read, only written.
    unsafe { gemm_serial_raw(m, n, k, alpha, a, b, 0.0, c.as_mut_ptr().cast(), n) }
}

/// The serial product into `c`, rows `ldc` apart.
///
/// # Safety
/// [`check_extents`] passed for `c`'s length; `c` is valid for writes over that extent
/// and, unless `beta` is 0, initialised (it is read only then).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_serial_raw(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: Mat,
    b: Mat,
    beta: f32,
    c: *mut f32,
    ldc: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // beta = 0 ignores what `c` held (it may be an unwritten buffer), as BLAS does.
        for i in 0..m {
            for j in 0..n {
                // SAFETY: (i, j) lies in the checked extent; read only when beta ≠ 0.
                unsafe {
                    let v = c.add(i * ldc + j);
                    v.write(if beta == 0.0 { 0.0 } else { v.read() * beta });
                }
            }
        }
        return;
    }
    if let Some(blas) = blas() {
        let dim = |v: usize| i32::try_from(v).expect("gemm: dimension exceeds i32");
        // SAFETY: check_extents (the caller's): every operand covers the extent OpenBLAS
        // reads or writes for these dimensions and leading dimensions.
        unsafe {
            (blas.sgemm)(
                ROW_MAJOR,
                if a.trans { TRANS } else { NO_TRANS },
                if b.trans { TRANS } else { NO_TRANS },
                dim(m),
                dim(n),
                dim(k),
                alpha,
                a.data.as_ptr(),
                dim(a.ld.max(1)),
                b.data.as_ptr(),
                dim(b.ld.max(1)),
                beta,
                c,
                dim(ldc),
            )
        }
        return;
    }
    // SAFETY: the caller's extents.
    unsafe { gemm_crate(m, n, k, alpha, a, b, beta, c, ldc, gemm::Parallelism::None) }
}

/// The `gemm` crate's product into `c`.
///
/// # Safety
/// As [`gemm_serial_raw`]: extents checked, `c` writable over them, read only when
/// `beta` ≠ 0.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_crate(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: Mat,
    b: Mat,
    beta: f32,
    c: *mut f32,
    ldc: usize,
    par: gemm::Parallelism,
) {
    // (row stride, column stride) of op(x) in elements.
    let strides = |x: &Mat| {
        if x.trans {
            (1isize, x.ld as isize)
        } else {
            (x.ld as isize, 1isize)
        }
    };
    let (a_rs, a_cs) = strides(&a);
    let (b_rs, b_cs) = strides(&b);
    // SAFETY: the callers ran check_extents; `gemm` computes
    // dst = alpha_gemm · dst + beta_gemm · lhs · rhs, so our (alpha, beta) swap places.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            1,
            ldc as isize,
            beta != 0.0,
            a.data.as_ptr(),
            a_cs,
            a_rs,
            b.data.as_ptr(),
            b_cs,
            b_rs,
            beta,
            alpha,
            false,
            false,
            false,
            par,
        )
    }
}

/// Work below this many multiply-adds runs on one thread.
const PAR_MIN_FLOP: usize = 1 << 18;

/// [`gemm_serial`] with the rows of `c` split across rayon's threads.
#[allow(clippy::too_many_arguments)]
pub fn gemm(m: usize, n: usize, k: usize, alpha: f32, a: Mat, b: Mat, beta: f32, c: &mut [f32]) {
    check_extents(m, n, k, &a, &b, c.len(), n);
    // SAFETY: as long as checked, and initialised.
    unsafe { gemm_raw(m, n, k, alpha, a, b, beta, c.as_mut_ptr()) }
}

/// [`gemm`] with `beta = 0` into an output that need not be initialised: every one of its
/// `m × n` values is written, none is read (a new gradient is not zero-filled first).
pub fn gemm_into(m: usize, n: usize, k: usize, alpha: f32, a: Mat, b: Mat, c: &mut [MaybeUninit<f32>]) {
    check_extents(m, n, k, &a, &b, c.len(), n);
    // SAFETY: as long as checked; with beta = 0 nothing of `c` is read, only written.
    unsafe { gemm_raw(m, n, k, alpha, a, b, 0.0, c.as_mut_ptr().cast()) }
}

/// An output pointer shared by the tasks of one product, each writing its own disjoint
/// block of the output (rows here, 32 × 32 blocks in [`crate::bf16`]).
#[derive(Clone, Copy)]
pub(crate) struct SharedOut(pub(crate) *mut f32);
// SAFETY: the tasks sharing one write disjoint parts of the output.
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// The output from value `i` on (a method, so closures capture the whole pointer).
    pub(crate) fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

/// [`gemm`] into `c` (`m × n`, row-major).
///
/// # Safety
/// [`check_extents`] passed for `c`'s length; `c` is valid for writes over `m · n` values
/// and, unless `beta` is 0, initialised.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_raw(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: Mat,
    b: Mat,
    beta: f32,
    c: *mut f32,
) {
    let threads = rayon::current_num_threads();
    if threads <= 1 || m * n * k < PAR_MIN_FLOP || m < 2 {
        return gemm_serial_raw(m, n, k, alpha, a, b, beta, c, n);
    }
    if blas().is_none() {
        return gemm_crate(
            m,
            n,
            k,
            alpha,
            a,
            b,
            beta,
            c,
            n,
            gemm::Parallelism::Rayon(threads),
        );
    }
    // Blocks of rows, a multiple of 8 so the kernels' row panels stay whole.
    let block = m.div_ceil(threads).div_ceil(8) * 8;
    let out = SharedOut(c);
    (0..m.div_ceil(block)).into_par_iter().for_each(move |i| {
        let rows = block.min(m - i * block);
        // SAFETY: rows i·block.. of `c`, inside it and written by this task alone.
        unsafe {
            gemm_serial_raw(
                rows,
                n,
                k,
                alpha,
                a.rows_from(i * block),
                b,
                beta,
                out.at(i * block * n),
                n,
            )
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(m: usize, n: usize, k: usize, a: Mat, b: Mat) -> Vec<f32> {
        let at = |x: &Mat, r: usize, c: usize| {
            if x.trans {
                x.data[c * x.ld + r]
            } else {
                x.data[r * x.ld + c]
            }
        };
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).map(|p| at(&a, i, p) * at(&b, p, j)).sum();
            }
        }
        out
    }

    #[test]
    fn mkl_comes_first_on_intel_cpus_only_unless_the_user_chose() {
        use Library::*;
        assert_eq!(library_order("", true), [Mkl, OpenBlas]);
        assert_eq!(library_order("", false), [OpenBlas]);
        for intel in [true, false] {
            assert_eq!(library_order("mkl", intel), [Mkl]);
            assert_eq!(library_order("MKL", intel), [Mkl]);
            assert_eq!(library_order("openblas", intel), [OpenBlas]);
            assert_eq!(library_order("off", intel), []);
            assert_eq!(
                library_order("/opt/libblas.so", intel),
                [Path("/opt/libblas.so".into())]
            );
        }
    }

    #[test]
    fn every_transpose_combination_matches_a_naive_product() {
        let (m, n, k) = (131, 70, 40); // above PAR_MIN_FLOP: the row-split path runs
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 104729) % 89) as f32 / 89.0 - 0.5)
            .collect();
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            // op(a) is m × k, op(b) k × n, each stored transposed when flagged.
            let am = if ta { Mat::new(&a, m).t() } else { Mat::new(&a, k) };
            let bm = if tb { Mat::new(&b, k).t() } else { Mat::new(&b, n) };
            let want = naive(m, n, k, am, bm);
            let mut got = vec![1f32; m * n];
            gemm(m, n, k, 1.0, am, bm, 0.0, &mut got);
            let err = crate::math::max_abs_diff(&want, &got);
            assert!(err < 1e-4, "ta={ta} tb={tb}: max error {err}");
            // The fallback kernel, whichever backend this machine uses.
            let mut fallback = vec![1f32; m * n];
            // SAFETY: `fallback` holds the m × n values.
            unsafe {
                gemm_crate(
                    m,
                    n,
                    k,
                    1.0,
                    am,
                    bm,
                    0.0,
                    fallback.as_mut_ptr(),
                    n,
                    gemm::Parallelism::Rayon(2),
                )
            };
            let err = crate::math::max_abs_diff(&want, &fallback);
            assert!(err < 1e-4, "gemm crate ta={ta} tb={tb}: max error {err}");
            // Into an output that was never written (NaN-filled in test builds), serially.
            // SAFETY: the product writes all m × n values.
            let fresh =
                unsafe { crate::scratch::written(m * n, |c| gemm_serial_into(m, n, k, 1.0, am, bm, c)) };
            let err = crate::math::max_abs_diff(&want, &fresh);
            assert!(err < 1e-4, "into ta={ta} tb={tb}: max error {err}");
            // The same split over the threads.
            // SAFETY: the product writes all m × n values.
            let fresh = unsafe { crate::scratch::written(m * n, |c| gemm_into(m, n, k, 1.0, am, bm, c)) };
            let err = crate::math::max_abs_diff(&want, &fresh);
            assert!(err < 1e-4, "parallel into ta={ta} tb={tb}: max error {err}");
            // beta = 1 accumulates.
            gemm(m, n, k, 1.0, am, bm, 1.0, &mut got);
            let twice: Vec<f32> = want.iter().map(|x| 2.0 * x).collect();
            let err = crate::math::max_abs_diff(&twice, &got);
            assert!(err < 1e-4, "ta={ta} tb={tb} accumulate: max error {err}");
        }
    }
}
