//! A GAN's generator: latent vectors in, images out.

use super::{card_mismatch, BATCH};
use crate::error::Result;
use crate::graph::{Attr, Dim};
use crate::layers::Writer;
use crate::pb::tensor_proto::DataType as Elem;
use crate::{Exported, Io};
use trident_zoo::{Model, ModelConfig};

/// The model `gan`: its generator alone.
pub(super) fn export(w: Writer, model: &Model) -> Result<Exported> {
    let (ModelConfig::Gan(_), Some(g)) = (&model.card.model, model.net.get::<trident_zoo::Gan>()) else {
        return Err(card_mismatch());
    };
    generator(w, g)
}

/// A GAN's generator (the discriminator only trains it): `z` FP32 `[batch, z]` (latent
/// vectors, N(0, I)) in, `image` FP32 `[batch, c, h, w]` out as pixels in [0, 1] — the
/// linear layer, batch norms on their running statistics, the two transposed
/// convolutions, `tanh` mapped from [−1, 1].
fn generator(mut w: Writer, g: &trident_zoo::model::Gan) -> Result<Exported> {
    let shape = g.shape;
    let (c, h, wd) = shape.image;
    let z = w.g.input("z", Elem::Float, &[BATCH, Dim::Fixed(shape.z as i64)]);
    let x = w.linear(&z, "generator.fc")?;
    let inner =
        w.g.ints(&[0, 2 * shape.width as i64, (h / 4) as i64, (wd / 4) as i64]);
    let x = w.g.op("Reshape", &[&x, &inner], &[]);
    let x = batch_norm(&mut w, &x, "generator.bn0")?;
    let x = w.g.op("Relu", &[&x], &[]);
    let up = |w: &mut Writer, x: &str, prefix: &str, bias: bool| -> Result<String> {
        let k = w.param(&format!("{prefix}.weight"))?;
        let mut inputs = vec![x.to_string(), k];
        if bias {
            inputs.push(w.param(&format!("{prefix}.bias"))?);
        }
        let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        Ok(w.g.op(
            "ConvTranspose",
            &refs,
            &[
                ("kernel_shape", Attr::Ints(vec![4, 4])),
                ("strides", Attr::Ints(vec![2, 2])),
                ("pads", Attr::Ints(vec![1, 1, 1, 1])),
            ],
        ))
    };
    let x = up(&mut w, &x, "generator.up1", false)?;
    let x = batch_norm(&mut w, &x, "generator.bn1")?;
    let x = w.g.op("Relu", &[&x], &[]);
    let x = up(&mut w, &x, "generator.up2", true)?;
    let x = w.g.op("Tanh", &[&x], &[]);
    let half = w.g.weight("half", &[], &[0.5]);
    let x = w.g.op("Mul", &[&x, &half], &[]);
    let image = w.g.op("Add", &[&x, &half], &[]);
    let dims = [c, h, wd].map(|d| d as i64);
    w.g.output(
        &image,
        "image",
        Elem::Float,
        &[
            BATCH,
            Dim::Fixed(dims[0]),
            Dim::Fixed(dims[1]),
            Dim::Fixed(dims[2]),
        ],
    );
    let doc = format!(
        "Trident GAN generator ({:?} loss): {}-wide latent vectors from N(0, I) in, {c}x{h}x{wd} images with pixels in [0, 1] out",
        g.loss, shape.z
    );
    Ok(Exported {
        model: w.g.finish("gan-generator", 8, 17, doc),
        inputs: vec![Io {
            name: "z".into(),
            data_type: "TYPE_FP32",
            dims: vec![shape.z as i64],
        }],
        outputs: vec![Io {
            name: "image".into(),
            data_type: "TYPE_FP32",
            dims: dims.to_vec(),
        }],
        per_class: false,
    })
}

/// `BatchNormalization` on the running statistics of the batch norm `prefix`.
fn batch_norm(w: &mut Writer, x: &str, prefix: &str) -> Result<String> {
    let names = ["weight", "bias", "running_mean", "running_var"].map(|n| w.param(&format!("{prefix}.{n}")));
    let [a, b, m, v] = names;
    let (a, b, m, v) = (a?, b?, m?, v?);
    Ok(w.g.op(
        "BatchNormalization",
        &[x, &a, &b, &m, &v],
        &[("epsilon", Attr::Float(1e-5))],
    ))
}
