//! The vision transformer: patch `Conv`, class token by `Expand`, pre-norm layers.

use super::{card_mismatch, classifier, first_position, image_input, Built};
use crate::error::Result;
use crate::graph::Attr;
use crate::layers::Writer;
use crate::Exported;
use trident_zoo::{InputSpec, Model, ModelConfig};

/// The classifier `vit`.
pub(super) fn export(mut w: Writer, model: &Model) -> Result<Exported> {
    let ModelConfig::Vit(c) = &model.card.model else {
        return Err(card_mismatch());
    };
    let built = vit(&mut w, c, &model.card.input)?;
    classifier(w, "vit", built, model)
}

fn vit(w: &mut Writer, c: &trident_nn::vision::VitConfig, spec: &InputSpec) -> Result<Built> {
    let (x, io, _) = image_input(w, spec)?;
    let (h, p) = (c.hidden, c.patch_size as i64);
    let eps = 1e-6;
    let pw = w.param("patch_embed.weight")?;
    let pb = w.param("patch_embed.bias")?;
    let conv = w.g.op(
        "Conv",
        &[&x, &pw, &pb],
        &[
            ("kernel_shape", Attr::Ints(vec![p, p])),
            ("strides", Attr::Ints(vec![p, p])),
        ],
    );
    let flat = w.g.ints(&[0, h as i64, -1]);
    let patches = w.g.op("Reshape", &[&conv, &flat], &[]);
    let patches =
        w.g.op("Transpose", &[&patches], &[("perm", Attr::Ints(vec![0, 2, 1]))]);
    let batch = w.batch_dim(&x);
    let rest = w.g.ints(&[1, h as i64]);
    let shape = w.g.op("Concat", &[&batch, &rest], &[("axis", Attr::Int(0))]);
    let cls = w.param("cls_token")?;
    let cls = w.g.op("Expand", &[&cls, &shape], &[]);
    let seq = w.g.op("Concat", &[&cls, &patches], &[("axis", Attr::Int(1))]);
    let pos = w.param("pos_embed")?;
    let mut x = w.g.op("Add", &[&seq, &pos], &[]);

    // Pre-norm encoder layers: x + attn(LN(x)), then x + ffn(LN(x)); the last continues
    // from its attention on the class token only (the head reads no other row).
    for l in 0..c.layers {
        let pre = format!("encoder.layer.{l}");
        let n = w.layer_norm(&x, &format!("{pre}.attention.output.LayerNorm"), eps)?;
        let mut a = w.self_attention(&n, &pre, h, c.heads, None)?;
        if l + 1 == c.layers {
            (a, x) = (first_position(w, &a), first_position(w, &x));
        }
        let a = w.linear(&a, &format!("{pre}.attention.output.dense"))?;
        x = w.g.op("Add", &[&x, &a], &[]);
        let n = w.layer_norm(&x, &format!("{pre}.output.LayerNorm"), eps)?;
        let (f, fb) = w.linear_split(&n, &format!("{pre}.intermediate.dense"))?;
        let f = w.bias_gelu(&f, &fb);
        let f = w.linear(&f, &format!("{pre}.output.dense"))?;
        x = w.g.op("Add", &[&x, &f], &[]);
    }
    let first = w.g.int_scalar(0);
    let cls = w.g.op("Gather", &[&x, &first], &[("axis", Attr::Int(1))]);
    let cls = w.layer_norm(&cls, "norm", eps)?;
    Ok((w.linear(&cls, "head")?, vec![io]))
}
