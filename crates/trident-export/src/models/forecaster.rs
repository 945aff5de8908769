//! Forecasters (MLP, LSTM or GRU) with the series transform and its inverse in the graph.

use super::rnn::{rnn_attrs, rnn_weights, zero_state};
use super::{activation, card_mismatch, custom_activation, row_mean, slice, BATCH};
use crate::error::{ExportError, Result};
use crate::graph::{Attr, Dim};
use crate::layers::Writer;
use crate::pb::tensor_proto::DataType as Elem;
use crate::{Exported, Io};
use trident_zoo::card::{ForecastNet, ForecasterModel, SeriesNormalize};
use trident_zoo::{InputSpec, Model, ModelCard, ModelConfig};

/// The model `forecaster`.
pub(super) fn export(w: Writer, model: &Model) -> Result<Exported> {
    let ModelConfig::Forecaster(f) = &model.card.model else {
        return Err(card_mismatch());
    };
    forecaster(w, f, &model.card)
}

/// A forecaster (MLP, LSTM or GRU) with its series transform in the graph: `values` FP32 `[batch,
/// window]` (raw values, oldest first) in — and `position` INT64 `[batch, 1]` (the first
/// forecast value's row in the series) where it reads calendar features — `forecast` FP32
/// `[batch, horizon]` (raw values) out: the log, the window's (or training) mean and the
/// scale, then back.
fn forecaster(mut w: Writer, f: &ForecasterModel, card: &ModelCard) -> Result<Exported> {
    let InputSpec::Series(s) = &card.input else {
        return Err(ExportError::Input { expected: "a series" });
    };
    let (window, horizon) = (s.window as i64, s.horizon as i64);
    let x = w.g.input("values", Elem::Float, &[BATCH, Dim::Fixed(window)]);
    let t = if s.log {
        w.g.op("Log", &[&x], &[])
    } else {
        x.clone()
    };
    let (steps, centre, offset) = normalized(&mut w, s, &t);
    let std = w.g.float_scalar(s.std as f32);
    let centred = w.g.op("Sub", &[&steps, &centre], &[]);
    let mut h = w.g.op("Div", &[&centred, &std], &[]);
    let calendar = (!s.calendar.is_empty()).then(|| calendar_features(&mut w, &s.calendar));
    if let (Some(feats), ForecastNet::Mlp) = (&calendar, f.net) {
        h = w.g.op("Concat", &[&h, feats], &[("axis", Attr::Int(1))]);
    }
    match f.net {
        ForecastNet::Mlp => {
            let layers = f.hidden.len() + 1;
            for i in 0..layers {
                h = w.linear(&h, &format!("layers.{i}"))?;
                if i + 1 < layers {
                    h = activation(&mut w, &h, f.activation())
                        .ok_or_else(|| custom_activation("forecaster", f.activation()))?;
                }
            }
        }
        ForecastNet::Lstm | ForecastNet::Gru => {
            let cal = calendar.as_deref().map(|c| (c, s.calendar.as_slice()));
            h = recurrent_forecast(&mut w, &h, f, s.steps(), cal)?
        }
    }
    let scaled = w.g.op("Mul", &[&h, &std], &[]);
    let y = w.g.op("Add", &[&scaled, &offset], &[]);
    let y = if s.log { w.g.op("Exp", &[&y], &[]) } else { y };
    w.g.output(&y, "forecast", Elem::Float, &[BATCH, Dim::Fixed(horizon)]);
    let doc = format!(
        "Trident {} forecaster: the next {horizon} values of {:?} from the last {window}",
        match f.net {
            ForecastNet::Mlp => "MLP",
            ForecastNet::Lstm => "LSTM",
            ForecastNet::Gru => "GRU",
        },
        s.column
    );
    let mut inputs = vec![Io {
        name: "values".into(),
        data_type: "TYPE_FP32",
        dims: vec![window],
    }];
    if calendar.is_some() {
        inputs.push(Io {
            name: "position".into(),
            data_type: "TYPE_INT64",
            dims: vec![1],
        });
    }
    Ok(Exported {
        model: w.g.finish("forecaster", 8, 17, doc),
        inputs,
        outputs: vec![Io {
            name: "forecast".into(),
            data_type: "TYPE_FP32",
            dims: vec![horizon],
        }],
        per_class: false,
    })
}

/// The card's normalisation of `t` `[batch, window]` (the values after the log), kept
/// apart from the network so every forecaster's graph shares it.
fn normalized(w: &mut Writer, s: &trident_zoo::SeriesSpec, t: &str) -> (String, String, String) {
    let (window, horizon) = (s.window as i64, s.horizon as i64);
    let m = s.season as i64;
    // What the model reads (the values, or with season-trend their changes over a season),
    // what that is relative to (the training or window mean, or the last change), and what
    // the outputs are relative to: that centre, or the values one season before each
    // forecast position, the window's [window − season, window − season + horizon), plus
    // (season-trend) the last change.
    match s.normalize {
        SeriesNormalize::Global => {
            let mean = w.g.float_scalar(s.mean as f32);
            (t.to_string(), mean.clone(), mean)
        }
        SeriesNormalize::Window => {
            let mean = row_mean(w, t);
            (t.to_string(), mean.clone(), mean)
        }
        SeriesNormalize::Season => {
            let mean = row_mean(w, t);
            let before = slice(w, t, window - m, window - m + horizon);
            (t.to_string(), mean, before)
        }
        SeriesNormalize::SeasonTrend => {
            let (now, then) = (slice(w, t, m, window), slice(w, t, 0, window - m));
            let changes = w.g.op("Sub", &[&now, &then], &[]);
            let change = slice(w, &changes, window - m - 1, window - m);
            let before = slice(w, t, window - m, window - m + horizon);
            let offset = w.g.op("Add", &[&before, &change], &[]);
            (changes, change, offset)
        }
    }
}

/// The calendar features of the `position` input (INT64 `[batch, 1]`, the first forecast
/// value's row in the series): `sin` and `cos` of `2π (position mod P) / P` per period,
/// `[batch, 2 · periods]`, as `trident_nn::forecast::calendar_features` computes them.
fn calendar_features(w: &mut Writer, periods: &[usize]) -> String {
    let pos = w.g.input("position", Elem::Int64, &[BATCH, Dim::Fixed(1)]);
    let mut feats = Vec::new();
    for &p in periods {
        let period = w.g.int_scalar(p as i64);
        let phase = w.g.op("Mod", &[&pos, &period], &[]);
        let phase =
            w.g.op("Cast", &[&phase], &[("to", Attr::Int(Elem::Float as i64))]);
        let step = w.g.float_scalar((2.0 * std::f64::consts::PI / p as f64) as f32);
        let angle = w.g.op("Mul", &[&phase, &step], &[]);
        feats.push(w.g.op("Sin", &[&angle], &[]));
        feats.push(w.g.op("Cos", &[&angle], &[]));
    }
    let refs: Vec<&str> = feats.iter().map(String::as_str).collect();
    w.g.op("Concat", &refs, &[("axis", Attr::Int(1))])
}

/// An LSTM or GRU forecaster's network on the normalised window `x` `[batch, window]`:
/// the stack over the window's values, one per time step with its row's calendar
/// features (from the forecast's own `calendar` `[batch, 2F]` by `step_features`' matrix),
/// as standard nodes with explicit zero states, which ONNX Runtime and tract both run; its
/// last state through `head`.
fn recurrent_forecast(
    w: &mut Writer,
    x: &str,
    f: &ForecasterModel,
    window: usize,
    calendar: Option<(&str, &[usize])>,
) -> Result<String> {
    let lstm = f.net == ForecastNet::Lstm;
    let hidden = *f.hidden.first().ok_or_else(|| ExportError::Unsupported {
        kind: "forecaster",
        why: "model.hidden: an lstm or gru forecaster needs a width per layer".into(),
    })?;
    let op = if lstm { "LSTM" } else { "GRU" };
    let attrs = rnn_attrs(lstm, hidden);
    let h0 = zero_state(w, x, hidden);
    let axis2 = w.g.ints(&[2]);
    let mut steps = w.g.op("Unsqueeze", &[x, &axis2], &[]); // [B, window, 1]
    let mut width = 1;
    if let Some((feats, periods)) = calendar {
        let fw = 2 * periods.len();
        let m = w.g.weight(
            "calendar.steps",
            &[fw, window * fw],
            &trident_nn::forecast::step_features(periods, window),
        );
        let per_step = w.g.op("MatMul", &[feats, &m], &[]);
        let shape = w.g.ints(&[0, window as i64, fw as i64]);
        let per_step = w.g.op("Reshape", &[&per_step, &shape], &[]);
        steps = w.g.op("Concat", &[&steps, &per_step], &[("axis", Attr::Int(2))]);
        width += fw;
    }
    if width == 1 && !lstm {
        // tract 0.23's fused GRU fails on an input of width 1 ("xw not contiguous": its
        // input product comes out column-major): the GRU reads each value beside a zero,
        // through a zero weight column, which changes no result.
        let zero = w.g.float_scalar(0.0);
        let zeros = w.g.op("Mul", &[&steps, &zero], &[]);
        steps = w.g.op("Concat", &[&steps, &zeros], &[("axis", Attr::Int(2))]);
        width = 2;
    }
    // Time-major for the LSTM/GRU nodes: [window, B, width].
    let mut seq =
        w.g.op("Transpose", &[&steps], &[("perm", Attr::Ints(vec![1, 0, 2]))]);
    let mut last = String::new();
    for l in 0..f.hidden.len() {
        let [wi, wh, b] = rnn_weights(w, l, &[""], lstm, hidden, if l == 0 { width } else { 0 })?;
        let mut inputs = vec![seq.as_str(), &wi, &wh, &b, "", &h0];
        if lstm {
            inputs.push(&h0);
        }
        let outs = w.g.op_n("", op, &inputs, &attrs, 2); // Y [S, 1, B, H], Y_h [1, B, H]
        let axis1 = w.g.ints(&[1]);
        seq = w.g.op("Squeeze", &[&outs[0], &axis1], &[]);
        last = outs[1].clone();
    }
    let axis0 = w.g.ints(&[0]);
    let last = w.g.op("Squeeze", &[&last, &axis0], &[]); // [B, H]
    w.linear(&last, "head")
}
