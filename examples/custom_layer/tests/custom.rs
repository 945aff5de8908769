//! The example's layers against finite differences, and a model of them trained, evaluated
//! and refused for export by the `trident-custom` binary, on a table made here.

use std::path::Path;
use std::process::{Command, Output};
use trident_nn::custom::{self, LayerArgs};
use trident_nn::{gradcheck, Ctx, DType, Device, Params, Tensor, Var};

fn registered() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(trident_custom_layer::register);
}

#[test]
fn the_layers_backward_passes_match_finite_differences() {
    registered();
    let x = Var::from_tensor(&Tensor::new(&[[0.3f32, -1.2, 0.8], [1.1, 0.2, -0.5]], &Device::Cpu).unwrap())
        .unwrap();
    let options = serde_json::json!({ "kind": "gated", "out": 4 });
    for kind in ["gated", "swish"] {
        let params = Params::new();
        let pb = params.builder(7, None);
        let (layer, out) = custom::layer(kind).unwrap()(&LayerArgs {
            pb: &pb,
            input: 3,
            options: &options,
        })
        .unwrap();
        assert_eq!(out, if kind == "gated" { 4 } else { 3 });
        let all = params.all();
        let mut vars: Vec<(&str, &Var)> = all.iter().map(|p| (p.name.as_str(), &p.var)).collect();
        vars.push(("x", &x));
        // f32 parameters: a step and tolerance that rounding allows.
        let r = gradcheck(
            || layer.forward(x.as_tensor(), &Ctx::eval()),
            &vars,
            1e-2,
            1e-3,
            1e-2,
        )
        .unwrap();
        assert!(r.passed(), "{kind}: {r}");
    }
    // The hand-written derivative, in f64.
    let x64 = Var::from_tensor(&x.as_tensor().to_dtype(DType::F64).unwrap()).unwrap();
    let f = custom::activation("softsign").unwrap();
    let r = gradcheck(|| f(x64.as_tensor()), &[("x", &x64)], 1e-6, 1e-9, 1e-6).unwrap();
    assert!(r.passed() && r.checked == 6, "{r}");
}

fn custom_bin(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trident-custom"))
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_model_of_custom_layers_trains_from_toml() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    // Two classes by the sign of x0 + x1, a third column of noise, and a category.
    let mut text = String::from("x0,x1,noise,colour,label\n");
    let mut s = 1u64;
    let mut r = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 33) as f64) / (1u64 << 31) as f64 * 2.0 - 1.0
    };
    for _ in 0..200 {
        let (a, b, n) = (r(), r(), r());
        let label = if a + b > 0.0 { "up" } else { "down" };
        let colour = if n > 0.0 { "red" } else { "blue" };
        text.push_str(&format!("{a:.3},{b:.3},{n:.3},{colour},{label}\n"));
    }
    std::fs::write(d.join("t.csv"), text).unwrap();
    std::fs::write(
        d.join("run.toml"),
        r#"
[run]
dir = "run"
[data]
kind = "table"
file = "t.csv"
[loader]
batch_size = 16
num_workers = 0
[model]
kind = "sequential"
layers = [{ kind = "gated", out = 8 }, { kind = "activation", name = "softsign" }, { kind = "swish" }]
[train]
epochs = 15
lr = 2e-2
"#,
    )
    .unwrap();
    ok(&custom_bin(&["train", "--config", "run.toml"], d));
    let out = ok(&custom_bin(&["eval", "--model", "run/best"], d));
    let acc: f64 = out.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert!(acc >= 0.9, "{out}");
    let card = std::fs::read_to_string(d.join("run/best/trident.json")).unwrap();
    assert!(
        card.contains("\"gated\"") && card.contains("\"softsign\""),
        "{card}"
    );
    let names =
        String::from_utf8_lossy(&std::fs::read(d.join("run/best/model.safetensors")).unwrap()).into_owned();
    for n in [
        "layers.0.value.weight",
        "layers.0.gate.bias",
        "layers.2.beta",
        "head.weight",
    ] {
        assert!(names.contains(n), "{n} not in the checkpoint");
    }
    let out = custom_bin(&["export", "--model", "run/best", "--out", "m.onnx"], d);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the custom layer \"gated\" has no ONNX export"),
        "{err}"
    );
}
