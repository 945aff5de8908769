//! Helpers of the kernels' tests.

use candle_core::{Device, Result, Tensor};

pub(crate) fn numeric_grad(f: impl Fn(&Tensor) -> Result<Tensor>, x: &[f32], shape: &[usize]) -> Vec<f32> {
    let eps = 1e-2f32;
    (0..x.len())
        .map(|i| {
            let mut p = x.to_vec();
            p[i] += eps;
            let mut m = x.to_vec();
            m[i] -= eps;
            let fp = f(&Tensor::from_vec(p, shape, &Device::Cpu).unwrap())
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            let fm = f(&Tensor::from_vec(m, shape, &Device::Cpu).unwrap())
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            (fp - fm) / (2.0 * eps)
        })
        .collect()
}

pub(crate) fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "element {i}: {x} vs {y}");
    }
}

/// The largest absolute difference between two tensors of the same shape.
pub(crate) fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}
