//! Table models: an MLP or a `sequential` stack on a table's encoded rows.

use super::{classified, mismatch, Batch, Building, Built, Net, Network};
use crate::card::{InputSpec, ModelCard, ModelConfig};
use crate::error::{invalid, Result, ZooError};
use trident_nn::custom::Sequential;
use trident_nn::layers::Mlp;
use trident_nn::Ctx;
use trident_train::StepOutput;

/// The network of a table model (`mlp` or `sequential`) on the card's encoded rows.
pub(super) fn build(b: &Building) -> Result<Built> {
    let (card, params, seed) = (b.card, b.params, b.seed);
    let InputSpec::Table { encoder, .. } = &card.input else {
        invalid!("mlp and sequential models take table input (data.kind = \"table\")")
    };
    let (pb, width, classes) = (params.builder(seed, None), encoder.width(), card.classes.len());
    Ok((
        match &card.model {
            ModelConfig::Mlp {
                hidden,
                activation,
                dropout,
            } => {
                let act = trident_nn::custom::activation_by_name(activation)
                    .map_err(|m| ZooError::Config(format!("model.activation: {m}")))?;
                if hidden.contains(&0) {
                    invalid!("model.hidden = {hidden:?}: every hidden width must be at least 1");
                }
                if !(0.0..1.0).contains(dropout) {
                    invalid!("model.dropout = {dropout}: must be in [0, 1)");
                }
                let sizes: Vec<usize> = std::iter::once(width)
                    .chain(hidden.iter().copied())
                    .chain(std::iter::once(classes))
                    .collect();
                Net::new(Mlp::new(&pb, &sizes, act, *dropout)?)
            }
            ModelConfig::Sequential(m) => Net::new(Sequential::new(&pb, &m.layers, width, classes)?),
            _ => invalid!("not a table model"),
        },
        None,
    ))
}

impl Network for Mlp {
    fn step(&self, batch: &Batch, _card: &ModelCard, ctx: &Ctx) -> candle_core::Result<StepOutput> {
        let Batch::Features(x, labels) = batch else {
            return Err(mismatch("table rows"));
        };
        classified(self.forward(x, ctx)?, labels)
    }
}

impl Network for Sequential {
    fn step(&self, batch: &Batch, _card: &ModelCard, ctx: &Ctx) -> candle_core::Result<StepOutput> {
        let Batch::Features(x, labels) = batch else {
            return Err(mismatch("table rows"));
        };
        classified(self.forward(x, ctx)?, labels)
    }
}
