//! trident-nn against PyTorch / transformers: values and gradients of every fused kernel,
//! LSTM and GRU, and a whole BertForSequenceClassification (hidden states, logits, loss and
//! the gradient of every weight). Fixtures: `tests/fixtures/make_reference.py`.

use candle_core::{DType, Device, Tensor, Var};
use std::collections::HashMap;
use std::path::PathBuf;
use trident_nn::bert::{BertClassifier, BertConfig, Pooling, TextBatch};
use trident_nn::rnn::{CellKind, Rnn};
use trident_nn::{ops, Ctx, Loaded, Params};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn load(name: &str) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(fixtures().join(name), &Device::Cpu).unwrap()
}

fn vals(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
}

fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f32) {
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    let (g, w) = (vals(got), vals(want));
    let worst = trident_nn::math::max_abs_diff(&g, &w);
    assert!(worst <= tol, "{what}: max abs difference {worst} > {tol}");
}

fn var(t: &Tensor) -> Var {
    Var::from_tensor(t).unwrap()
}

fn grad_of(grads: &candle_core::backprop::GradStore, v: &Var) -> Tensor {
    grads.get(v.as_tensor()).expect("a gradient").clone()
}

#[test]
fn layer_norm_softmax_gelu_match_torch() {
    let r = load("ops_reference.safetensors");
    let (x, w, b) = (var(&r["ln.x"]), var(&r["ln.w"]), var(&r["ln.b"]));
    let y = ops::layer_norm(x.as_tensor(), w.as_tensor(), b.as_tensor(), 1e-5).unwrap();
    assert_close("layer_norm", &y, &r["ln.y"], 1e-5);
    let g = (y * &r["ln.probe"])
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_close("layer_norm dx", &grad_of(&g, &x), &r["ln.dx"], 1e-5);
    assert_close("layer_norm dgamma", &grad_of(&g, &w), &r["ln.dw"], 1e-5);
    assert_close("layer_norm dbeta", &grad_of(&g, &b), &r["ln.db"], 1e-5);

    let x = var(&r["sm.x"]);
    let y = ops::softmax_last_dim(x.as_tensor()).unwrap();
    assert_close("softmax", &y, &r["sm.y"], 1e-6);
    let g = (y * &r["sm.probe"])
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_close("softmax dx", &grad_of(&g, &x), &r["sm.dx"], 1e-6);

    let x = var(&r["gelu.x"]);
    let y = x.as_tensor().gelu_erf().unwrap();
    assert_close("gelu", &y, &r["gelu.y"], 1e-6);
    let g = (y * &r["gelu.probe"])
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_close("gelu dx", &grad_of(&g, &x), &r["gelu.dx"], 1e-5);
}

#[test]
fn cross_entropy_and_attention_match_torch() {
    let r = load("ops_reference.safetensors");
    let x = var(&r["ce.x"]);
    let labels = r["ce.labels"].to_dtype(DType::U32).unwrap();
    let loss = ops::cross_entropy(x.as_tensor(), &labels).unwrap();
    assert_close("cross_entropy", &loss.reshape(1).unwrap(), &r["ce.loss"], 1e-6);
    let g = loss.backward().unwrap();
    assert_close("cross_entropy dx", &grad_of(&g, &x), &r["ce.dx"], 1e-6);

    let (q, k, v) = (var(&r["att.q"]), var(&r["att.k"]), var(&r["att.v"]));
    let bias = trident_nn::transformer::mask_bias(&r["att.mask"].to_dtype(DType::U32).unwrap()).unwrap();
    // The fixture is [batch, heads, seq, head_dim]; the fused kernel takes [batch, seq, width].
    let (b, h, s, d) = q.as_tensor().dims4().unwrap();
    let merge = |t: &Var| {
        t.as_tensor()
            .transpose(1, 2)
            .unwrap()
            .reshape((b, s, h * d))
            .unwrap()
    };
    let y = trident_nn::dense::attention(&merge(&q), &merge(&k), &merge(&v), Some(&bias), h, None)
        .unwrap()
        .reshape((b, s, h, d))
        .unwrap()
        .transpose(1, 2)
        .unwrap();
    assert_close("attention", &y, &r["att.y"], 1e-5);
    let g = (y * &r["att.probe"])
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_close("attention dq", &grad_of(&g, &q), &r["att.dq"], 1e-5);
    assert_close("attention dk", &grad_of(&g, &k), &r["att.dk"], 1e-5);
    assert_close("attention dv", &grad_of(&g, &v), &r["att.dv"], 1e-5);
}

#[test]
fn lstm_and_gru_match_torch_with_variable_lengths() {
    let r = load("ops_reference.safetensors");
    for (kind, cell) in [("lstm", CellKind::Lstm), ("gru", CellKind::Gru)] {
        let weights: HashMap<String, Tensor> = r
            .iter()
            .filter_map(|(k, v)| {
                k.strip_prefix(&format!("{kind}.w."))
                    .map(|n| (n.to_string(), v.clone()))
            })
            .collect();
        let params = Params::new();
        let pb = params.builder(0, Some(Loaded::from_tensors(weights, kind)));
        let rnn = Rnn::new(&pb, cell, 3, 4, 2, true, 0.0).unwrap();
        assert!(
            params.initialised_names().is_empty(),
            "every weight came from torch"
        );
        let x = var(&r[&format!("{kind}.x")]);
        let y = rnn
            .forward(x.as_tensor(), &r[&format!("{kind}.mask")], &Ctx::eval())
            .unwrap();
        assert_close(&format!("{kind} output"), &y, &r[&format!("{kind}.y")], 1e-5);
        let g = (y * &r[&format!("{kind}.probe")])
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        assert_close(
            &format!("{kind} dx"),
            &grad_of(&g, &x),
            &r[&format!("{kind}.dx")],
            1e-5,
        );
        for p in params.all() {
            let want = &r[&format!("{kind}.g.{}", p.name)];
            assert_close(&format!("{kind} d{}", p.name), &grad_of(&g, &p.var), want, 1e-5);
        }
    }
}

#[test]
fn tiny_bert_matches_transformers_including_every_weight_gradient() {
    let dir = fixtures().join("tiny_bert");
    let r = load("tiny_bert/reference.safetensors");
    let config = BertConfig::read(&dir.join("config.json")).unwrap();
    let params = Params::new();
    let pb = params.builder(0, Some(Loaded::read(&dir.join("model.safetensors")).unwrap()));
    let model = BertClassifier::new(&pb, &config, 3, Pooling::Cls).unwrap();
    assert!(
        params.initialised_names().is_empty(),
        "{:?}",
        params.initialised_names()
    );
    let u32s = |t: &Tensor| t.to_dtype(DType::U32).unwrap();
    let ids = u32s(&r["input_ids"]);
    let batch = TextBatch {
        type_ids: ids.zeros_like().unwrap(),
        ids,
        mask: u32s(&r["attention_mask"]),
    };
    let ctx = Ctx::eval();
    let states = model.bert.hidden_states(&batch, &ctx).unwrap();
    assert_eq!(states.len(), 3);
    for (i, s) in states.iter().enumerate() {
        assert_close(&format!("hidden state {i}"), s, &r[&format!("hidden.{i}")], 1e-5);
    }
    let logits = model.forward(&batch, &ctx).unwrap();
    assert_close("logits", &logits, &r["logits"], 1e-5);
    let loss = ops::cross_entropy(&logits, &u32s(&r["labels"])).unwrap();
    assert_close("loss", &loss.reshape(1).unwrap(), &r["loss"], 1e-5);
    let grads = loss.backward().unwrap();
    let mut checked = 0;
    for p in params.trainable() {
        let want = r
            .get(&format!("grad.{}", p.name))
            .unwrap_or_else(|| panic!("torch has no grad for {}", p.name));
        assert_close(&format!("grad {}", p.name), &grad_of(&grads, &p.var), want, 1e-4);
        checked += 1;
    }
    assert_eq!(checked, 41, "every weight of the 2-layer BERT with head");

    // Training mode with dropout 0 is the same function, but the embedding lookups take
    // the sparse-gradient path (Params::gather_rows / gradient_into): torch's gradients too.
    let mut config0 = config.clone();
    config0.hidden_dropout_prob = 0.0;
    config0.attention_probs_dropout_prob = 0.0;
    let params0 = Params::new();
    let pb0 = params0.builder(0, Some(Loaded::read(&dir.join("model.safetensors")).unwrap()));
    let model0 = BertClassifier::new(&pb0, &config0, 3, Pooling::Cls).unwrap();
    params0.begin_step();
    let logits = model0.forward(&batch, &Ctx::train(1, 0)).unwrap();
    let grads = ops::cross_entropy(&logits, &u32s(&r["labels"]))
        .unwrap()
        .backward()
        .unwrap();
    assert!(
        grads
            .get(
                params0
                    .get("bert.embeddings.word_embeddings.weight")
                    .unwrap()
                    .var
                    .as_tensor()
            )
            .is_none(),
        "the word table's gradient comes through the sparse path"
    );
    for p in params0.trainable() {
        let mut g = vec![0f32; p.var.elem_count()];
        assert!(
            params0.gradient_into(&grads, &p, &mut g, false).unwrap(),
            "{}",
            p.name
        );
        let g = Tensor::from_vec(g, p.var.shape(), &Device::Cpu).unwrap();
        assert_close(
            &format!("train-mode grad {}", p.name),
            &g,
            &r[&format!("grad.{}", p.name)],
            1e-4,
        );
    }
}

#[test]
fn every_trainable_parameter_of_every_model_gets_a_nonzero_gradient() {
    use trident_nn::rnn::RnnClassifier;
    use trident_nn::vision::{Cnn, Vit, VitConfig};
    let config = BertConfig::read(&fixtures().join("tiny_bert/config.json")).unwrap();
    let ids = Tensor::new(&[[2u32, 7, 9, 11, 3], [2, 5, 8, 3, 0]], &Device::Cpu).unwrap();
    let mask = Tensor::new(&[[1u32, 1, 1, 1, 1], [1, 1, 1, 1, 0]], &Device::Cpu).unwrap();
    let batch = TextBatch {
        type_ids: ids.zeros_like().unwrap(),
        ids: ids.clone(),
        mask: mask.clone(),
    };
    let labels = Tensor::new(&[1u32, 2], &Device::Cpu).unwrap();
    let images = Tensor::randn(0f32, 1.0, (2, 1, 8, 8), &Device::Cpu).unwrap();
    let ctx = Ctx::train(7, 3);
    let check = |what: &str, params: &Params, logits: Tensor| {
        let grads = ops::cross_entropy(&logits, &labels).unwrap().backward().unwrap();
        let mut missing = Vec::new();
        for p in params.trainable() {
            // Through the store: embedding lookups in training have sparse gradients.
            let mut g = vec![0f32; p.var.elem_count()];
            let got = params.gradient_into(&grads, &p, &mut g, false).unwrap();
            if !got || g.iter().all(|v| *v == 0.0) {
                missing.push(p.name)
            }
        }
        assert!(missing.is_empty(), "{what}: no gradient for {missing:?}");
        assert!(params.trainable().len() > 3, "{what}");
    };
    for pooling in [Pooling::Cls, Pooling::Mean] {
        let params = Params::new();
        let m = BertClassifier::new(&params.builder(1, None), &config, 3, pooling).unwrap();
        let logits = m.forward(&batch, &ctx).unwrap();
        if pooling == Pooling::Mean {
            // Mean pooling does not use the pooler: freeze it, as a user would.
            params.set_trainable("bert.pooler", false);
        }
        check(&format!("bert {pooling:?}"), &params, logits);
    }
    let params = Params::new();
    let vit_cfg = VitConfig {
        image_size: 8,
        channels: 1,
        patch_size: 4,
        hidden: 8,
        layers: 2,
        heads: 2,
        mlp: 16,
        dropout: 0.1,
    };
    let vit = Vit::new(&params.builder(1, None), &vit_cfg, 3).unwrap();
    check("vit", &params, vit.forward(&images, &ctx).unwrap());
    let params = Params::new();
    let cnn = Cnn::new(&params.builder(1, None), 1, 8, 4, 3, 0.1).unwrap();
    check("cnn", &params, cnn.forward(&images, &ctx).unwrap());
    for kind in [CellKind::Lstm, CellKind::Gru] {
        let params = Params::new();
        let m = RnnClassifier::new(&params.builder(1, None), kind, 50, 6, 5, 2, 3, 0.1).unwrap();
        check(
            &format!("{kind:?}"),
            &params,
            m.forward(&ids, &mask, &ctx).unwrap(),
        );
    }
}

#[test]
fn vit_patch_embedding_equals_a_strided_convolution_by_hand() {
    use trident_nn::vision::{Vit, VitConfig};
    let params = Params::new();
    let c = VitConfig {
        image_size: 4,
        channels: 1,
        patch_size: 2,
        hidden: 3,
        layers: 1,
        heads: 1,
        mlp: 4,
        dropout: 0.0,
    };
    let vit = Vit::new(&params.builder(5, None), &c, 2).unwrap();
    let img: Vec<f32> = (0..16).map(|i| i as f32 * 0.1).collect();
    let x = Tensor::from_vec(img.clone(), (1, 1, 4, 4), &Device::Cpu).unwrap();
    let p = vals(&vit.patches(&x).unwrap()); // [1, 4, 3]
    let w = vals(params.get("patch_embed.weight").unwrap().var.as_tensor()); // [3, 1, 2, 2]
    let b = vals(params.get("patch_embed.bias").unwrap().var.as_tensor());
    for patch in 0..4 {
        let (py, px) = (patch / 2, patch % 2);
        for h in 0..3 {
            let mut s = b[h];
            for dy in 0..2 {
                for dx in 0..2 {
                    s += w[h * 4 + dy * 2 + dx] * img[(py * 2 + dy) * 4 + px * 2 + dx];
                }
            }
            assert!((p[patch * 3 + h] - s).abs() < 1e-5, "patch {patch} channel {h}");
        }
    }
}

/// The real all-MiniLM-L6-v2 (needs `scripts/fetch-data.sh minilm`): our tokenizer's ids and
/// our encoder's last hidden state against transformers on a padded batch of two sentences.
#[test]
#[ignore = "needs data/minilm (scripts/fetch-data.sh minilm)"]
fn real_minilm_matches_transformers() {
    use trident_nn::bert::{load_bert_weights, Bert, Tokenizer};
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/minilm");
    let r = load("minilm_reference.safetensors");
    let tok = Tokenizer::from_file(&dir.join("tokenizer.json")).unwrap();
    let texts = [
        "Covid cases are increasing fast!",
        "I loved this movie; the plot was wonderful.",
    ];
    let seqs: Vec<Vec<u32>> = texts.iter().map(|t| tok.encode(t).unwrap()).collect();
    let batch = trident_nn::bert::pad_batch(&tok, &seqs).unwrap();
    assert_eq!(vals(&batch.ids), vals(&r["input_ids"]), "token ids");
    assert_eq!(vals(&batch.mask), vals(&r["attention_mask"]), "attention mask");
    let config = BertConfig::read(&dir.join("config.json")).unwrap();
    let params = Params::new();
    let bert = Bert::new(
        &params
            .builder(0, Some(load_bert_weights(&dir).unwrap()))
            .pp("bert"),
        &config,
    )
    .unwrap();
    let fresh: Vec<_> = params
        .initialised_names()
        .into_iter()
        .filter(|n| !n.contains("pooler"))
        .collect();
    assert!(fresh.is_empty(), "{fresh:?}");
    let h = bert.forward(&batch, &Ctx::eval()).unwrap();
    assert_close("last hidden state", &h, &r["last_hidden_state"], 1e-4);
}
