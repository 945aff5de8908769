//! The distillation losses against PyTorch: values and gradients with respect to the
//! student's logits (fixture: `tests/fixtures/make_distill_reference.py`), and no gradient
//! for the teacher's logits; the same for hidden-state matching.

use candle_core::{DType, Device, Tensor, Var};
use std::collections::HashMap;
use std::path::PathBuf;
use trident_train::distill::KdLoss;

fn reference() -> HashMap<String, Tensor> {
    let f = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/distill_reference.safetensors");
    candle_core::safetensors::load(f, &Device::Cpu).unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    let (a, b) = (
        a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        b.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
    );
    trident_nn::math::max_abs_diff(&a, &b)
}

#[test]
fn losses_and_gradients_match_torch() {
    let r = reference();
    let labels = r["labels"].to_dtype(DType::U32).unwrap();
    let cases = [
        (
            "hinton.T1",
            KdLoss::Soft {
                temperature: 1.0,
                alpha: 0.7,
            },
        ),
        (
            "hinton.T4",
            KdLoss::Soft {
                temperature: 4.0,
                alpha: 0.7,
            },
        ),
        ("hard", KdLoss::Hard {}),
    ];
    for (name, loss) in cases {
        let s = Var::from_tensor(&r["student"]).unwrap();
        let t = Var::from_tensor(&r["teacher"]).unwrap();
        let l = loss.compute(s.as_tensor(), t.as_tensor(), &labels).unwrap();
        let want = r[&format!("{name}.loss")].to_vec1::<f32>().unwrap()[0];
        let got = l.to_scalar::<f32>().unwrap();
        assert!(
            (got - want).abs() <= 1e-5 * want.abs().max(1.0),
            "{name}: loss {got} vs torch {want}"
        );
        let grads = l.backward().unwrap();
        let ds = grads.get(s.as_tensor()).expect("student gradient");
        let d = max_diff(ds, &r[&format!("{name}.grad")]);
        assert!(d <= 1e-6, "{name}: gradient differs from torch by {d}");
        assert!(
            grads.get(t.as_tensor()).is_none(),
            "{name}: the teacher's logits got a gradient"
        );
    }
    // The KL term alone.
    let s = Var::from_tensor(&r["student"]).unwrap();
    let kl = trident_nn::ops::distill_kl(s.as_tensor(), &r["teacher"], 4.0).unwrap();
    let want = r["kl.T4.loss"].to_vec1::<f32>().unwrap()[0];
    assert!(
        (kl.to_scalar::<f32>().unwrap() - want).abs() <= 1e-6,
        "KL at T = 4"
    );
    let ds = kl.backward().unwrap().get(s.as_tensor()).unwrap().clone();
    assert!(max_diff(&ds, &r["kl.T4.grad"]) <= 1e-7);

    // Hidden-state matching over the real tokens of a padded batch.
    let hs = Var::from_tensor(&r["hidden.student"]).unwrap();
    let ht = Var::from_tensor(&r["hidden.teacher"]).unwrap();
    let mse = trident_train::distill::hidden_mse(hs.as_tensor(), ht.as_tensor(), &r["hidden.mask"]).unwrap();
    let want = r["hidden.loss"].to_vec1::<f32>().unwrap()[0];
    let got = mse.to_scalar::<f32>().unwrap();
    assert!(
        (got - want).abs() <= 1e-5 * want,
        "hidden MSE {got} vs torch {want}"
    );
    let grads = mse.backward().unwrap();
    let d = max_diff(grads.get(hs.as_tensor()).unwrap(), &r["hidden.grad"]);
    assert!(d <= 1e-6, "hidden MSE gradient differs from torch by {d}");
    assert!(
        grads.get(ht.as_tensor()).is_none(),
        "the teacher's states got a gradient"
    );
}

#[test]
fn bad_parameters_are_refused() {
    let e = KdLoss::Soft {
        temperature: 0.0,
        alpha: 0.5,
    }
    .validate()
    .unwrap_err();
    assert!(e.contains("distill.temperature"), "{e}");
    let e = KdLoss::Soft {
        temperature: 2.0,
        alpha: 1.5,
    }
    .validate()
    .unwrap_err();
    assert!(e.contains("distill.alpha"), "{e}");
    let s = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
    let t = Tensor::zeros((2, 4), DType::F32, &Device::Cpu).unwrap();
    let e = trident_nn::ops::distill_kl(&s, &t, 1.0).unwrap_err().to_string();
    assert!(e.contains("differ in shape"), "{e}");
}
