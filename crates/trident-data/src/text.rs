//! Text classification sets from CSV, TSV or JSON Lines files.

use crate::{DataError, Dataset};
use std::collections::BTreeSet;
use std::path::Path;

/// File format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextFormat {
    /// Comma-separated, RFC 4180 quoting.
    Csv,
    /// Tab-separated (no quoting: VADER and orange3 corpora put quotes inside text).
    Tsv,
    /// One JSON object per line.
    Jsonl,
}

/// Where the text and the label are.
#[derive(Debug, Clone, PartialEq)]
pub struct TextSpec {
    /// Format.
    pub format: TextFormat,
    /// Column name (with a header or JSONL) or 0-based column index (without header).
    pub text_field: String,
    /// Label column, named or indexed like `text_field`.
    pub label_field: String,
    /// CSV/TSV: the first row names the columns.
    pub has_header: bool,
    /// The classes in index order; `None` takes the sorted distinct labels of the file.
    pub classes: Option<Vec<String>>,
    /// The label column holds a score to bin into three classes (VADER's ratings); the
    /// bins name the classes, so `classes` must then be `None`.
    pub score_bins: Option<ScoreBins>,
}

/// Three classes from a numeric score: `low` below `low_below`, `high` above
/// `high_above`, `middle` in between (bounds inclusive), e.g. VADER's mean ratings:
/// negative < -0.5 ≤ neutral ≤ 0.5 < positive.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreBins {
    /// Scores below this are `names[0]`.
    pub low_below: f64,
    /// Scores above this are `names[2]`.
    pub high_above: f64,
    /// Class names: low, middle, high.
    pub names: [String; 3],
}

impl ScoreBins {
    /// VADER's three sentiment classes at ±0.5.
    pub fn vader() -> Self {
        ScoreBins {
            low_below: -0.5,
            high_above: 0.5,
            names: ["negative".into(), "neutral".into(), "positive".into()],
        }
    }

    fn bin(&self, score: f64) -> &str {
        let i = if score < self.low_below {
            0
        } else if score > self.high_above {
            2
        } else {
            1
        };
        &self.names[i]
    }
}

/// One example.
#[derive(Debug, Clone, PartialEq)]
pub struct TextExample {
    /// The text.
    pub text: String,
    /// Class index into [`TextClassification::classes`].
    pub label: usize,
}

/// A text classification set held in memory.
#[derive(Debug, Clone)]
pub struct TextClassification {
    examples: Vec<TextExample>,
    classes: Vec<String>,
    /// (file, line) of each example, for error messages.
    sources: Vec<(std::sync::Arc<Path>, u64)>,
}

impl TextClassification {
    /// Reads `file` according to `spec`. Every error names the file and line.
    pub fn read(file: &Path, spec: &TextSpec) -> Result<Self, DataError> {
        if spec.classes.is_some() && spec.score_bins.is_some() {
            return Err(DataError::Format {
                file: file.into(),
                line: 0,
                message: "give either classes or score_bins: score bins name their own classes".into(),
            });
        }
        let mut rows = match spec.format {
            TextFormat::Jsonl => read_jsonl(file, spec)?,
            TextFormat::Csv => read_delimited(file, spec, b',')?,
            TextFormat::Tsv => read_delimited(file, spec, b'\t')?,
        };
        if let Some(bins) = &spec.score_bins {
            for (line, _, label) in &mut rows {
                let score: f64 = label.trim().parse().map_err(|_| DataError::Format {
                    file: file.into(),
                    line: *line,
                    message: format!("label '{label}' is not a number (score_bins needs numeric scores)"),
                })?;
                *label = bins.bin(score).to_string();
            }
        }
        let classes = spec
            .score_bins
            .as_ref()
            .map(|b| b.names.to_vec())
            .or_else(|| spec.classes.clone());
        let classes = classes.unwrap_or_else(|| {
            rows.iter()
                .map(|(_, _, l)| l.clone())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect()
        });
        let file_arc: std::sync::Arc<Path> = std::sync::Arc::from(file);
        let sources = rows
            .iter()
            .map(|(line, _, _)| (file_arc.clone(), *line))
            .collect();
        let examples = rows
            .into_iter()
            .map(|(line, text, label)| {
                let index = classes
                    .iter()
                    .position(|c| *c == label)
                    .ok_or_else(|| DataError::Format {
                        file: file.into(),
                        line,
                        message: format!("label '{label}' is not one of the classes {classes:?}"),
                    })?;
                Ok(TextExample { text, label: index })
            })
            .collect::<Result<_, DataError>>()?;
        Ok(TextClassification {
            examples,
            classes,
            sources,
        })
    }

    /// Reads several files with one spec into one set; their classes must agree (with
    /// `score_bins` or explicit `classes` they always do).
    pub fn read_all(files: &[std::path::PathBuf], spec: &TextSpec) -> Result<Self, DataError> {
        let mut all: Option<TextClassification> = None;
        for f in files {
            let part = Self::read(f, spec)?;
            match &mut all {
                None => all = Some(part),
                Some(a) => {
                    if a.classes != part.classes {
                        return Err(DataError::Format {
                            file: f.clone(),
                            line: 0,
                            message: format!(
                                "classes {:?} differ from {:?} of the files before it: list the classes in the config",
                                part.classes, a.classes
                            ),
                        });
                    }
                    a.examples.extend(part.examples);
                    a.sources.extend(part.sources);
                }
            }
        }
        all.ok_or_else(|| DataError::Batch("no data file given".into()))
    }

    /// The file and line example `index` came from.
    pub fn source(&self, index: usize) -> (&Path, u64) {
        let (f, l) = &self.sources[index];
        (f, *l)
    }

    /// Class names in index order.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }
}

impl Dataset for TextClassification {
    type Item = TextExample;

    fn len(&self) -> usize {
        self.examples.len()
    }

    fn get(&self, index: usize) -> Result<TextExample, DataError> {
        Ok(self.examples[index].clone())
    }
}

type Row = (u64, String, String);

fn read_jsonl(file: &Path, spec: &TextSpec) -> Result<Vec<Row>, DataError> {
    let content = std::fs::read_to_string(file).map_err(|source| DataError::Io {
        file: file.into(),
        source,
    })?;
    let mut rows = Vec::new();
    for (i, line) in content.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let line_no = i as u64 + 1;
        let err = |message: String| DataError::Format {
            file: file.into(),
            line: line_no,
            message,
        };
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| err(format!("invalid JSON: {e}")))?;
        let field = |name: &str| match value.get(name) {
            Some(serde_json::Value::String(s)) => Ok(s.clone()),
            Some(serde_json::Value::Number(n)) => Ok(n.to_string()),
            Some(other) => Err(err(format!("field '{name}' must be a string, got {other}"))),
            None => Err(err(format!("missing field '{name}'"))),
        };
        rows.push((line_no, field(&spec.text_field)?, field(&spec.label_field)?));
    }
    Ok(rows)
}

fn read_delimited(file: &Path, spec: &TextSpec, delimiter: u8) -> Result<Vec<Row>, DataError> {
    let io = |e: csv::Error| match e.into_kind() {
        csv::ErrorKind::Io(source) => DataError::Io {
            file: file.into(),
            source,
        },
        other => DataError::Format {
            file: file.into(),
            line: 0,
            message: format!("{other:?}"),
        },
    };
    let mut reader = csv::ReaderBuilder::new()
        .delimiter(delimiter)
        .has_headers(spec.has_header)
        .quoting(delimiter == b',')
        .flexible(true)
        .from_path(file)
        .map_err(io)?;
    let column = |name: &str, headers: Option<&csv::StringRecord>| -> Result<usize, DataError> {
        let found = match headers {
            Some(h) => h.iter().position(|c| c == name),
            None => name.parse().ok(),
        };
        found.ok_or_else(|| DataError::Format {
            file: file.into(),
            line: 1,
            message: match headers {
                Some(h) => format!("no column '{name}' (columns: {:?})", h.iter().collect::<Vec<_>>()),
                None => format!("'{name}' is not a column index (the file has no header)"),
            },
        })
    };
    let headers = if spec.has_header {
        Some(reader.headers().map_err(io)?.clone())
    } else {
        None
    };
    let (text, label) = (
        column(&spec.text_field, headers.as_ref())?,
        column(&spec.label_field, headers.as_ref())?,
    );
    let mut rows = Vec::new();
    for record in reader.records() {
        let record = record.map_err(|e| {
            let line = e.position().map_or(0, |p| p.line());
            DataError::Format {
                file: file.into(),
                line,
                message: e.to_string(),
            }
        })?;
        let line = record.position().map_or(0, |p| p.line());
        let get = |i: usize| {
            record
                .get(i)
                .map(str::to_string)
                .ok_or_else(|| DataError::Format {
                    file: file.into(),
                    line,
                    message: format!("row has {} columns, column {i} is missing", record.len()),
                })
        };
        rows.push((line, get(text)?, get(label)?));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(format: TextFormat, text: &str, label: &str, header: bool) -> TextSpec {
        TextSpec {
            format,
            text_field: text.into(),
            label_field: label.into(),
            has_header: header,
            classes: None,
            score_bins: None,
        }
    }

    #[test]
    fn csv_with_quotes_tsv_without_header_and_jsonl() {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("a.csv");
        std::fs::write(&csv, "label,text\npos,\"good, really\"\nneg,bad\n").unwrap();
        let set = TextClassification::read(&csv, &spec(TextFormat::Csv, "text", "label", true)).unwrap();
        assert_eq!(set.classes(), ["neg", "pos"]);
        assert_eq!(
            set.get(0).unwrap(),
            TextExample {
                text: "good, really".into(),
                label: 1
            }
        );

        let tsv = dir.path().join("a.tsv");
        std::fs::write(&tsv, "1\t-2.5\tHe said \"no\"\n2\t1.0\tok").unwrap();
        let set = TextClassification::read(&tsv, &spec(TextFormat::Tsv, "2", "1", false)).unwrap();
        assert_eq!(
            set.get(0).unwrap().text,
            "He said \"no\"",
            "TSV keeps quotes inside text"
        );
        assert_eq!(set.len(), 2, "last line without newline is read");

        let jsonl = dir.path().join("a.jsonl");
        std::fs::write(&jsonl, "{\"t\": \"x\", \"y\": 3}\n\n{\"t\": \"z\", \"y\": 1}\n").unwrap();
        let set = TextClassification::read(&jsonl, &spec(TextFormat::Jsonl, "t", "y", false)).unwrap();
        assert_eq!(set.classes(), ["1", "3"]);
    }

    #[test]
    fn score_bins_follow_vaders_rule_and_crlf_is_handled() {
        let dir = tempfile::tempdir().unwrap();
        let tsv = dir.path().join("v.txt");
        std::fs::write(
            &tsv,
            "1\t-0.6\tbad\r\n2\t-0.5\tmeh\r\n3\t0.5\tfine\r\n4\t0.51\tgood",
        )
        .unwrap();
        let mut s = spec(TextFormat::Tsv, "2", "1", false);
        s.score_bins = Some(ScoreBins::vader());
        let set = TextClassification::read(&tsv, &s).unwrap();
        let labels: Vec<usize> = (0..4).map(|i| set.get(i).unwrap().label).collect();
        assert_eq!(labels, [0, 1, 1, 2]);
        assert_eq!(set.get(0).unwrap().text, "bad", "no trailing CR");
        s.classes = Some(vec!["a".into()]);
        let err = TextClassification::read(&tsv, &s).unwrap_err().to_string();
        assert!(err.contains("either classes or score_bins"), "{err}");
        s.classes = None;
        std::fs::write(&tsv, "1\tn/a\tx\n").unwrap();
        let err = TextClassification::read(&tsv, &s).unwrap_err().to_string();
        assert!(
            err.ends_with("v.txt:1: label 'n/a' is not a number (score_bins needs numeric scores)"),
            "{err}"
        );
    }

    /// The real VADER tweets (fetch with `scripts/fetch-data.sh vader`): DATA.md's counts.
    #[test]
    #[ignore = "needs data/vader from scripts/fetch-data.sh"]
    fn vader_tweets_have_the_documented_class_counts() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/vader/tweets_GroundTruth.txt");
        let mut s = spec(TextFormat::Tsv, "2", "1", false);
        s.score_bins = Some(ScoreBins::vader());
        let set = TextClassification::read(&file, &s).unwrap();
        let mut counts = [0; 3];
        for i in 0..set.len() {
            counts[set.get(i).unwrap().label] += 1;
        }
        assert_eq!(counts, [1062, 838, 2300]);
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("b.csv");
        std::fs::write(&csv, "label,text\npos,a\nmaybe,b\n").unwrap();
        let mut s = spec(TextFormat::Csv, "text", "label", true);
        s.classes = Some(vec!["neg".into(), "pos".into()]);
        let err = TextClassification::read(&csv, &s).unwrap_err().to_string();
        assert!(
            err.ends_with("b.csv:3: label 'maybe' is not one of the classes [\"neg\", \"pos\"]"),
            "{err}"
        );
        let err = TextClassification::read(&csv, &spec(TextFormat::Csv, "body", "label", true)).unwrap_err();
        assert!(err.to_string().contains("no column 'body'"), "{err}");

        let jsonl = dir.path().join("b.jsonl");
        std::fs::write(&jsonl, "{\"t\": \"x\", \"y\": \"a\"}\n{\"t\": \"x\"}\n").unwrap();
        let err = TextClassification::read(&jsonl, &spec(TextFormat::Jsonl, "t", "y", false)).unwrap_err();
        assert!(err.to_string().ends_with("b.jsonl:2: missing field 'y'"), "{err}");
        let missing = TextClassification::read(&dir.path().join("none.csv"), &s).unwrap_err();
        assert!(matches!(missing, DataError::Io { .. }));
    }
}
