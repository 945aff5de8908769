//! `trident predict`: a checkpoint's answers for inputs given on the command line —
//! texts, image files, table rows (a CSV file or one row), or a forecaster's series — as
//! one JSON line each (label, score and every class's score; an autoencoder's
//! reconstruction error; a forecast).

use crate::data::{self as task, Model};
use crate::forecast;
use anyhow::bail;
use std::path::Path;
use trident_nn::Ctx;
use trident_train::TrainStep;

/// A forecaster's output line for input `i`: the next `horizon` values after a series (a
/// CSV file whose column is the model's, or the values themselves, comma-separated,
/// oldest first).
pub fn predict_forecast(
    model: &Model,
    spec: &trident_zoo::SeriesSpec,
    input: &str,
    i: usize,
) -> anyhow::Result<serde_json::Value> {
    let path = Path::new(input);
    let (key, values) = if path.is_file() {
        let s = trident_data::series::Series::read(path, Some(&spec.column))?;
        ("file", s.values)
    } else {
        let v = input
            .split(',')
            .map(|c| c.trim().parse::<f64>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow::anyhow!("input {}: not a file, nor comma-separated numbers ({e})", i + 1))?;
        ("values", v)
    };
    if values.len() < spec.window {
        bail!(
            "input {}: {} values; the model forecasts from the last {}",
            i + 1,
            values.len(),
            spec.window
        );
    }
    if key == "values" && !spec.calendar.is_empty() {
        bail!(
            "input {}: the model reads calendar features (data.calendar = {:?}): give the series \
             as a CSV file, whose length places the forecast in the calendar",
            i + 1,
            spec.calendar
        );
    }
    let f = forecast::model_forecast(model, spec, &values[values.len() - spec.window..], values.len())?;
    let name = if key == "file" {
        input.to_string()
    } else {
        format!("{} values", values.len())
    };
    Ok(serde_json::json!({key: name, "forecast": f}))
}

/// Input `i` of `trident predict` (a text, an image file, or a table's rows) as batches:
/// (what an output line names its input by, each row's name, their batch).
pub fn prediction_inputs(
    model: &Model,
    dir: &Path,
    input: &str,
    i: usize,
) -> anyhow::Result<Vec<(&'static str, Vec<String>, task::Batch)>> {
    Ok(match (&model.card.input, &model.tokenizer) {
        (task::InputSpec::Text { .. }, Some(tok)) => {
            let ids = model.tokenize(input, &|| format!("text {}", i + 1))?;
            vec![(
                "text",
                vec![input.to_string()],
                task::Batch::Text(trident_nn::bert::pad_batch(tok, &[ids])?, vec![0]),
            )]
        }
        (task::InputSpec::Text { .. }, None) => {
            anyhow::bail!("{}: a text model without a tokenizer", dir.display())
        }
        (
            &task::InputSpec::Image {
                channels,
                height,
                width,
                mean,
                std,
            },
            _,
        ) => {
            let pixels = trident_data::folder::decode_image(Path::new(input), channels, (height, width))?;
            let image = trident_data::idx::Image { pixels, label: 0 };
            vec![(
                "file",
                vec![input.to_string()],
                task::image_collate((channels, height, width), mean, std)(vec![image])?,
            )]
        }
        (task::InputSpec::Table { encoder, .. }, _) => table_rows(encoder, input, i)?,
        (task::InputSpec::Series(_), _) => unreachable!("forecasters are predicted by predict_forecast"),
    })
}

/// The output lines for a batch of named inputs: an autoencoder's reconstruction error
/// (its anomaly score) per row, or a classifier's label, its probability and every
/// class's, rounded to four places.
pub fn predictions(
    model: &Model,
    key: &str,
    names: &[String],
    batch: &task::Batch,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let out = model.forward(batch, &Ctx::eval())?;
    if let trident_train::Prediction::Scores(s) = &out.prediction {
        return Ok(names
            .iter()
            .zip(s.to_vec1::<f32>()?)
            .map(|(name, e)| serde_json::json!({key: name, "reconstruction_error": e}))
            .collect());
    }
    let classes = &model.card.classes;
    let round = |p: f32| (p as f64 * 1e4).round() / 1e4;
    let rows = trident_nn::ops::softmax_last_dim(out.logits()?)?.to_vec2::<f32>()?;
    Ok(names
        .iter()
        .zip(&rows)
        .map(|(name, probs)| {
            let best = probs
                .iter()
                .enumerate()
                .fold(0, |b, (j, &p)| if p > probs[b] { j } else { b });
            let scores: serde_json::Map<String, serde_json::Value> = classes
                .iter()
                .zip(probs)
                .map(|(c, &p)| (c.clone(), serde_json::json!(round(p))))
                .collect();
            serde_json::json!({key: name, "label": classes[best], "score": round(probs[best]), "scores": scores})
        })
        .collect())
}

/// `predict`'s rows for a table model: every row of a CSV file whose header names the
/// model's feature columns (other columns, the label among them, are ignored), in batches of
/// [`PREDICT_BATCH`] rows, or one row of values in the model's column order
/// (`45.1,14.5,Biscoe`; empty or NA is missing).
fn table_rows(
    encoder: &trident_data::table::Encoder,
    input: &str,
    i: usize,
) -> anyhow::Result<Vec<(&'static str, Vec<String>, task::Batch)>> {
    use trident_data::table::{parse_row, Table, TableSpec};
    let batch =
        |names: Vec<String>, x: Vec<f32>| -> anyhow::Result<(&'static str, Vec<String>, task::Batch)> {
            let rows = names.len();
            let b = task::Batch::Features(
                trident_nn::Tensor::from_vec(x, (rows, encoder.width()), &trident_nn::Device::Cpu)?,
                vec![0; rows],
            );
            Ok(("row", names, b))
        };
    let dropped = |what: String| {
        anyhow::anyhow!(
            "{what}: a feature is missing, and the model was trained with data.missing = \"drop\" \
             (it has no value to put in its place; retrain with missing = \"impute\" to predict such rows)"
        )
    };
    let path = Path::new(input);
    if path.is_file() {
        // scikit-learn's bundled files start `n_samples,n_features,class names…` instead of
        // a header; their columns are then x0… and label, as in training.
        let first = trident_data::read_file(path)?;
        let first =
            String::from_utf8_lossy(first.split(|&b| b == b'\n').next().unwrap_or_default()).into_owned();
        let mut cells = first.split([',', ';', '\t']).map(str::trim);
        let sklearn_header = cells.next().is_some_and(|c| c.parse::<usize>().is_ok())
            && cells.next().is_some_and(|c| c.parse::<usize>().is_ok());
        let spec = TableSpec {
            sklearn_header,
            ..TableSpec::default()
        };
        let table = Table::read(path, &spec)?;
        let at = encoder.locate(&table)?;
        let mut items = Vec::new();
        for chunk in (0..table.rows.len()).collect::<Vec<_>>().chunks(PREDICT_BATCH) {
            let (mut names, mut x) = (Vec::with_capacity(chunk.len()), Vec::new());
            for &r in chunk {
                let name = format!("{}:{}", path.display(), table.lines[r]);
                if encoder.encode_row(&table, r, &at, &mut x)?.is_none() {
                    return Err(dropped(name));
                }
                names.push(name);
            }
            items.push(batch(names, x)?);
        }
        return Ok(items);
    }
    let cells = parse_row(input).map_err(|e| anyhow::anyhow!("row {}: {e}", i + 1))?;
    let refs: Vec<Option<&str>> = cells.iter().map(|c| c.as_deref()).collect();
    let mut x = Vec::new();
    match encoder.encode(&refs, &mut x) {
        Ok(Some(())) => Ok(vec![batch(vec![input.to_string()], x)?]),
        Ok(None) => Err(dropped(format!("row {}", i + 1))),
        Err(e) => bail!(
            "row {} ({input:?}): {e}; or give a CSV file whose header names the columns",
            i + 1
        ),
    }
}

/// Rows of a CSV file `predict` runs through the model at once.
const PREDICT_BATCH: usize = 1024;
