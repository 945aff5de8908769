//! Time series: one numeric column of a CSV file, read in row order; sliding windows over
//! it; the naive and seasonal-naive forecasts; and the forecast metrics (MAE, RMSE, MAPE,
//! sMAPE, MASE as Hyndman & Koehler 2006 define them).

use crate::table::{Table, TableSpec};
use crate::DataError;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A series read from a file: its values in file order, and the row labels of the first
/// column when the value column is another (dates, years).
#[derive(Debug, Clone)]
pub struct Series {
    /// The file.
    pub file: PathBuf,
    /// The value column's name.
    pub column: String,
    /// The values.
    pub values: Vec<f64>,
    /// The first column's cells, when it is not the value column.
    pub labels: Option<Vec<String>>,
}

impl Series {
    /// Reads `column` (default: the last column) of the CSV `file` (plain or gzip). Every
    /// cell must be a number: a gap is an error naming its line.
    pub fn read(file: &Path, column: Option<&str>) -> Result<Series, DataError> {
        let table = Table::read(file, &TableSpec::default())?;
        let col = match column {
            Some(name) => table.column_index(name).ok_or_else(|| DataError::Format {
                file: file.into(),
                line: 1,
                message: format!("no column {name:?} (its columns: {:?})", table.columns),
            })?,
            None => table.columns.len() - 1,
        };
        let mut values = Vec::with_capacity(table.rows.len());
        for (r, row) in table.rows.iter().enumerate() {
            let v = row[col]
                .as_deref()
                .and_then(|c| c.parse::<f64>().ok())
                .filter(|v| v.is_finite());
            values.push(v.ok_or_else(|| DataError::Format {
                file: file.into(),
                line: table.lines[r],
                message: format!(
                    "{:?} is {:?}, not a number (a series may have no gaps)",
                    table.columns[col], row[col]
                ),
            })?);
        }
        if values.is_empty() {
            return Err(DataError::Format {
                file: file.into(),
                line: 1,
                message: "the series is empty".into(),
            });
        }
        let labels = (col != 0).then(|| {
            table
                .rows
                .iter()
                .map(|r| r[0].clone().unwrap_or_default())
                .collect()
        });
        Ok(Series {
            file: file.into(),
            column: table.columns[col].clone(),
            values,
            labels,
        })
    }
}

/// The naive forecast of `lead` values after `history`: its last value repeated.
pub fn naive(history: &[f64], lead: usize) -> Vec<f64> {
    vec![*history.last().expect("a history"); lead]
}

/// The seasonal-naive forecast of `lead` values after `history`: each the value one
/// season (`m` steps) before, repeating the last season.
pub fn seasonal_naive(history: &[f64], lead: usize, m: usize) -> Vec<f64> {
    let m = m.clamp(1, history.len());
    let last = &history[history.len() - m..];
    (0..lead).map(|k| last[k % m]).collect()
}

/// Forecast accuracy against the actual values.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ForecastMetrics {
    /// Mean absolute error.
    pub mae: f64,
    /// Root mean squared error.
    pub rmse: f64,
    /// Mean absolute percentage error, in % (`None` when an actual value is 0).
    pub mape: Option<f64>,
    /// Symmetric MAPE, `200 · |f − a| / (|a| + |f|)` averaged, in % (pairs of zeros count 0).
    pub smape: f64,
    /// MAE over the in-sample MAE of the seasonal-naive one-step forecast (`None` when that
    /// is 0 or the training part is shorter than a season).
    pub mase: Option<f64>,
}

impl ForecastMetrics {
    /// The metrics of `forecast` against `actual`; `train` (the in-sample part) and the
    /// season `m` scale MASE.
    pub fn new(actual: &[f64], forecast: &[f64], train: &[f64], m: usize) -> Self {
        let n = actual.len().max(1) as f64;
        let pairs = || actual.iter().zip(forecast);
        let mae = pairs().map(|(a, f)| (a - f).abs()).sum::<f64>() / n;
        let rmse = (pairs().map(|(a, f)| (a - f).powi(2)).sum::<f64>() / n).sqrt();
        let mape = actual
            .iter()
            .all(|a| *a != 0.0)
            .then(|| 100.0 * pairs().map(|(a, f)| ((a - f) / a).abs()).sum::<f64>() / n);
        let smape = 100.0
            * pairs()
                .map(|(a, f)| {
                    let d = a.abs() + f.abs();
                    if d == 0.0 {
                        0.0
                    } else {
                        2.0 * (a - f).abs() / d
                    }
                })
                .sum::<f64>()
            / n;
        let m = m.max(1);
        let scale = (train.len() > m).then(|| {
            train.windows(m + 1).map(|w| (w[m] - w[0]).abs()).sum::<f64>() / (train.len() - m) as f64
        });
        let mase = scale.filter(|s| *s > 0.0).map(|s| mae / s);
        ForecastMetrics {
            mae,
            rmse,
            mape,
            smape,
            mase,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_match_hand_computed_values() {
        let actual = [100.0, 110.0, 120.0, 130.0];
        let forecast = [90.0, 110.0, 126.0, 140.0];
        let train = [80.0, 90.0, 85.0, 95.0, 100.0];
        let m = ForecastMetrics::new(&actual, &forecast, &train, 1);
        assert!((m.mae - 6.5).abs() < 1e-12);
        assert!((m.rmse - (236f64 / 4.0).sqrt()).abs() < 1e-12);
        let mape = 100.0 * (0.1 + 0.0 + 0.05 + 10.0 / 130.0) / 4.0;
        assert!((m.mape.unwrap() - mape).abs() < 1e-9);
        let smape = 100.0 * (20.0 / 190.0 + 0.0 + 12.0 / 246.0 + 20.0 / 270.0) / 4.0;
        assert!((m.smape - smape).abs() < 1e-9);
        // In-sample naive MAE: (10 + 5 + 10 + 5) / 4 = 7.5.
        assert!((m.mase.unwrap() - 6.5 / 7.5).abs() < 1e-12);
        // Season 2: |85 − 80|, |95 − 90|, |100 − 85| → 25 / 3.
        let m2 = ForecastMetrics::new(&actual, &forecast, &train, 2);
        assert!((m2.mase.unwrap() - 6.5 / (25.0 / 3.0)).abs() < 1e-12);
        assert!(ForecastMetrics::new(&[0.0], &[1.0], &train, 1).mape.is_none());
    }

    #[test]
    fn baselines_repeat_the_last_value_or_season() {
        let h = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(naive(&h, 3), [5.0, 5.0, 5.0]);
        assert_eq!(seasonal_naive(&h, 5, 2), [4.0, 5.0, 4.0, 5.0, 4.0]);
        assert_eq!(seasonal_naive(&h, 2, 1), [5.0, 5.0]);
    }

    #[test]
    fn a_gap_is_refused_naming_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("s.csv");
        std::fs::write(&f, "date,v\n2000,1.5\n2001,\n").unwrap();
        let e = Series::read(&f, None).unwrap_err().to_string();
        assert!(e.contains(":3") && e.contains("not a number"), "{e}");
        std::fs::write(&f, "date,v\n2000,1.5\n2001,2\n").unwrap();
        let s = Series::read(&f, Some("v")).unwrap();
        assert_eq!(s.values, [1.5, 2.0]);
        assert_eq!(s.labels.unwrap(), ["2000", "2001"]);
        assert!(Series::read(&f, Some("w"))
            .unwrap_err()
            .to_string()
            .contains("no column"));
    }
}
