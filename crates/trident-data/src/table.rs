//! Tabular data (TK-2): a CSV table of numeric and categorical columns and a label column,
//! and the [`Encoder`] that turns a row into model features — numeric columns scaled
//! (z-score or min-max), categorical ones one-hot, missing values imputed — fitted on the
//! training rows only, so that evaluation, prediction and serving apply the same transform.
//!
//! Plain or gzip-compressed files. Two layouts are read: a header line of column names,
//! and scikit-learn's bundled CSVs,
//! whose first line is `n_samples,n_features,class names…` and whose label is the last
//! column (`sklearn_header`; the counts are checked).

use crate::DataError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Cells that mean "missing" (besides the empty cell).
pub const NA_VALUES: [&str; 5] = ["NA", "N/A", "NaN", "nan", "?"];

/// What to do with a row that has a missing feature (a missing label always drops the row).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Missing {
    /// Drop the row.
    #[default]
    Drop,
    /// Numeric: the training rows' mean; categorical: their most frequent level.
    Impute,
}

/// How numeric columns are scaled (statistics of the training rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scaling {
    /// (x − mean) / std (population std; a constant column gives 0).
    #[default]
    Zscore,
    /// (x − min) / (max − min).
    Minmax,
    /// As read.
    None,
}

/// How to read a table.
#[derive(Debug, Clone, Default)]
pub struct TableSpec {
    /// scikit-learn's first line (`n_samples,n_features,class names…`) instead of names;
    /// the label is then the last column.
    pub sklearn_header: bool,
    /// The cell separator; `None`: whichever of `,` `;` tab occurs most in the first line
    /// (a comma when none does).
    pub delimiter: Option<u8>,
}

/// The separator [`TableSpec::delimiter`] `None` picks for a file starting with `first`.
pub fn sniff_delimiter(first: &str) -> u8 {
    [b',', b';', b'\t']
        .into_iter()
        .max_by_key(|&d| (first.bytes().filter(|&b| b == d).count(), d == b','))
        .unwrap_or(b',')
}

/// A table read from a file: column names and the rows' cells, with `None` for missing.
#[derive(Debug, Clone)]
pub struct Table {
    /// The file.
    pub file: PathBuf,
    /// Column names.
    pub columns: Vec<String>,
    /// Cells per row.
    pub rows: Vec<Vec<Option<String>>>,
    /// 1-based file line of each row.
    pub lines: Vec<u64>,
    /// Class names scikit-learn's first line gives, if any.
    pub class_names: Option<Vec<String>>,
}

/// A cell as read: trimmed, `None` when empty or one of [`NA_VALUES`] (files, `predict`'s
/// rows and the server's table backend read cells alike).
pub fn cell(c: &str) -> Option<String> {
    let c = c.trim();
    (!c.is_empty() && !NA_VALUES.contains(&c)).then(|| c.to_string())
}

/// The cells of one CSV line (quotes as in a file; empty and NA cells are `None`), cut at
/// the separator [`sniff_delimiter`] picks for it.
pub fn parse_row(line: &str) -> Result<Vec<Option<String>>, String> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .delimiter(sniff_delimiter(line))
        .from_reader(line.as_bytes());
    match reader.records().next() {
        Some(Ok(rec)) => Ok(rec.iter().map(cell).collect()),
        Some(Err(e)) => Err(e.to_string()),
        None => Err("an empty row".into()),
    }
}

fn format_err(file: &Path, line: u64, message: impl Into<String>) -> DataError {
    DataError::Format {
        file: file.into(),
        line,
        message: message.into(),
    }
}

impl Table {
    /// Reads `file`.
    pub fn read(file: &Path, spec: &TableSpec) -> Result<Table, DataError> {
        let text = String::from_utf8(crate::read_file(file)?)
            .map_err(|e| format_err(file, 0, format!("not UTF-8 text: {e}")))?;
        let delimiter = spec
            .delimiter
            .unwrap_or_else(|| sniff_delimiter(text.lines().next().unwrap_or_default()));
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .delimiter(delimiter)
            .from_reader(text.as_bytes());
        let mut records = reader.records().enumerate();
        let Some((_, first)) = records.next() else {
            return Err(format_err(file, 1, "the file is empty"));
        };
        let first = first.map_err(|e| format_err(file, 1, e.to_string()))?;
        let first: Vec<String> = first.iter().map(|c| c.trim().to_string()).collect();
        let (columns, expected_rows, class_names) = if spec.sklearn_header {
            let count = |i: usize, what: &str| {
                first.get(i).and_then(|c| c.parse::<usize>().ok()).ok_or_else(|| {
                    format_err(
                        file,
                        1,
                        format!("sklearn_header: the first line must start with n_samples,n_features; its {what} is {:?}", first.get(i)),
                    )
                })
            };
            let (n, f) = (count(0, "first cell")?, count(1, "second cell")?);
            let mut cols: Vec<String> = (0..f).map(|i| format!("x{i}")).collect();
            cols.push("label".into());
            let names = first[2..].to_vec();
            (cols, Some(n), (!names.is_empty()).then_some(names))
        } else {
            (first, None, None)
        };
        let (mut rows, mut lines) = (Vec::new(), Vec::new());
        for (i, rec) in records {
            let line = i as u64 + 1;
            let rec = rec.map_err(|e| format_err(file, line, e.to_string()))?;
            if rec.iter().all(|c| c.trim().is_empty()) {
                continue;
            }
            if rec.len() != columns.len() {
                return Err(format_err(
                    file,
                    line,
                    format!("{} cells, the header has {} columns", rec.len(), columns.len()),
                ));
            }
            rows.push(rec.iter().map(cell).collect());
            lines.push(line);
        }
        if let Some(n) = expected_rows {
            if n != rows.len() {
                return Err(format_err(
                    file,
                    1,
                    format!(
                        "the first line announces {n} samples, the file holds {}",
                        rows.len()
                    ),
                ));
            }
        }
        Ok(Table {
            file: file.into(),
            columns,
            rows,
            lines,
            class_names,
        })
    }

    /// The index of the column `name`.
    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c == name)
    }

    /// The class names and each row's class (`None` where the label cell is missing).
    ///
    /// With scikit-learn's layout the label cells are class numbers `0..k` into the class
    /// names of the first line (`classes`, when given, renames them and must have `k`
    /// names). Otherwise the cells are the class names: `classes` fixes their order (a
    /// cell outside it is an error naming its line), or they are the sorted distinct cells.
    pub fn class_labels(
        &self,
        label: usize,
        classes: Option<&[String]>,
    ) -> Result<(Vec<String>, Vec<Option<usize>>), DataError> {
        let cells = self.rows.iter().map(|r| r[label].as_deref());
        let names: Vec<String> = match (&self.class_names, classes) {
            (Some(names), Some(c)) if c.len() != names.len() => {
                return Err(format_err(
                    &self.file,
                    1,
                    format!(
                        "data.classes has {} names, the file's first line {} ({names:?})",
                        c.len(),
                        names.len()
                    ),
                ))
            }
            (_, Some(c)) => c.to_vec(),
            (Some(names), None) => names.clone(),
            (None, None) => {
                let set: std::collections::BTreeSet<&str> = cells.clone().flatten().collect();
                set.into_iter().map(str::to_string).collect()
            }
        };
        // scikit-learn's layout: class numbers; otherwise class names.
        let numbered = self.class_names.is_some();
        let labels = cells
            .zip(&self.lines)
            .map(|(cell, &line)| {
                let Some(v) = cell else { return Ok(None) };
                let class = if numbered {
                    v.parse::<usize>().ok().filter(|&k| k < names.len())
                } else {
                    names.iter().position(|n| n == v)
                };
                class.map(Some).ok_or_else(|| {
                    let message = if numbered {
                        format!("label {v:?} is not a class number 0..{}", names.len())
                    } else {
                        format!(
                            "label {v:?} is not one of the classes {names:?} (column {:?})",
                            self.columns[label]
                        )
                    };
                    format_err(&self.file, line, message)
                })
            })
            .collect::<Result<_, _>>()?;
        Ok((names, labels))
    }
}

/// One feature column's transform.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ColumnCode {
    /// `(x − shift) / scale`; a missing value becomes `fill` first.
    Numeric {
        /// Column name.
        name: String,
        /// Subtracted.
        shift: f64,
        /// Divided by.
        scale: f64,
        /// The training rows' mean.
        fill: f64,
    },
    /// One-hot over `levels`; a level not seen in training gives all zeros.
    Categorical {
        /// Column name.
        name: String,
        /// The training rows' levels, sorted.
        levels: Vec<String>,
        /// The most frequent training level.
        fill: String,
    },
}

/// Rows to features, fitted on training rows (saved with a checkpoint).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Encoder {
    /// Per feature column, in order.
    pub columns: Vec<ColumnCode>,
    /// Missing-value policy.
    pub missing: Missing,
    /// Numeric scaling.
    pub scaling: Scaling,
}

impl Encoder {
    /// Fits the transform of `features` (column indices of `table`) on the rows `train`.
    pub fn fit(
        table: &Table,
        features: &[usize],
        categorical: &[String],
        train: &[usize],
        missing: Missing,
        scaling: Scaling,
    ) -> Result<Encoder, DataError> {
        let mut columns = Vec::with_capacity(features.len());
        for &c in features {
            let name = table.columns[c].clone();
            let values: Vec<&str> = train
                .iter()
                .filter_map(|&r| table.rows[r][c].as_deref())
                .collect();
            if values.is_empty() {
                return Err(format_err(
                    &table.file,
                    1,
                    format!("column {name:?} has no value in the training rows"),
                ));
            }
            let numbers: Option<Vec<f64>> = values.iter().map(|v| v.parse::<f64>().ok()).collect();
            match numbers.filter(|_| !categorical.contains(&name)) {
                Some(x) => {
                    let n = x.len() as f64;
                    let mean = x.iter().sum::<f64>() / n;
                    let (lo, hi) = x.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| {
                        (a.min(v), b.max(v))
                    });
                    let (shift, scale) = match scaling {
                        Scaling::Zscore => {
                            let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
                            (mean, var.sqrt())
                        }
                        Scaling::Minmax => (lo, hi - lo),
                        Scaling::None => (0.0, 1.0),
                    };
                    let scale = if scale > 0.0 { scale } else { 1.0 };
                    columns.push(ColumnCode::Numeric {
                        name,
                        shift,
                        scale,
                        fill: mean,
                    });
                }
                None => {
                    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
                    for v in &values {
                        *counts.entry(v).or_default() += 1;
                    }
                    // Most frequent; ties go to the first level in sorted order.
                    let fill = counts
                        .iter()
                        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
                        .map(|(l, _)| l.to_string())
                        .unwrap_or_default();
                    columns.push(ColumnCode::Categorical {
                        name,
                        levels: counts.keys().map(|l| l.to_string()).collect(),
                        fill,
                    });
                }
            }
        }
        Ok(Encoder {
            columns,
            missing,
            scaling,
        })
    }

    /// The names of the columns the encoder reads, in order.
    pub fn column_names(&self) -> Vec<&str> {
        self.columns
            .iter()
            .map(|c| match c {
                ColumnCode::Numeric { name, .. } | ColumnCode::Categorical { name, .. } => name.as_str(),
            })
            .collect()
    }

    /// Where each column the encoder reads is in `table`; an error names those it lacks.
    pub fn locate(&self, table: &Table) -> Result<Vec<usize>, DataError> {
        let names = self.column_names();
        let found: Vec<Option<usize>> = names.iter().map(|n| table.column_index(n)).collect();
        if found.contains(&None) {
            let missing: Vec<&str> = names
                .iter()
                .zip(&found)
                .filter(|(_, f)| f.is_none())
                .map(|(n, _)| *n)
                .collect();
            return Err(format_err(
                &table.file,
                1,
                format!("lacks the model's feature columns {missing:?} (the model reads {names:?})"),
            ));
        }
        Ok(found.into_iter().flatten().collect())
    }

    /// [`encode`](Self::encode) of row `r` of `table`, whose feature columns are `at`
    /// ([`locate`](Self::locate)); an error names the file and line.
    pub fn encode_row(
        &self,
        table: &Table,
        r: usize,
        at: &[usize],
        out: &mut Vec<f32>,
    ) -> Result<Option<()>, DataError> {
        let cells: Vec<Option<&str>> = at.iter().map(|&c| table.rows[r][c].as_deref()).collect();
        self.encode(&cells, out)
            .map_err(|m| format_err(&table.file, table.lines[r], m))
    }

    /// What the encoder does, in a line: `5 features from 3 columns, one-hot island (3
    /// levels); scaling Zscore; missing values: Impute`.
    pub fn summary(&self) -> String {
        let levels: Vec<String> = self
            .columns
            .iter()
            .filter_map(|c| match c {
                ColumnCode::Categorical { name, levels, .. } => {
                    Some(format!("{name} ({} levels)", levels.len()))
                }
                ColumnCode::Numeric { .. } => None,
            })
            .collect();
        let one_hot = if levels.is_empty() {
            String::new()
        } else {
            format!(", one-hot {}", levels.join(", "))
        };
        format!(
            "{} features from {} columns{one_hot}; scaling {:?}; missing values: {:?}",
            self.width(),
            self.columns.len(),
            self.scaling,
            self.missing
        )
    }

    /// Features per row.
    pub fn width(&self) -> usize {
        self.columns
            .iter()
            .map(|c| match c {
                ColumnCode::Numeric { .. } => 1,
                ColumnCode::Categorical { levels, .. } => levels.len(),
            })
            .sum()
    }

    /// The name of each feature (`column` or `column=level`).
    pub fn feature_names(&self) -> Vec<String> {
        let mut out = Vec::with_capacity(self.width());
        for c in &self.columns {
            match c {
                ColumnCode::Numeric { name, .. } => out.push(name.clone()),
                ColumnCode::Categorical { name, levels, .. } => {
                    out.extend(levels.iter().map(|l| format!("{name}={l}")))
                }
            }
        }
        out
    }

    /// The features of one row's feature cells (in the encoder's column order), appended
    /// to `out`; `None` when a cell is missing and the policy drops the row. A numeric
    /// column's cell that is not a number is an error naming the column.
    pub fn encode(&self, cells: &[Option<&str>], out: &mut Vec<f32>) -> Result<Option<()>, String> {
        if cells.len() != self.columns.len() {
            return Err(format!(
                "{} feature values, the model takes {} ({:?})",
                cells.len(),
                self.columns.len(),
                self.column_names()
            ));
        }
        if self.missing == Missing::Drop && cells.iter().any(Option::is_none) {
            return Ok(None);
        }
        let start = out.len();
        for (code, cell) in self.columns.iter().zip(cells) {
            match code {
                ColumnCode::Numeric {
                    name,
                    shift,
                    scale,
                    fill,
                } => {
                    let x = match cell {
                        Some(v) => v.parse::<f64>().map_err(|_| {
                            out.truncate(start);
                            format!("column {name:?}: {v:?} is not a number")
                        })?,
                        None => *fill,
                    };
                    out.push(((x - shift) / scale) as f32);
                }
                ColumnCode::Categorical { levels, fill, .. } => {
                    let v = cell.unwrap_or(fill.as_str());
                    let at = out.len();
                    out.resize(at + levels.len(), 0.0);
                    if let Ok(k) = levels.binary_search_by(|l| l.as_str().cmp(v)) {
                        out[at + k] = 1.0;
                    }
                }
            }
        }
        Ok(Some(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sklearn() -> TableSpec {
        TableSpec {
            sklearn_header: true,
            ..TableSpec::default()
        }
    }

    fn write(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.csv");
        std::fs::write(&p, text).unwrap();
        (dir, p)
    }

    #[test]
    fn sklearn_layout_names_columns_and_checks_the_counts() {
        let (_d, p) = write("3,2,class_0,class_1\n1.0,2.0,0\n3.0,4.0,1\n5.0,6.0,0\n");
        let spec = sklearn();
        let t = Table::read(&p, &spec).unwrap();
        assert_eq!(t.columns, ["x0", "x1", "label"]);
        assert_eq!(t.rows.len(), 3);
        assert_eq!(
            t.class_names.as_deref(),
            Some(&["class_0".to_string(), "class_1".into()][..])
        );
        let (_d, p) = write("4,2,a,b\n1,2,0\n");
        let e = Table::read(&p, &spec).unwrap_err().to_string();
        assert!(e.contains("announces 4 samples, the file holds 1"), "{e}");
        let (_d, p) = write("1,2,0\n1,2,0\n");
        assert!(
            Table::read(&p, &spec).is_ok(),
            "a counts line without class names"
        );
    }

    #[test]
    fn scaling_is_fitted_on_the_training_rows_only_and_categoricals_are_one_hot() {
        let (_d, p) = write("island,mass,species\nA,1,x\nB,3,y\nNA,5,x\nA,100,y\nC,NA,x\n");
        let t = Table::read(&p, &TableSpec::default()).unwrap();
        assert_eq!(t.rows[2][0], None, "NA is missing");
        // Rows 0-2 train; rows 3 and 4 are held out (their 100 and level C must not leak).
        let enc = Encoder::fit(&t, &[0, 1], &[], &[0, 1, 2], Missing::Impute, Scaling::Zscore).unwrap();
        assert_eq!(enc.feature_names(), ["island=A", "island=B", "mass"]);
        let std = (8.0f64 / 3.0).sqrt();
        let row = |r: usize| -> Vec<Option<&str>> { vec![t.rows[r][0].as_deref(), t.rows[r][1].as_deref()] };
        let mut out = Vec::new();
        enc.encode(&row(3), &mut out).unwrap().unwrap();
        assert_eq!(&out[..2], [1.0, 0.0]);
        assert!((out[2] as f64 - (100.0 - 3.0) / std).abs() < 1e-5);
        out.clear();
        // Unseen level C: all zeros; missing mass: the training mean, 0 after scaling.
        enc.encode(&row(4), &mut out).unwrap().unwrap();
        assert_eq!(out, [0.0, 0.0, 0.0]);
        out.clear();
        // Missing island imputed with the most frequent training level (A, tie-broken).
        enc.encode(&row(2), &mut out).unwrap().unwrap();
        assert_eq!(&out[..2], [1.0, 0.0]);
        let drop = Encoder::fit(&t, &[0, 1], &[], &[0, 1], Missing::Drop, Scaling::Minmax).unwrap();
        out.clear();
        assert_eq!(drop.encode(&row(2), &mut out).unwrap(), None);
        drop.encode(&row(1), &mut out).unwrap().unwrap();
        assert_eq!(out, [0.0, 1.0, 1.0], "min-max: 3 is the training maximum");
        let e = drop.encode(&[Some("A"), Some("heavy")], &mut out).unwrap_err();
        assert!(e.contains("\"mass\"") && e.contains("not a number"), "{e}");
        let e = drop.encode(&[Some("A")], &mut out).unwrap_err();
        assert!(e.contains("1 feature values, the model takes 2"), "{e}");
    }

    #[test]
    fn labels_are_class_numbers_in_the_sklearn_layout_and_names_otherwise() {
        let (_d, p) = write("3,1,a,b\n1.0,1\n2.0,0\n3.0,NA\n");
        let t = Table::read(&p, &sklearn()).unwrap();
        let (names, labels) = t.class_labels(1, None).unwrap();
        assert_eq!(
            (names, labels),
            (vec!["a".to_string(), "b".into()], vec![Some(1), Some(0), None])
        );
        let e = t.class_labels(1, Some(&["x".into()])).unwrap_err().to_string();
        assert!(e.contains("data.classes has 1 names"), "{e}");
        let (_d, p) = write("3,1,a,b\n1.0,1\n2.0,2\n3.0,0\n");
        let t = Table::read(&p, &sklearn()).unwrap();
        let e = t.class_labels(1, None).unwrap_err().to_string();
        assert!(
            e.ends_with("t.csv:3: label \"2\" is not a class number 0..2"),
            "{e}"
        );

        let (_d, p) = write("x,species\n1,Gentoo\n2,Adelie\n3,Gentoo\n");
        let t = Table::read(&p, &TableSpec::default()).unwrap();
        let (names, labels) = t.class_labels(1, None).unwrap();
        assert_eq!(names, ["Adelie", "Gentoo"]);
        assert_eq!(labels, [Some(1), Some(0), Some(1)]);
        let e = t
            .class_labels(1, Some(&["Gentoo".into()]))
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with(
                "t.csv:3: label \"Adelie\" is not one of the classes [\"Gentoo\"] (column \"species\")"
            ),
            "{e}"
        );
        // The encoder finds its columns by name, in another file's order.
        let enc = Encoder::fit(&t, &[0], &[], &[0, 1, 2], Missing::Drop, Scaling::None).unwrap();
        let (_d, p) = write("species,x\nGentoo,7\n");
        let other = Table::read(&p, &TableSpec::default()).unwrap();
        let at = enc.locate(&other).unwrap();
        let mut out = Vec::new();
        enc.encode_row(&other, 0, &at, &mut out).unwrap().unwrap();
        assert_eq!(out, [7.0]);
        let (_d, p) = write("species,y\nGentoo,7\n");
        let e = enc
            .locate(&Table::read(&p, &TableSpec::default()).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("lacks the model's feature columns [\"x\"]"), "{e}");
    }

    #[test]
    fn semicolons_and_tabs_are_found_in_the_first_line() {
        let (_d, p) = write("fixed acidity;pH;quality\n7,4;3.51;5\n");
        let e = Table::read(&p, &TableSpec::default()).unwrap();
        assert_eq!(e.columns, ["fixed acidity", "pH", "quality"]);
        assert_eq!(e.rows[0][0].as_deref(), Some("7,4"));
        let (_d, p) = write("a\tb\n1\t2\n");
        assert_eq!(Table::read(&p, &TableSpec::default()).unwrap().rows[0].len(), 2);
        let spec = TableSpec {
            delimiter: Some(b','),
            ..TableSpec::default()
        };
        let (_d, p) = write("a;b,c\n1;2,3\n");
        assert_eq!(Table::read(&p, &spec).unwrap().columns, ["a;b", "c"]);
        assert_eq!(sniff_delimiter("x"), b',');
        assert_eq!(parse_row("Biscoe;45.1").unwrap().len(), 2);
    }

    #[test]
    fn gzip_files_are_read_like_plain_ones() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.csv.gz");
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(b"2,1,a,b\n0.5,1\n1.5,0\n").unwrap();
        std::fs::write(&p, gz.finish().unwrap()).unwrap();
        let spec = sklearn();
        let t = Table::read(&p, &spec).unwrap();
        assert_eq!((t.rows.len(), t.columns.len()), (2, 2));
        std::fs::write(&p, [0x1f, 0x8b, 0, 1, 2]).unwrap();
        let e = Table::read(&p, &spec).unwrap_err().to_string();
        assert!(e.contains("t.csv.gz:0: corrupt gzip data"), "{e}");
    }

    #[test]
    fn a_row_of_the_wrong_width_names_its_line() {
        let (_d, p) = write("a,b\n1,2\n3\n");
        let e = Table::read(&p, &TableSpec::default()).unwrap_err().to_string();
        assert!(e.ends_with("t.csv:3: 1 cells, the header has 2 columns"), "{e}");
    }
}
