//! The vendored candle-core's backward pass (`vendor/candle-core.patch`): a node's first
//! gradient is stored as it is when contiguous, a strided one (a broadcast, a transpose)
//! still added into zeros, later ones added. These check the gradients each path gives, and
//! that every stored gradient is contiguous (the fused kernels read them as slices).

use candle_core::{Device, Tensor, Var};

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

fn var(v: &[f32], shape: (usize, usize)) -> Var {
    Var::from_tensor(&Tensor::from_slice(v, shape, &Device::Cpu).unwrap()).unwrap()
}

#[test]
fn first_and_later_gradients_sum_whatever_their_layout() {
    let x = var(&[1.0, -2.0, 3.0, 0.5, -1.5, 2.5], (2, 3));
    let w = var(&[0.5, -1.0, 2.0, 1.5, -0.5, 1.0], (3, 2));
    let xt = x.as_tensor();
    // x reaches the loss four ways: through a product (a contiguous first gradient), a
    // transpose (strided), a subtraction (negated) and a plain sum (a broadcast).
    let loss = (xt.matmul(w.as_tensor()).unwrap().sum_all().unwrap()
        + (xt.t().unwrap() * 3.0).unwrap().sum_all().unwrap()
        + (1.0 - xt).unwrap().sum_all().unwrap()
        + xt.sum_all().unwrap())
    .unwrap();
    let grads = loss.backward().unwrap();
    let gx = grads.get(xt).unwrap();
    assert!(gx.is_contiguous());
    // d/dx: rows of w summed (0.5 - 1, 2 + 1.5, -0.5 + 1) = (-0.5, 3.5, 0.5), then + 3 - 1 + 1.
    let want: Vec<f32> = [-0.5f32, 3.5, 0.5].iter().map(|v| v + 3.0).collect();
    assert_eq!(values(gx), [want.clone(), want].concat());
    let gw = grads.get(w.as_tensor()).unwrap();
    assert!(gw.is_contiguous());
    // d/dw[i][j] = Σ_rows x[r][i] = (1.5, -3.5, 5.5) for both columns.
    assert_eq!(values(gw), [1.5, 1.5, -3.5, -3.5, 5.5, 5.5]);
}

#[test]
fn a_lone_strided_or_negated_first_gradient_is_stored_contiguous() {
    let x = var(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], (2, 3));
    // Only a broadcast reaches x: candle's `contiguous()` of it was the slow path avoided.
    let g = x.as_tensor().mean_all().unwrap().backward().unwrap();
    let gx = g.get(x.as_tensor()).unwrap();
    assert!(gx.is_contiguous());
    assert_eq!(values(gx), [1.0 / 6.0; 6]);
    // Only a transpose, then a subtraction from a constant: strided, then negated.
    let c = Tensor::from_slice(&[1f32, 2., 3., 4., 5., 6.], (3, 2), &Device::Cpu).unwrap();
    let y = (c - x.as_tensor().t().unwrap()).unwrap();
    let r = Tensor::from_slice(&[1f32, 10., 100., 1000., 1e4, 1e5], (3, 2), &Device::Cpu).unwrap();
    let g = (y * r).unwrap().sum_all().unwrap().backward().unwrap();
    let gx = g.get(x.as_tensor()).unwrap();
    assert!(gx.is_contiguous());
    // x[i][j] sits at y[j][i]: its gradient is −r[j][i].
    assert_eq!(values(gx), [-1.0, -100.0, -1e4, -10.0, -1000.0, -1e5]);
}
