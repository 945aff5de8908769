//! Forecasters on a series' windows.

use super::*;

/// The forecaster of `f` on `input`'s windows.
pub(super) fn forecaster(
    f: &ForecasterModel,
    input: &InputSpec,
    params: &Params,
    seed: u64,
) -> anyhow::Result<trident_nn::forecast::Forecaster> {
    use trident_nn::forecast::Forecaster;
    let InputSpec::Series(s) = input else {
        bail!("a forecaster takes a series (data.kind = \"series\")")
    };
    if !(0.0..1.0).contains(&f.dropout) {
        bail!("model.dropout = {}: must be in [0, 1)", f.dropout);
    }
    let pb = params.builder(seed, None);
    Ok(match f.net {
        ForecastNet::Mlp => {
            let act = trident_nn::custom::activation_by_name(f.activation())
                .map_err(|m| anyhow::anyhow!("model.activation: {m}"))?;
            Forecaster::mlp(&pb, s.inputs(), &f.hidden, s.horizon, act, f.dropout)?
        }
        ForecastNet::Lstm | ForecastNet::Gru => {
            let width = *f
                .hidden
                .first()
                .context("model.hidden: an lstm or gru needs a width per layer")?;
            if f.hidden.iter().any(|&h| h != width) {
                bail!(
                    "model.hidden = {:?}: an lstm or gru stack has one width for every layer",
                    f.hidden
                );
            }
            let kind = if f.net == ForecastNet::Lstm {
                CellKind::Lstm
            } else {
                CellKind::Gru
            };
            Forecaster::rnn(
                &pb,
                kind,
                width,
                f.hidden.len(),
                s.horizon,
                f.dropout,
                s.steps(),
                &s.calendar,
            )?
        }
    })
}
