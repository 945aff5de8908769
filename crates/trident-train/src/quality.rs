//! How close generated samples are to real ones, measured on feature vectors (a trained
//! classifier's penultimate layer): the Fréchet distance between the two Gaussians fitted
//! to them (FID's formula, Heusel et al. 2017), the unbiased squared kernel MMD with KID's
//! cubic polynomial kernel (Bińkowski et al. 2018), and the leave-one-out 1-nearest-neighbour
//! two-sample accuracy (Lopez-Paz & Oquab 2017; 0.5 when the sets are indistinguishable,
//! near 1 when every sample sits among its own kind). Xu et al. 2018 (arXiv:1806.07755)
//! found the last two the most telling "in a suitable feature space".
//!
//! Everything is computed in f64 from f32 features; the pairwise terms run as blocks of
//! matrix products.

use candle_core::{DType, Device, Result, Tensor};

/// Feature vectors: `n` rows of `dim` values.
#[derive(Debug, Clone)]
pub struct Features {
    /// Row-major values.
    pub values: Vec<f32>,
    /// Values per row.
    pub dim: usize,
}

impl Features {
    /// Rows of `dim` values; an error when `values` is not a whole number of rows.
    pub fn new(values: Vec<f32>, dim: usize) -> Result<Self> {
        if dim == 0 || !values.len().is_multiple_of(dim) {
            candle_core::bail!("features: {} values are not rows of {dim}", values.len())
        }
        Ok(Features { values, dim })
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.values.len() / self.dim
    }

    /// No rows.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    fn row(&self, i: usize) -> &[f32] {
        &self.values[i * self.dim..(i + 1) * self.dim]
    }

    /// Mean and (unbiased, `n − 1`) covariance, row-major `dim × dim`.
    pub fn moments(&self) -> (Vec<f64>, Vec<f64>) {
        let (n, d) = (self.len(), self.dim);
        let mut mean = vec![0f64; d];
        for i in 0..n {
            mean.iter_mut()
                .zip(self.row(i))
                .for_each(|(m, &v)| *m += v as f64);
        }
        mean.iter_mut().for_each(|m| *m /= n.max(1) as f64);
        let mut cov = vec![0f64; d * d];
        let mut c = vec![0f64; d];
        for i in 0..n {
            c.iter_mut()
                .zip(self.row(i))
                .zip(&mean)
                .for_each(|((c, &v), m)| *c = v as f64 - m);
            for a in 0..d {
                let ca = c[a];
                let row = &mut cov[a * d..(a + 1) * d];
                row.iter_mut().zip(&c).for_each(|(r, cb)| *r += ca * cb);
            }
        }
        cov.iter_mut().for_each(|v| *v /= (n.max(2) - 1) as f64);
        (mean, cov)
    }

    fn tensor(&self) -> Result<Tensor> {
        Tensor::from_slice(&self.values, (self.len(), self.dim), &Device::Cpu)?.to_dtype(DType::F64)
    }
}

/// The Fréchet distance of `a` and `b`: `‖μa − μb‖² + tr(Ca + Cb − 2 (Ca Cb)^½)`, with the
/// trace of the root from the eigenvalues of `Ca^½ Cb Ca^½` (symmetric, so exact up to
/// rounding where `Ca Cb` itself is not symmetric).
pub fn frechet_distance(a: &Features, b: &Features) -> Result<f64> {
    same_dim(a, b)?;
    let d = a.dim;
    let ((ma, ca), (mb, cb)) = (a.moments(), b.moments());
    let mean_term: f64 = ma.iter().zip(&mb).map(|(x, y)| (x - y).powi(2)).sum();
    let trace = |c: &[f64]| (0..d).map(|i| c[i * d + i]).sum::<f64>();
    let root_a = sym_sqrt(&ca, d);
    let m = matmul(&matmul(&root_a, &cb, d), &root_a, d);
    let (values, _) = sym_eigen(&m, d);
    let cross: f64 = values.iter().map(|v| v.max(0.0).sqrt()).sum();
    Ok(mean_term + trace(&ca) + trace(&cb) - 2.0 * cross)
}

/// The unbiased estimate of the squared MMD of `a` and `b` under the kernel
/// `k(x, y) = (x·y / dim + 1)³` (KID's).
pub fn kernel_mmd2(a: &Features, b: &Features) -> Result<f64> {
    same_dim(a, b)?;
    let (m, n) = (a.len() as f64, b.len() as f64);
    if m < 2.0 || n < 2.0 {
        candle_core::bail!("kernel MMD needs at least two samples on each side")
    }
    let scale = 1.0 / a.dim as f64;
    let kernel = |x: &Tensor, y: &Tensor, same: bool| -> Result<f64> {
        let mut total = 0f64;
        for_blocks(x, y, |block, _, _| {
            let k = block.affine(scale, 1.0)?.powf(3.0)?;
            total += k.sum_all()?.to_scalar::<f64>()?;
            Ok(())
        })?;
        if same {
            // Drop the diagonal k(x, x).
            let diag = x.sqr()?.sum(1)?.affine(scale, 1.0)?.powf(3.0)?.sum_all()?;
            total -= diag.to_scalar::<f64>()?;
        }
        Ok(total)
    };
    let (ta, tb) = (a.tensor()?, b.tensor()?);
    Ok(
        kernel(&ta, &ta, true)? / (m * (m - 1.0)) + kernel(&tb, &tb, true)? / (n * (n - 1.0))
            - 2.0 * kernel(&ta, &tb, false)? / (m * n),
    )
}

/// The leave-one-out 1-nearest-neighbour accuracy of telling `a`'s rows from `b`'s
/// (Euclidean distance): each row of the union is given the set of its nearest other row.
/// 0.5 when the sets are alike; near 1 when they are told apart (or when generated samples
/// copy a few real ones, each then nearest its own copies).
pub fn one_nn_accuracy(a: &Features, b: &Features) -> Result<f64> {
    same_dim(a, b)?;
    let (na, nb) = (a.len(), b.len());
    if na == 0 || nb == 0 {
        candle_core::bail!("1-NN accuracy needs samples on both sides")
    }
    let all = Tensor::cat(&[a.tensor()?, b.tensor()?], 0)?;
    let norms: Vec<f64> = all.sqr()?.sum(1)?.to_vec1()?;
    let n = na + nb;
    // Nearest other row of every row: (squared distance, index).
    let mut best = vec![(f64::INFINITY, usize::MAX); n];
    for_blocks(&all, &all, |dots, r0, c0| {
        let dots: Vec<Vec<f64>> = dots.to_vec2()?;
        for (i, row) in dots.iter().enumerate() {
            let gi = r0 + i;
            for (j, &dot) in row.iter().enumerate() {
                let gj = c0 + j;
                if gi == gj {
                    continue;
                }
                let d = norms[gi] + norms[gj] - 2.0 * dot;
                if d < best[gi].0 {
                    best[gi] = (d, gj);
                }
            }
        }
        Ok(())
    })?;
    let correct = best
        .iter()
        .enumerate()
        .filter(|(i, (_, j))| (*i < na) == (*j < na))
        .count();
    Ok(correct as f64 / n as f64)
}

/// Calls `f(x_block · y_blockᵀ, first row, first column)` over blocks of at most 2,048 × 2,048.
fn for_blocks(x: &Tensor, y: &Tensor, mut f: impl FnMut(Tensor, usize, usize) -> Result<()>) -> Result<()> {
    const B: usize = 2048;
    let (nx, ny) = (x.dim(0)?, y.dim(0)?);
    for r in (0..nx).step_by(B) {
        let xr = x.narrow(0, r, B.min(nx - r))?;
        for c in (0..ny).step_by(B) {
            let yc = y.narrow(0, c, B.min(ny - c))?;
            f(xr.matmul(&yc.t()?)?, r, c)?;
        }
    }
    Ok(())
}

fn same_dim(a: &Features, b: &Features) -> Result<()> {
    if a.dim != b.dim {
        candle_core::bail!("features of {} and {} values cannot be compared", a.dim, b.dim)
    }
    Ok(())
}

fn matmul(a: &[f64], b: &[f64], d: usize) -> Vec<f64> {
    let mut out = vec![0f64; d * d];
    for i in 0..d {
        for k in 0..d {
            let aik = a[i * d + k];
            let (row, bk) = (&mut out[i * d..(i + 1) * d], &b[k * d..(k + 1) * d]);
            row.iter_mut().zip(bk).for_each(|(o, b)| *o += aik * b);
        }
    }
    out
}

/// The symmetric square root `V diag(√max(λ, 0)) Vᵀ` of a symmetric matrix.
fn sym_sqrt(m: &[f64], d: usize) -> Vec<f64> {
    let (values, vectors) = sym_eigen(m, d);
    let mut out = vec![0f64; d * d];
    for (k, &l) in values.iter().enumerate() {
        let s = l.max(0.0).sqrt();
        for i in 0..d {
            let vik = vectors[i * d + k] * s;
            for j in 0..d {
                out[i * d + j] += vik * vectors[j * d + k];
            }
        }
    }
    out
}

/// Eigenvalues and eigenvectors (the columns of a row-major `d × d` matrix) of a
/// symmetric matrix, by cyclic Jacobi rotations until the off-diagonal part is below
/// 1e-14 of the whole. Hand-written: a few dozen lines for the one decomposition this
/// needs, against a linear-algebra crate in the dependency tree.
pub fn sym_eigen(m: &[f64], d: usize) -> (Vec<f64>, Vec<f64>) {
    let mut a = m.to_vec();
    let mut v = vec![0f64; d * d];
    (0..d).for_each(|i| v[i * d + i] = 1.0);
    let total: f64 = a.iter().map(|x| x * x).sum::<f64>().max(f64::MIN_POSITIVE);
    for _sweep in 0..100 {
        let off: f64 = (0..d)
            .flat_map(|i| (0..d).filter(move |&j| j != i).map(move |j| (i, j)))
            .map(|(i, j)| a[i * d + j].powi(2))
            .sum();
        if off <= 1e-28 * total {
            break;
        }
        for p in 0..d {
            for q in p + 1..d {
                let apq = a[p * d + q];
                if apq == 0.0 {
                    continue;
                }
                let (app, aqq) = (a[p * d + p], a[q * d + q]);
                let theta = (aqq - app) / (2.0 * apq);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let t = if theta == 0.0 { 1.0 } else { t };
                let c = 1.0 / (t * t + 1.0).sqrt();
                let s = t * c;
                // A ← Jᵀ A J on rows and columns p, q.
                for k in 0..d {
                    let (akp, akq) = (a[k * d + p], a[k * d + q]);
                    a[k * d + p] = c * akp - s * akq;
                    a[k * d + q] = s * akp + c * akq;
                }
                for k in 0..d {
                    let (apk, aqk) = (a[p * d + k], a[q * d + k]);
                    a[p * d + k] = c * apk - s * aqk;
                    a[q * d + k] = s * apk + c * aqk;
                }
                for k in 0..d {
                    let (vkp, vkq) = (v[k * d + p], v[k * d + q]);
                    v[k * d + p] = c * vkp - s * vkq;
                    v[k * d + q] = s * vkp + c * vkq;
                }
            }
        }
    }
    ((0..d).map(|i| a[i * d + i]).collect(), v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jacobi_diagonalises_a_symmetric_matrix() {
        let m = [4.0, 1.0, 2.0, 1.0, 3.0, 0.5, 2.0, 0.5, 5.0];
        let (l, v) = sym_eigen(&m, 3);
        // V diag(λ) Vᵀ gives the matrix back.
        for i in 0..3 {
            for j in 0..3 {
                let r: f64 = (0..3).map(|k| v[i * 3 + k] * l[k] * v[j * 3 + k]).sum();
                assert!((r - m[i * 3 + j]).abs() < 1e-12, "{r} vs {}", m[i * 3 + j]);
            }
        }
        assert!((l.iter().sum::<f64>() - 12.0).abs() < 1e-12);
    }

    #[test]
    fn a_set_against_itself_is_at_the_floor() {
        let v: Vec<f32> = (0..300)
            .map(|i| (i as f32 * 0.731).sin() * (i as f32 * 0.37).cos())
            .collect();
        let a = Features::new(v, 3).unwrap();
        assert!(frechet_distance(&a, &a).unwrap().abs() < 1e-9);
        // A copy of each row sits at distance 0 from it: every row is told by its twin.
        assert_eq!(one_nn_accuracy(&a, &a).unwrap(), 0.0);
    }
}
