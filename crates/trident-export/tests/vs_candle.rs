//! Every model kind, exported in every flavour, run by tract and ONNX Runtime (the
//! server's own backends) against the candle forward pass `trident eval` uses: logits
//! within 1e-4 on padded batches of mixed lengths.

use trident_export::{export, Flavour, Options, Precision};
use trident_nn::bert::Pooling;
use trident_nn::{Ctx, Device, Tensor};
use trident_serve::backend::{Backend, LoadOptions};
use trident_zoo::fixtures::{bert_card, image_card, perturb, rnn_card, text_batch, tiny_vit};
use trident_zoo::{InputSpec, Model, ModelCard, ModelConfig};

fn candle_logits(model: &Model, batch: &trident_zoo::Batch) -> Vec<f32> {
    use trident_train::TrainStep;
    let out = model.forward(batch, &Ctx::eval()).unwrap();
    out.logits()
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
}

fn engines() -> Vec<std::sync::Arc<dyn Backend>> {
    let mut v: Vec<std::sync::Arc<dyn Backend>> =
        vec![std::sync::Arc::new(trident_serve::backend::tract::TractBackend)];
    #[cfg(feature = "ort")]
    v.push(trident_serve::backend::ort::shared().expect("the ort feature is on: ONNX Runtime must load"));
    v
}

/// One instance of `file` loaded by `engine` (one thread).
fn instance(
    engine: &std::sync::Arc<dyn Backend>,
    file: &std::path::Path,
    name: &str,
) -> Box<dyn trident_serve::backend::ModelInstance> {
    engine
        .load(
            file,
            &LoadOptions {
                threads_per_instance: 1,
                config: Default::default(),
            },
        )
        .unwrap_or_else(|e| panic!("{name} on {}: {e}", engine.name()))
        .instance()
        .unwrap()
}

/// Runs `inputs` through every engine that accepts the flavour and compares with `want`.
fn check(
    name: &str,
    model: &Model,
    opts: Options,
    inputs: Vec<(String, trident_core::Tensor)>,
    want: &[f32],
    tol: f32,
) {
    let exported = export(model, opts).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.onnx");
    std::fs::write(&file, exported.to_bytes()).unwrap();
    onnx_checker(name, &file);
    let ort_only = opts.flavour == Flavour::OrtFused || opts.precision == Precision::Int8;
    let mut ran = 0;
    for engine in engines() {
        if ort_only && engine.name() == "tract" {
            continue;
        }
        let mut inst = instance(&engine, &file, name);
        let out = inst
            .execute(inputs.clone())
            .unwrap_or_else(|e| panic!("{name} on {}: {e}", engine.name()));
        let names: Vec<&str> = out.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["logits", "probabilities"], "{name}");
        let got = out[0].1.to_f32().unwrap();
        // The probabilities are the logits' softmax, row by row.
        let probs = out[1].1.to_f32().unwrap();
        let k = got.len() / (out[0].1.shape()[0] as usize);
        for (row, p) in got.chunks(k).zip(probs.chunks(k)) {
            let m = row.iter().fold(f32::MIN, |a, &b| a.max(b));
            let z: f32 = row.iter().map(|v| (v - m).exp()).sum();
            for (v, p) in row.iter().zip(p) {
                assert!(
                    ((v - m).exp() / z - p).abs() < 1e-5,
                    "{name}: probabilities {p} vs logits {row:?}"
                );
            }
        }
        assert_eq!(got.len(), want.len(), "{name} on {}", engine.name());
        let worst = trident_nn::math::max_abs_diff(&got, want);
        assert!(
            worst <= tol,
            "{name} on {}: max |difference| {worst} > {tol}\n got {got:?}\nwant {want:?}",
            engine.name()
        );
        ran += 1;
    }
    if !ort_only {
        assert!(ran >= 1);
    }
}

/// ONNX's own checker (the `onnx` Python package, installed by the test scripts) on the
/// file, with full shape inference.
fn onnx_checker(name: &str, file: &std::path::Path) {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import onnx, sys; onnx.checker.check_model(sys.argv[1], full_check=True)",
        ])
        .arg(file)
        .output()
        .expect("python3 runs (pip install onnx: tests/e2e/requirements.txt)");
    assert!(
        out.status.success(),
        "{name}: onnx.checker refuses the file: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const FP32: Options = Options {
    flavour: Flavour::Portable,
    precision: Precision::Fp32,
};
const FUSED: Options = Options {
    flavour: Flavour::OrtFused,
    precision: Precision::Fp32,
};

fn text_inputs(with_types: bool) -> (trident_zoo::Batch, Vec<(String, trident_core::Tensor)>) {
    let (b, ids, types) = text_batch();
    let mask: Vec<i64> = b
        .mask
        .flatten_all()
        .unwrap()
        .to_vec1::<u32>()
        .unwrap()
        .iter()
        .map(|&v| v as i64)
        .collect();
    let shape = vec![3, 7];
    let mut inputs = vec![
        (
            "input_ids".to_string(),
            trident_core::Tensor::from_i64(shape.clone(), &ids).unwrap(),
        ),
        (
            "attention_mask".to_string(),
            trident_core::Tensor::from_i64(shape.clone(), &mask).unwrap(),
        ),
    ];
    if with_types {
        inputs.push((
            "token_type_ids".into(),
            trident_core::Tensor::from_i64(shape, &types).unwrap(),
        ));
    }
    (trident_zoo::Batch::Text(b, vec![0, 0, 0]), inputs)
}

fn image_inputs(channels: usize) -> (trident_zoo::Batch, Vec<(String, trident_core::Tensor)>) {
    let n = 2 * channels * 64;
    let px: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin()).collect();
    let x = Tensor::from_vec(px.clone(), (2, channels, 8, 8), &Device::Cpu).unwrap();
    let t = trident_core::Tensor::from_f32(vec![2, channels as i64, 8, 8], &px).unwrap();
    (
        trident_zoo::Batch::Image(x, vec![0, 0]),
        vec![("pixel_values".into(), t)],
    )
}

fn run_all(name: &str, card: ModelCard, text: Option<bool>, channels: usize) {
    let model = Model::build(&card, 7, None).unwrap();
    perturb(&model, 0.3);
    let (batch, inputs) = match text {
        Some(types) => text_inputs(types),
        None => image_inputs(channels),
    };
    let want = candle_logits(&model, &batch);
    check(
        &format!("{name} portable"),
        &model,
        FP32,
        inputs.clone(),
        &want,
        1e-4,
    );
    #[cfg(feature = "ort")]
    {
        check(
            &format!("{name} ort-fused"),
            &model,
            FUSED,
            inputs.clone(),
            &want,
            1e-4,
        );
        // int8 weights: close to fp32, not equal (per-column scales, dynamic activations).
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        for flavour in [Flavour::Portable, Flavour::OrtFused] {
            let opts = Options {
                flavour,
                precision: Precision::Int8,
            };
            check(
                &format!("{name} {} int8", flavour.name()),
                &model,
                opts,
                inputs.clone(),
                &want,
                0.05 * scale + 0.01,
            );
        }
    }
    let _ = FUSED;
}

#[test]
fn fused_bert_uses_the_contrib_operators() {
    let model = Model::build(&bert_card(Pooling::Mean, None, false), 7, None).unwrap();
    let layers = 2;
    let h = export(&model, FUSED).unwrap().histogram();
    assert_eq!(h.get("Attention"), Some(&layers), "{h:?}");
    assert_eq!(h.get("SkipLayerNormalization"), Some(&(2 * layers)), "{h:?}");
    assert_eq!(h.get("BiasGelu"), Some(&layers), "{h:?}");
    // The attention's softmax is inside Attention; one remains, for the probabilities.
    assert_eq!(h.get("Softmax"), Some(&1), "{h:?}");
    let portable = export(&model, FP32).unwrap().histogram();
    assert_eq!(portable.get("Softmax"), Some(&(layers + 1)), "{portable:?}");
    assert!(portable
        .keys()
        .all(|op| !["Attention", "SkipLayerNormalization", "BiasGelu"].contains(&op.as_str())));
    let int8 = Options {
        flavour: Flavour::OrtFused,
        precision: Precision::Int8,
    };
    // Per layer: attention output, two feed-forward products; and the classifier.
    let q = export(&model, int8).unwrap().histogram();
    assert_eq!(q.get("DynamicQuantizeMatMul"), Some(&(3 * layers + 1)), "{q:?}");
    assert_eq!(q.get("MatMul"), None, "{q:?}");
}

#[test]
fn bert_mean_pooling() {
    run_all("bert mean", bert_card(Pooling::Mean, None, false), Some(true), 0);
}

#[test]
fn bert_cls_pooler() {
    run_all("bert cls", bert_card(Pooling::Cls, None, false), Some(true), 0);
}

#[test]
fn bert_students_kept_layers_and_narrow() {
    run_all(
        "bert kept layer",
        bert_card(Pooling::Mean, Some(vec![1]), false),
        Some(true),
        0,
    );
    run_all("bert narrow", bert_card(Pooling::Cls, None, true), Some(true), 0);
}

#[test]
fn lstm_and_gru_two_layers() {
    run_all("lstm", rnn_card(true, 2), Some(false), 0);
    run_all("gru", rnn_card(false, 2), Some(false), 0);
}

#[test]
fn vit() {
    run_all("vit", image_card(tiny_vit(), 3), None, 3);
}

#[test]
fn cnn_batch_norm_folded() {
    let card = image_card(
        ModelConfig::Cnn {
            width: 4,
            dropout: 0.0,
        },
        1,
    );
    run_all("cnn", card, None, 1);
}

#[test]
fn gan_generator_images_match_candle() {
    let g = trident_zoo::card::GanModel {
        loss: trident_zoo::card::GanObjective::Dcgan,
        z: 6,
        width: 3,
        clip: None,
        critic_steps: None,
        critic_batch_norm: true,
        gp: None,
    };
    let mut card = image_card(ModelConfig::Gan(g), 1);
    card.classes = Vec::new();
    let model = Model::build(&card, 7, None).unwrap();
    perturb(&model, 0.3);
    let gan = model.net.get::<trident_zoo::Gan>().expect("a gan");
    let z = trident_nn::gan::latent(3, 6, 11).unwrap();
    let want: Vec<f32> = gan
        .generator
        .forward(&z, &Ctx::eval())
        .unwrap()
        .affine(0.5, 0.5)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let exported = export(&model, FP32).unwrap();
    assert_eq!(exported.outputs[0].dims, [1, 8, 8]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("generator.onnx");
    std::fs::write(&file, exported.to_bytes()).unwrap();
    onnx_checker("generator", &file);
    let zv: Vec<f32> = z.flatten_all().unwrap().to_vec1().unwrap();
    let input = trident_core::Tensor::from_f32(vec![3, 6], &zv).unwrap();
    for engine in engines() {
        let out = instance(&engine, &file, "generator")
            .execute(vec![("z".into(), input.clone())])
            .unwrap();
        assert_eq!(out[0].0, "image");
        assert_eq!(out[0].1.shape(), [3, 1, 8, 8]);
        let got = out[0].1.to_f32().unwrap();
        let worst = trident_nn::math::max_abs_diff(&got, &want);
        assert!(
            worst < 1e-5,
            "generator on {}: max |difference| {worst}",
            engine.name()
        );
        assert!(got.iter().all(|p| (0.0..=1.0).contains(p)));
    }
}

#[test]
fn efficientnet_lite0_grey_upsampled_and_rgb() {
    for (channels, scale) in [(1, 4), (3, 1)] {
        let e = trident_zoo::card::EfficientNetModel {
            pretrained: None,
            mode: trident_zoo::card::TransferMode::Finetune,
            scale,
            dropout: 0.2,
            bn_momentum: None,
        };
        let mut card = image_card(ModelConfig::EfficientnetLite0(e), channels);
        if channels == 3 {
            // 8x8 RGB images would vanish by the last stride: 32x32.
            card.input = InputSpec::Image {
                channels: 3,
                height: 32,
                width: 32,
                mean: 0.5,
                std: 0.25,
            };
        }
        let model = Model::build(&card, 7, None).unwrap();
        perturb(&model, 0.3);
        let size = if channels == 3 { 32 } else { 8 };
        let n = 2 * channels * size * size;
        let px: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin()).collect();
        let x = Tensor::from_vec(px.clone(), (2, channels, size, size), &Device::Cpu).unwrap();
        let t =
            trident_core::Tensor::from_f32(vec![2, channels as i64, size as i64, size as i64], &px).unwrap();
        let batch = trident_zoo::Batch::Image(x, vec![0, 0]);
        let want = candle_logits(&model, &batch);
        check(
            &format!("efficientnet {channels}ch x{scale}"),
            &model,
            FP32,
            vec![("pixel_values".into(), t)],
            &want,
            2e-3,
        );
    }
}

/// Forecasters (MLP, LSTM, GRU; with and without calendar features) with their series
/// transform in the graph: raw windows (and positions) in, raw forecasts out, as
/// `SeriesSpec::encode` → the network → `decode` gives them.
#[test]
fn forecasters_raw_values_in_and_out() {
    use trident_zoo::card::{ForecastNet, ForecasterModel, SeriesNormalize};
    let (window, horizon) = (6, 3);
    use SeriesNormalize::{Season, SeasonTrend, Window};
    for (net, calendar, normalize) in [
        (ForecastNet::Mlp, vec![], Window),
        (ForecastNet::Mlp, vec![4, 7], Window),
        (ForecastNet::Mlp, vec![], Season),
        (ForecastNet::Mlp, vec![4], SeasonTrend),
        (ForecastNet::Lstm, vec![], Window),
        (ForecastNet::Lstm, vec![4], SeasonTrend),
        (ForecastNet::Gru, vec![], Window),
        (ForecastNet::Gru, vec![4, 7], Window),
    ] {
        let name = format!("{net:?} calendar {calendar:?} {normalize:?}");
        let spec = trident_zoo::SeriesSpec {
            column: "v".into(),
            window,
            horizon,
            log: true,
            normalize,
            season: 3,
            mean: 2.0,
            std: 0.7,
            calendar: calendar.clone(),
        };
        let card = ModelCard {
            model: ModelConfig::Forecaster(ForecasterModel {
                net,
                hidden: vec![5, 5],
                activation: None,
                dropout: 0.0,
            }),
            classes: Vec::new(),
            input: InputSpec::Series(spec.clone()),
        };
        let model = Model::build(&card, 3, None).unwrap();
        perturb(&model, 0.3);
        let f = model
            .net
            .get::<trident_nn::forecast::Forecaster>()
            .expect("a forecaster");
        // Three windows of positive values (one with a jump) and their positions.
        let windows: [Vec<f64>; 3] = [
            (0..window).map(|i| 10.0 + i as f64).collect(),
            (0..window).map(|i| 3.0 + (i as f64 * 1.3).sin()).collect(),
            (0..window).map(|i| if i == 4 { 40.0 } else { 8.0 }).collect(),
        ];
        let positions = [6usize, 29, 1000];
        let mut want = Vec::new();
        for (w, &p) in windows.iter().zip(&positions) {
            let (x, offsets) = spec.encode(w, p);
            let x = Tensor::from_vec(x, (1, spec.inputs()), &Device::Cpu).unwrap();
            let y: Vec<f32> = f
                .forward(&x, &Ctx::eval())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            want.extend(spec.decode(&y, &offsets).into_iter().map(|v| v as f32));
        }
        let exported = export(&model, FP32).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("forecaster.onnx");
        std::fs::write(&file, exported.to_bytes()).unwrap();
        onnx_checker(&name, &file);
        let v: Vec<f32> = windows.iter().flatten().map(|&x| x as f32).collect();
        let mut inputs = vec![(
            "values".to_string(),
            trident_core::Tensor::from_f32(vec![3, window as i64], &v).unwrap(),
        )];
        if !calendar.is_empty() {
            let p: Vec<i64> = positions.iter().map(|&p| p as i64).collect();
            inputs.push((
                "position".into(),
                trident_core::Tensor::from_i64(vec![3, 1], &p).unwrap(),
            ));
        }
        for engine in engines() {
            let mut inst = instance(&engine, &file, &name);
            let out = inst.execute(inputs.clone()).unwrap();
            assert_eq!(out[0].0, "forecast");
            let got = out[0].1.to_f32().unwrap();
            // And one window at a time (batch 1, as `eval --onnx` runs them), twice over.
            for _ in 0..2 {
                for (i, (w, &p)) in windows.iter().zip(&positions).enumerate() {
                    let v: Vec<f32> = w.iter().map(|&x| x as f32).collect();
                    let mut one = vec![(
                        "values".to_string(),
                        trident_core::Tensor::from_f32(vec![1, window as i64], &v).unwrap(),
                    )];
                    if !calendar.is_empty() {
                        one.push((
                            "position".into(),
                            trident_core::Tensor::from_i64(vec![1, 1], &[p as i64]).unwrap(),
                        ));
                    }
                    let y = inst.execute(one).unwrap()[0].1.to_f32().unwrap();
                    assert_eq!(
                        y,
                        got[i * horizon..(i + 1) * horizon],
                        "{name} on {}: window {i} alone",
                        engine.name()
                    );
                }
            }
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                    "{name} on {}:\n got {got:?}\nwant {want:?}",
                    engine.name()
                );
            }
        }
    }
}
