//! BERT-family classifiers (fine-tuned, or distilled students with kept layers and narrow
//! widths): token ids, mask and token types in, positions sliced from the table.

use super::{card_mismatch, classifier, first_position, masked_mean, token_input, Built};
use crate::error::Result;
use crate::graph::Attr;
use crate::layers::Writer;
use crate::pb::tensor_proto::DataType as Elem;
use crate::{Exported, Flavour};
use trident_nn::bert::Pooling;
use trident_zoo::Model;

/// The classifier `bert`, its `[CLS]` or mean pooling read from the network itself.
pub(super) fn export(mut w: Writer, model: &Model) -> Result<Exported> {
    let net = model
        .net
        .get::<trident_nn::bert::BertClassifier>()
        .ok_or_else(card_mismatch)?;
    let built = bert(&mut w, &net.bert.config, net.pooling)?;
    classifier(w, "bert", built, model)
}

fn bert(w: &mut Writer, c: &trident_nn::bert::BertConfig, pooling: Pooling) -> Result<Built> {
    let (ids, io_ids) = token_input(w, "input_ids");
    let (mask, io_mask) = token_input(w, "attention_mask");
    let (types, io_types) = token_input(w, "token_type_ids");
    let h = c.hidden_size;
    let eps = c.layer_norm_eps;

    // Embeddings: word + token type + positions 0..seq, then LayerNorm.
    let word = w.param("bert.embeddings.word_embeddings.weight")?;
    let ty = w.param("bert.embeddings.token_type_embeddings.weight")?;
    let pos = w.param("bert.embeddings.position_embeddings.weight")?;
    let we = w.g.op("Gather", &[&word, &ids], &[]);
    let te = w.g.op("Gather", &[&ty, &types], &[]);
    let shape = w.g.op("Shape", &[&ids], &[]);
    let (one, two, zero) = (w.g.ints(&[1]), w.g.ints(&[2]), w.g.ints(&[0]));
    let seq = w.g.op("Slice", &[&shape, &one, &two], &[]);
    let pe = w.g.op("Slice", &[&pos, &zero, &seq, &zero], &[]);
    let x = w.g.op("Add", &[&we, &te], &[]);
    let x = w.g.op("Add", &[&x, &pe], &[]);
    let mut x = w.layer_norm(&x, "bert.embeddings.LayerNorm", eps)?;

    // The mask: an additive bias (m - 1) · 1e9 as [batch, 1, 1, seq] (`mask_bias`), or
    // the int32 0/1 mask ORT's Attention takes.
    let mask_f = w.g.op("Cast", &[&mask], &[("to", Attr::Int(Elem::Float as i64))]);
    let (bias, index) = match w.opts.flavour {
        Flavour::OrtFused => (
            String::new(),
            w.g.op("Cast", &[&mask], &[("to", Attr::Int(Elem::Int32 as i64))]),
        ),
        Flavour::Portable => {
            let one_f = w.g.float_scalar(1.0);
            let big = w.g.float_scalar(1e9);
            let bias = w.g.op("Sub", &[&mask_f, &one_f], &[]);
            let bias = w.g.op("Mul", &[&bias, &big], &[]);
            let axes = w.g.ints(&[1, 2]);
            (w.g.op("Unsqueeze", &[&bias, &axes], &[]), String::new())
        }
    };

    // Post-norm encoder layers. With [CLS] pooling the last layer continues from its
    // attention on position 0 only, as `Encoder::forward_first` computes it: the head
    // reads no other row.
    let last = c.num_hidden_layers.checked_sub(1);
    for l in 0..c.num_hidden_layers {
        let p = format!("bert.encoder.layer.{l}");
        let mut a = w.self_attention(&x, &p, h, c.num_attention_heads, Some((&bias, &index)))?;
        if pooling == Pooling::Cls && Some(l) == last {
            (a, x) = (first_position(w, &a), first_position(w, &x));
        }
        let (a, ab) = w.linear_split(&a, &format!("{p}.attention.output.dense"))?;
        x = w.add_norm(&a, &ab, &x, &format!("{p}.attention.output.LayerNorm"), eps)?;
        let (f, fb) = w.linear_split(&x, &format!("{p}.intermediate.dense"))?;
        let f = w.bias_gelu(&f, &fb);
        let (f, ob) = w.linear_split(&f, &format!("{p}.output.dense"))?;
        x = w.add_norm(&f, &ob, &x, &format!("{p}.output.LayerNorm"), eps)?;
    }

    let pooled = match pooling {
        Pooling::Mean => masked_mean(w, &x, &mask_f),
        Pooling::Cls => {
            let first = w.g.int_scalar(0);
            let cls = w.g.op("Gather", &[&x, &first], &[("axis", Attr::Int(1))]);
            let y = w.linear(&cls, "bert.pooler.dense")?;
            w.g.op("Tanh", &[&y], &[])
        }
    };
    let logits = w.linear(&pooled, "classifier")?;
    Ok((logits, vec![io_ids, io_mask, io_types]))
}
