//! Principal-component projection of an embedding table: a narrower student starts from
//! its teacher's token embeddings projected onto their `k` leading principal components,
//! the best rank-`k` linear summary of them (what "initialised from the teacher where
//! shapes allow" can still mean once the width shrinks).

use candle_core::{DType, Result, Tensor, D};

/// `table` `[rows, dim]` centred and projected onto its `k` leading principal directions:
/// `[rows, k]`, columns in decreasing order of variance. See [`basis`].
pub fn project(table: &Tensor, k: usize) -> Result<Tensor> {
    let (mean, b) = basis(table, k)?;
    table.to_dtype(DType::F32)?.broadcast_sub(&mean)?.matmul(&b)
}

/// The mean `[1, dim]` of `table`'s rows and its `k` leading principal directions as the
/// columns of `[dim, k]`, in decreasing order of variance: subspace iteration on the
/// `dim × dim` covariance (deterministic start, 50 rounds), orthonormalised by modified
/// Gram–Schmidt. Tables summed with this one (BERT's position embeddings) are projected
/// with the same directions.
pub fn basis(table: &Tensor, k: usize) -> Result<(Tensor, Tensor)> {
    let x = table.to_dtype(DType::F32)?;
    let (rows, dim) = x.dims2()?;
    if k == 0 || k > dim || rows == 0 {
        candle_core::bail!("pca: cannot keep {k} components of a {rows}×{dim} table")
    }
    let mean = x.mean_keepdim(0)?;
    let xc = x.broadcast_sub(&mean)?;
    let cov = xc.t()?.matmul(&xc)?.affine(1.0 / rows as f64, 0.0)?;
    // Deterministic start: a fixed pseudo-random dim × k matrix.
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let start: Vec<f32> = (0..dim * k)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect();
    let mut q = orthonormal(start, dim, k);
    for _ in 0..50 {
        let z = cov.matmul(&Tensor::from_vec(q, (dim, k), x.device())?)?;
        q = orthonormal(z.flatten_all()?.to_vec1::<f32>()?, dim, k);
    }
    let b = Tensor::from_vec(q, (dim, k), x.device())?;
    // Order the directions by the variance they carry.
    let var: Vec<f32> = xc.matmul(&b)?.sqr()?.mean(0)?.to_vec1()?;
    let mut order: Vec<u32> = (0..k as u32).collect();
    order.sort_by(|&a, &c| var[c as usize].total_cmp(&var[a as usize]));
    Ok((mean, b.index_select(&Tensor::new(order, x.device())?, D::Minus1)?))
}

/// Orthonormal columns from the row-major `dim × k` matrix `m` (modified Gram–Schmidt in
/// f64); a column that vanishes is replaced by a unit vector.
fn orthonormal(m: Vec<f32>, dim: usize, k: usize) -> Vec<f32> {
    let mut cols: Vec<Vec<f64>> = (0..k)
        .map(|j| (0..dim).map(|i| m[i * k + j] as f64).collect())
        .collect();
    for j in 0..k {
        let (done, rest) = cols.split_at_mut(j);
        let c = &mut rest[0];
        for p in done.iter() {
            let dot: f64 = c.iter().zip(p).map(|(a, b)| a * b).sum();
            c.iter_mut().zip(p).for_each(|(a, b)| *a -= dot * b);
        }
        let norm = c.iter().map(|v| v * v).sum::<f64>().sqrt();
        if norm < 1e-12 {
            *c = (0..dim).map(|i| if i == j { 1.0 } else { 0.0 }).collect();
        } else {
            c.iter_mut().for_each(|v| *v /= norm);
        }
    }
    let mut out = vec![0f32; dim * k];
    for (j, c) in cols.iter().enumerate() {
        for (i, v) in c.iter().enumerate() {
            out[i * k + j] = *v as f32;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn the_leading_components_keep_the_variance_of_a_low_rank_table() {
        // 200 points on a 2-D plane in 6-D (variances 9 and 1 along it), plus a little noise.
        let (rows, dim) = (200, 6);
        let mut s = 7u64;
        let mut r = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        let u = [0.5f32, 0.5, 0.5, 0.5, 0.0, 0.0];
        let v = [0.0f32, 0.0, 0.0, 0.0, 0.6, 0.8];
        let mut data = Vec::new();
        for _ in 0..rows {
            let (a, b) = (r() * 10.4, r() * 3.46);
            for i in 0..dim {
                data.push(3.0 + a * u[i] + b * v[i] + 0.01 * r());
            }
        }
        let x = Tensor::from_vec(data, (rows, dim), &Device::Cpu).unwrap();
        let p = project(&x, 2).unwrap();
        assert_eq!(p.dims(), [rows, 2]);
        let var: Vec<f32> = p.sqr().unwrap().mean(0).unwrap().to_vec1().unwrap();
        let total: f32 = x
            .broadcast_sub(&x.mean_keepdim(0).unwrap())
            .unwrap()
            .sqr()
            .unwrap()
            .mean(0)
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        // Two components hold (almost) all the variance, the larger first.
        assert!(
            var[0] > var[1] && var[0] + var[1] > 0.999 * total,
            "{var:?} of {total}"
        );
        // Centred: every column has mean ≈ 0.
        let mean: Vec<f32> = p.mean(0).unwrap().to_vec1().unwrap();
        assert!(mean.iter().all(|m| m.abs() < 1e-4), "{mean:?}");
        assert!(project(&x, 7).is_err());
    }
}
