//! `docs/CONFIG.md` held to the code: every key a run's TOML accepts is documented under
//! its section (and kind), and every documented key is accepted.
//!
//! The accepted keys come from the code itself, not from a list written here: serde refuses
//! an unknown key with the keys it expects (`unknown field `zz_probe`, expected one of `a`,
//! `b`, …`, `expected `a``, `expected `a` or `b``, `there are no fields`). So a bogus key
//! `zz_probe = 1` is added to one table of a valid configuration at a time and
//! [`RunConfig::parse`] (text only: it reads no file) names the table's keys. The tables are
//! found the same way, from the top down:
//! - the top level's keys are the sections;
//! - a key whose value, replaced by `{ zz_probe = 1 }`, is refused as an unknown field is a
//!   table of its own (`[distill.hidden]`); one refused with `missing field `kind`` (or
//!   `name`) is a table tagged by that key (`[data]`, `[model]`, `[train.optimizer]`,
//!   `[distill.loss]`), whose kinds are named by serde when the tag is `"zz_probe"`
//!   (`unknown variant `zz_probe`, expected one of …`); each kind is then probed in turn;
//! - a key whose value `"zz_probe"` is refused as an unknown variant takes one of the named
//!   strings: those must be the values the document lists in its Type column.
//!
//! What the serde probe cannot reach:
//! - the tables of `[model] kind = "sequential"`'s `layers`: `layers` is a list of free
//!   tables (`serde_json::Value`) checked when the model is built, not when the file is
//!   parsed. Their keys are probed the same way through the builder,
//!   `trident_nn::custom::Sequential::new`, whose error names the keys a layer kind takes,
//!   for each built-in kind of `trident_nn::custom::BUILTIN_LAYERS` (registered kinds are a
//!   program's own and take whatever keys it reads);
//! - values checked by validation rather than by serde (`data.format`, `activation`, …) are
//!   not compared, except `train.monitor`'s, which its validation message lists.
//!
//! A table that accepts the probe without an error would ignore a misspelt key: that fails
//! the test (an internally tagged kind without fields must be an empty struct variant,
//! `Hard {}`, for serde to refuse one).

use std::collections::{BTreeMap, BTreeSet};
use toml::{Table, Value};
use trident_tasks::config::RunConfig;

const PROBE: &str = "zz_probe";
const DOC: &str = "docs/CONFIG.md";

/// Minimal valid configurations: together they hold every data kind, model kind, optional
/// section and tagged sub-table, so that each table is probed inside a configuration that
/// parses and validates as it stands. (No file is read: paths need not exist.)
const BASES: &[&str] = &[
    // text + bert, distilled online with hidden-state matching
    r#"
[run]
dir = "runs/a"
[data]
kind = "text"
files = ["a.tsv"]
format = "tsv"
text_field = "2"
label_field = "1"
[model]
kind = "bert"
pretrained = "data/minilm"
[train]
epochs = 1
lr = 1e-3
[distill]
teacher = "runs/t/best"
[distill.loss]
kind = "soft"
temperature = 2.0
alpha = 0.5
[distill.hidden]
pairs = [[1, 2]]
"#,
    // text + lstm, distilled with the hard loss, cached
    r#"
[run]
dir = "runs/a"
[data]
kind = "text"
files = ["a.csv"]
format = "csv"
text_field = "text"
label_field = "label"
has_header = true
[model]
kind = "lstm"
tokenizer = "data/minilm/tokenizer.json"
[train]
epochs = 1
lr = 1e-3
[distill]
teacher = "runs/t/best"
mode = "cached"
[distill.loss]
kind = "hard"
"#,
    // text + gru
    r#"
[run]
dir = "runs/a"
[data]
kind = "text"
files = ["a.jsonl"]
format = "jsonl"
text_field = "text"
label_field = "label"
[model]
kind = "gru"
tokenizer = "data/minilm/tokenizer.json"
[train]
epochs = 1
lr = 1e-3
"#,
    // idx + cnn, sgd
    r#"
[run]
dir = "runs/a"
[data]
kind = "idx"
train_images = "a"
train_labels = "b"
test_images = "c"
test_labels = "d"
[model]
kind = "cnn"
[train]
epochs = 1
lr = 1e-3
[train.optimizer]
name = "sgd"
"#,
    // idx + vit, adamw
    r#"
[run]
dir = "runs/a"
[data]
kind = "idx"
train_images = "a"
train_labels = "b"
test_images = "c"
test_labels = "d"
[model]
kind = "vit"
image_size = 28
patch_size = 7
hidden = 16
layers = 1
heads = 2
mlp = 32
[train]
epochs = 1
lr = 1e-3
[train.optimizer]
name = "adamw"
"#,
    // folder + efficientnet_lite0
    r#"
[run]
dir = "runs/a"
[data]
kind = "folder"
train_dir = "a"
test_dir = "b"
height = 32
width = 32
[model]
kind = "efficientnet_lite0"
[train]
epochs = 1
lr = 1e-3
"#,
    // idx + gan, judged, rmsprop
    r#"
[run]
dir = "runs/a"
[data]
kind = "idx"
train_images = "a"
train_labels = "b"
test_images = "c"
test_labels = "d"
[model]
kind = "gan"
[train]
epochs = 1
lr = 1e-3
[train.optimizer]
name = "rmsprop"
[gan]
judge = "runs/cnn/best"
"#,
    // idx + autoencoder, anomaly detection by class
    r#"
[run]
dir = "runs/a"
[data]
kind = "idx"
train_images = "a"
train_labels = "b"
test_images = "c"
test_labels = "d"
[model]
kind = "autoencoder"
[train]
epochs = 1
lr = 1e-3
[anomaly]
normal = ["0"]
"#,
    // table + mlp
    r#"
[run]
dir = "runs/a"
[data]
kind = "table"
file = "t.csv"
[loader]
batch_size = 8
[model]
kind = "mlp"
[train]
epochs = 1
lr = 1e-3
"#,
    // table + sequential
    r#"
[run]
dir = "runs/a"
[data]
kind = "table"
file = "t.csv"
[model]
kind = "sequential"
layers = [{ kind = "linear", out = 8 }]
[train]
epochs = 1
lr = 1e-3
"#,
    // series + forecaster
    r#"
[run]
dir = "runs/a"
[data]
kind = "series"
file = "s.csv"
window = 8
test = 4
[model]
kind = "forecaster"
[train]
epochs = 1
lr = 1e-3
"#,
    // series + autoencoder, anomaly detection by a marked column
    r#"
[run]
dir = "runs/a"
[data]
kind = "series"
file = "s.csv"
window = 8
test = 4
[model]
kind = "autoencoder"
[train]
epochs = 1
lr = 1e-3
[anomaly]
column = "is_anomaly"
"#,
];

/// A table of the configuration: its path (`["train", "optimizer"]`) and, for a tagged
/// table, its tag key and kind (`("name", "sgd")`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Node {
    path: Vec<String>,
    tag: Option<(String, String)>,
}

impl Node {
    /// The heading `docs/CONFIG.md` gives it: `[data] kind = "text"`.
    fn heading(&self) -> String {
        let mut h = format!("[{}]", self.path.join("."));
        if let Some((k, v)) = &self.tag {
            h += &format!(" {k} = \"{v}\"");
        }
        h
    }
}

/// What one probe said.
#[derive(Debug)]
enum Probe {
    /// `unknown field `zz_probe``: the table's keys.
    Keys(Vec<String>),
    /// `missing field `kind``: a table tagged by that key.
    Tagged(String),
    /// `unknown variant `zz_probe``: the strings it takes.
    Variants(Vec<String>),
    /// Parsed: the probe was ignored.
    Accepted,
    /// Any other error.
    Other(String),
}

/// The names between backticks, in order.
fn ticked(s: &str) -> Vec<String> {
    s.split('`').skip(1).step_by(2).map(String::from).collect()
}

fn probe(text: &str) -> Probe {
    let e = match RunConfig::parse(text) {
        Ok(_) => return Probe::Accepted,
        Err(e) => e.to_string(),
    };
    let unknown_field = format!("unknown field `{PROBE}`");
    let unknown_variant = format!("unknown variant `{PROBE}`");
    if let Some(at) = e.find(&unknown_field) {
        // The probe itself, then the expected keys (none: "there are no fields").
        Probe::Keys(ticked(&e[at + unknown_field.len()..]))
    } else if let Some(at) = e.find(&unknown_variant) {
        Probe::Variants(ticked(&e[at + unknown_variant.len()..]))
    } else if let Some(at) = e.find("missing field `") {
        Probe::Tagged(ticked(&e[at..])[0].clone())
    } else {
        Probe::Other(e)
    }
}

/// The configurations, as tables (each checked to parse as it stands).
fn bases() -> Vec<Table> {
    BASES
        .iter()
        .map(|text| {
            if let Err(e) = RunConfig::parse(text) {
                panic!("a base configuration of this test is refused: {e:#}\n{text}");
            }
            text.parse::<Table>().unwrap()
        })
        .collect()
}

/// The table at `path`, if there is one.
fn table_at<'a>(t: &'a Table, path: &[String]) -> Option<&'a Table> {
    path.iter().try_fold(t, |t, p| t.get(p)?.as_table())
}

/// Walks the configuration's tables and records their keys.
struct Walk {
    bases: Vec<Table>,
    /// Keys per heading; the top level under "".
    keys: BTreeMap<String, BTreeSet<String>>,
    /// (heading, key): the strings a key takes, where serde names them.
    values: BTreeMap<(String, String), BTreeSet<String>>,
    /// Tables no base holds (probed in a table made up for the probe).
    uncovered: Vec<String>,
    /// Tables where an unknown key is accepted.
    lenient: Vec<String>,
}

impl Walk {
    /// The text of the first base that holds `node` (else the first base with the node
    /// made up, recorded as uncovered), after `edit` of the node's table.
    fn text(&mut self, node: &Node, edit: impl FnOnce(&mut Table)) -> String {
        let held = self.bases.iter().position(|b| {
            table_at(b, &node.path).is_some_and(|t| match &node.tag {
                Some((k, v)) => t.get(k).and_then(Value::as_str) == Some(v),
                None => true,
            })
        });
        if held.is_none() && !self.uncovered.contains(&node.heading()) {
            self.uncovered.push(node.heading());
        }
        let mut doc = self.bases[held.unwrap_or(0)].clone();
        let mut t = &mut doc;
        for p in &node.path {
            let v = t.entry(p.clone()).or_insert(Table::new().into());
            if !v.is_table() {
                *v = Table::new().into();
            }
            t = v.as_table_mut().unwrap();
        }
        if held.is_none() {
            t.clear();
            if let Some((k, v)) = &node.tag {
                t.insert(k.clone(), v.clone().into());
            }
        }
        edit(t);
        toml::to_string(&doc).unwrap()
    }

    /// Records `node`'s keys and walks into those that are tables.
    fn node(&mut self, node: Node) {
        let heading = if node.path.is_empty() {
            String::new()
        } else {
            node.heading()
        };
        let text = self.text(&node, |t| {
            t.insert(PROBE.into(), 1.into());
        });
        let keys = match probe(&text) {
            Probe::Keys(k) => k,
            Probe::Accepted => {
                self.lenient.push(heading.clone());
                Vec::new()
            }
            Probe::Other(e) => panic!("probing {heading:?} for its keys: {e}\n{text}"),
            p => panic!("probing {heading:?} for its keys gave {p:?}\n{text}"),
        };
        self.keys.insert(heading.clone(), keys.iter().cloned().collect());
        for key in keys {
            let mut child = node.path.clone();
            child.push(key.clone());
            let as_table = self.text(&node, |t| {
                t.insert(
                    key.clone(),
                    Table::from_iter([(PROBE.to_string(), Value::from(1))]).into(),
                );
            });
            match probe(&as_table) {
                Probe::Keys(_) => self.node(Node {
                    path: child,
                    tag: None,
                }),
                Probe::Tagged(tag) => {
                    let untagged = Node {
                        path: child.clone(),
                        tag: None,
                    };
                    let kinds = self.text(&untagged, |t| {
                        t.clear();
                        t.insert(tag.clone(), PROBE.into());
                    });
                    let Probe::Variants(kinds) = probe(&kinds) else {
                        panic!(
                            "probing the kinds of {} gave {:?}",
                            untagged.heading(),
                            probe(&kinds)
                        )
                    };
                    for kind in kinds {
                        self.node(Node {
                            path: child.clone(),
                            tag: Some((tag.clone(), kind)),
                        });
                    }
                }
                _ => {
                    let as_string = self.text(&node, |t| {
                        t.insert(key.clone(), PROBE.into());
                    });
                    if let Probe::Variants(v) = probe(&as_string) {
                        self.values
                            .insert((heading.clone(), key), v.into_iter().collect());
                    }
                }
            }
        }
    }
}

/// The code's tables and keys.
fn code() -> Walk {
    let mut walk = Walk {
        bases: bases(),
        keys: BTreeMap::new(),
        values: BTreeMap::new(),
        uncovered: Vec::new(),
        lenient: Vec::new(),
    };
    walk.node(Node {
        path: Vec::new(),
        tag: None,
    });

    // `train.monitor` is a string checked after parsing; its message lists the metrics.
    let text = walk.text(
        &Node {
            path: vec!["train".into()],
            tag: None,
        },
        |t| {
            t.insert("monitor".into(), PROBE.into());
        },
    );
    let e = RunConfig::parse(&text)
        .expect_err("train.monitor = \"zz_probe\" is refused")
        .to_string();
    let metrics: BTreeSet<String> = e
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|m| *m != PROBE)
        .map(String::from)
        .collect();
    assert!(
        metrics.len() >= 2,
        "train.monitor's message names no metrics: {e}"
    );
    walk.values.insert(("[train]".into(), "monitor".into()), metrics);

    // The layers of a `sequential` model: keys checked by the builder (see the top).
    let params = trident_nn::Params::new();
    let pb = params.builder(0, None);
    for kind in trident_nn::custom::BUILTIN_LAYERS {
        let spec = [serde_json::json!({ "kind": kind, PROBE: 1 })];
        let e = match trident_nn::custom::Sequential::new(&pb, &spec, 4, 2) {
            Ok(_) => panic!("layer kind {kind} accepted {PROBE}"),
            Err(e) => e.to_string(),
        };
        let (Some(from), Some(to)) = (e.find(" takes ["), e.find(&format!("], not \"{PROBE}\""))) else {
            panic!("layer kind {kind}: no list of keys in {e:?}")
        };
        let keys = e[from + " takes [".len()..to]
            .split('"')
            .skip(1)
            .step_by(2)
            .map(String::from)
            .collect();
        walk.keys
            .insert(format!("[[model.layers]] kind = \"{kind}\""), keys);
    }
    walk
}

/// A heading's table rows in `docs/CONFIG.md`: the key (first cell, in backticks) and the
/// type cell.
type Documented = BTreeMap<String, Vec<(String, String)>>;

/// The document's tables: under each heading whose text is one code span starting with `[`
/// (`### `[data] kind = "text"``), the rows whose first cell is a key in backticks.
fn documented(text: &str) -> Documented {
    let mut doc = Documented::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            let h = line.trim_start_matches('#').trim();
            current = h
                .strip_prefix('`')
                .and_then(|h| h.strip_suffix('`'))
                .filter(|h| h.starts_with('[') && !h.contains('`'))
                .map(String::from);
            if let Some(h) = &current {
                assert!(
                    doc.insert(h.clone(), Vec::new()).is_none(),
                    "{DOC}: heading `{h}` twice"
                );
            }
        } else if let (Some(h), Some(row)) = (&current, line.strip_prefix('|')) {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let Some(key) = cells[0].strip_prefix('`').and_then(|k| k.strip_suffix('`')) else {
                continue;
            };
            let ty = cells.get(1).copied().unwrap_or_default();
            doc.get_mut(h).unwrap().push((key.to_string(), ty.to_string()));
        }
    }
    doc
}

fn list<'a>(keys: impl IntoIterator<Item = &'a String>) -> String {
    keys.into_iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[test]
fn config_md_documents_every_accepted_key_and_no_other() {
    let walk = code();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(DOC);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc = documented(&text);
    let mut problems = Vec::new();

    assert!(
        walk.uncovered.is_empty(),
        "no base configuration in this test holds {:?}: add a minimal valid one to BASES",
        walk.uncovered
    );

    // The top level: the sections are the first parts of the headings' paths.
    let sections: BTreeSet<String> = doc
        .keys()
        .map(|h| {
            let path = h.trim_start_matches('[');
            path[..path.find([']', '.']).unwrap_or(path.len())].to_string()
        })
        .collect();
    let top = &walk.keys[""];
    let missing: Vec<_> = top.difference(&sections).collect();
    let extra: Vec<_> = sections.difference(top).collect();
    if !missing.is_empty() {
        problems.push(format!("sections without a heading: {}", list(missing)));
    }
    if !extra.is_empty() {
        problems.push(format!(
            "headings of sections the code does not have: {}",
            list(extra)
        ));
    }

    for (heading, keys) in walk.keys.iter().filter(|(h, _)| !h.is_empty()) {
        let Some(rows) = doc.get(heading) else {
            problems.push(format!("no heading `{heading}` (its keys: {})", list(keys)));
            continue;
        };
        let given: BTreeSet<String> = rows.iter().map(|(k, _)| k.clone()).collect();
        let missing: Vec<_> = keys.difference(&given).collect();
        let extra: Vec<_> = given.difference(keys).collect();
        if !missing.is_empty() {
            problems.push(format!(
                "`{heading}`: keys the code accepts, not documented: {}",
                list(missing)
            ));
        }
        if !extra.is_empty() {
            problems.push(format!(
                "`{heading}`: documented keys the code refuses: {}",
                list(extra)
            ));
        }
        if given.len() != rows.len() {
            problems.push(format!("`{heading}`: a key is documented twice"));
        }
    }
    for heading in doc.keys().filter(|h| !walk.keys.contains_key(*h)) {
        problems.push(format!("heading `{heading}`: no such table or kind in the code"));
    }

    // The strings an enumerated key takes: its Type cell lists each as `"value"`.
    for ((heading, key), values) in &walk.values {
        let Some((_, ty)) = doc
            .get(heading)
            .and_then(|rows| rows.iter().find(|(k, _)| k == key))
        else {
            continue; // reported above
        };
        let given: BTreeSet<String> = ticked(ty)
            .iter()
            .filter_map(|v| v.strip_prefix('"').and_then(|v| v.strip_suffix('"')))
            .map(String::from)
            .collect();
        if &given != values {
            problems.push(format!(
                "`{heading}` `{key}`: the code takes {}, the Type column lists {}",
                list(values),
                list(&given)
            ));
        }
    }

    // Every ```toml block is a whole run configuration the code accepts.
    let mut blocks = 0;
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "```toml" {
            continue;
        }
        let block: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
        blocks += 1;
        if let Err(e) = RunConfig::parse(&block.join("\n")) {
            problems.push(format!(
                "```toml block {blocks} (starting {:?}) is refused: {e:#}",
                block.first()
            ));
        }
    }
    if blocks == 0 {
        problems.push("no ```toml example".into());
    }

    if !walk.lenient.is_empty() {
        problems.push(format!(
            "these tables accept an unknown key without an error (a misspelt key would be ignored): {:?}",
            walk.lenient
        ));
    }
    assert!(
        problems.is_empty(),
        "{DOC} does not match the code:\n  {}\n\nThe code's tables and keys:\n{}",
        problems.join("\n  "),
        walk.keys
            .iter()
            .map(|(h, k)| format!("  {}: {}", if h.is_empty() { "(top level)" } else { h }, list(k)))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
