//! `trident distill` end to end on generated IDX images: a CNN teacher is trained, then
//! distilled into a narrower CNN. The teacher's weights must come out bit-identical, the
//! student must learn, and bad teachers are refused before any training.

mod common;
use common::{failed, ok_log, reviews_data, tiny_bert, trident, write_idx, write_texts};

use std::path::Path;

/// 8×8 images of four classes: the bright quadrant is the class, with noise.
fn make(n: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let (mut px, mut labels, mut s) = (Vec::new(), Vec::new(), seed);
    for i in 0..n {
        let label = (i % 4) as u8;
        for r in 0..8 {
            for c in 0..8 {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let noise = (s >> 58) as u8;
                let quadrant = (r / 4) * 2 + c / 4;
                px.push(if quadrant == label as usize {
                    150 + noise
                } else {
                    noise
                });
            }
        }
        labels.push(label);
    }
    (px, labels)
}

fn config(model: &str, run: &str, extra: &str) -> String {
    format!(
        r#"
[run]
dir = "{run}"
[data]
kind = "idx"
train_images = "train-images"
train_labels = "train-labels"
test_images = "test-images"
test_labels = "test-labels"
classes = ["a", "b", "c", "d"]
mean = 0.3
std = 0.4
[loader]
batch_size = 16
[model]
{model}
[train]
epochs = 2
lr = 1e-2
{extra}"#
    )
}

fn accuracy(dir: &Path) -> f64 {
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("test/metrics.json")).unwrap()).unwrap();
    m["report"]["accuracy"].as_f64().unwrap()
}

#[test]
fn a_student_learns_from_a_frozen_teacher() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (px, lab) = make(160, 1);
    write_idx(&d.join("train-images"), &[160, 8, 8], &px);
    write_idx(&d.join("train-labels"), &[160], &lab);
    let (px, lab) = make(40, 2);
    write_idx(&d.join("test-images"), &[40, 8, 8], &px);
    write_idx(&d.join("test-labels"), &[40], &lab);

    std::fs::write(
        d.join("teacher.toml"),
        config("kind = \"cnn\"\nwidth = 8", "teacher", ""),
    )
    .unwrap();
    ok_log(&trident(&["train", "--config", "teacher.toml"], d));
    let teacher_weights = std::fs::read(d.join("teacher/best/model.safetensors")).unwrap();

    let distill = "[distill]\nteacher = \"teacher/best\"\n[distill.loss]\nkind = \"soft\"\ntemperature = 2.0\nalpha = 0.8\n";
    std::fs::write(
        d.join("student.toml"),
        config("kind = \"cnn\"\nwidth = 2", "student", distill),
    )
    .unwrap();
    let log = ok_log(&trident(&["distill", "--config", "student.toml"], d));
    assert!(log.contains("teacher teacher/best"), "{log}");

    // The teacher is untouched, bit for bit; the student learnt the four classes.
    assert_eq!(
        std::fs::read(d.join("teacher/best/model.safetensors")).unwrap(),
        teacher_weights,
        "the teacher's weights changed"
    );
    let acc = accuracy(&d.join("student"));
    assert!(acc >= 0.9, "the distilled student reaches {acc} (chance is 0.25)");
    // The run's report sets the student beside the teacher.
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("student/report.json")).unwrap()).unwrap();
    let (s, t) = (&report["student"], &report["distill"]["teacher"]);
    assert!(
        s["params"].as_u64().unwrap() < t["params"].as_u64().unwrap(),
        "{report}"
    );
    assert_eq!(s["test_accuracy"].as_f64().unwrap(), acc);
    assert_eq!(t["test_accuracy"].as_f64().unwrap(), accuracy(&d.join("teacher")));
    let retained = report["distill"]["accuracy_retained_pct"].as_f64().unwrap();
    assert!((retained - 100.0 * acc / t["test_accuracy"].as_f64().unwrap()).abs() < 1e-9);
    assert_eq!(
        s["size_bytes"].as_u64().unwrap(),
        std::fs::metadata(d.join("student/best/model.safetensors"))
            .unwrap()
            .len()
    );
    for m in [s, t] {
        let l = &m["latency"];
        assert!(l["samples"].as_u64().unwrap() > 0 && l["p50_ms"].as_f64().unwrap() > 0.0);
        assert!(l["p50_ms"].as_f64() <= l["p99_ms"].as_f64(), "{l}");
    }
    assert_eq!(report["epoch_seconds"].as_array().unwrap().len(), 2);
    assert!(report["peak_rss_bytes"].as_u64().unwrap() > 1 << 20);
    assert_eq!(report["distill"]["mode"], "online");
    // Its checkpoint is an ordinary one: `trident eval` reads it.
    ok_log(&trident(&["eval", "--model", "student/best"], d));

    // Hard (DeiT) distillation runs too.
    let hard = "[distill]\nteacher = \"teacher/best\"\n[distill.loss]\nkind = \"hard\"\n";
    std::fs::write(
        d.join("hard.toml"),
        config("kind = \"cnn\"\nwidth = 2", "hard", hard),
    )
    .unwrap();
    ok_log(&trident(&["distill", "--config", "hard.toml"], d));
    assert!(accuracy(&d.join("hard")) >= 0.9);

    // Cached mode: the first run computes every batch's teacher logits once, a second run
    // (another run directory, same teacher and data) computes none, and training itself
    // never runs the teacher.
    let cached = format!("{distill}mode = \"cached\"\ncache = \"logits.bin\"\n").replace(
        "[distill.loss]\nkind = \"soft\"\ntemperature = 2.0\nalpha = 0.8\n",
        "",
    ) + "[distill.loss]\nkind = \"soft\"\ntemperature = 2.0\nalpha = 0.8\n";
    for (run, first) in [("cached1", true), ("cached2", false)] {
        std::fs::write(
            d.join(format!("{run}.toml")),
            config("kind = \"cnn\"\nwidth = 2", run, &cached),
        )
        .unwrap();
        let log = ok_log(&trident(&["distill", "--config", &format!("{run}.toml")], d));
        // "teacher logits: 1 view(s) of the training set, R of T batches computed, …"
        let line = log
            .lines()
            .find(|l| l.contains("batches computed"))
            .expect("a fill line");
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = words.iter().position(|w| *w == "of" && words.len() > 1).unwrap();
        let at = words[at + 1..].iter().position(|w| *w == "of").unwrap() + at + 1;
        let (ran, total): (u64, u64) = (words[at - 1].parse().unwrap(), words[at + 1].parse().unwrap());
        assert!(total > 0, "{line}");
        assert_eq!(ran, if first { total } else { 0 }, "{run}: {line}");
        assert!(
            log.contains("teacher: 0 batches run during training"),
            "{run}: {log}"
        );
        assert!(accuracy(&d.join(run)) >= 0.9, "{run}");
    }
    // Top-k storage: its own file beside the teacher (2 of 4 logits a row), a student
    // that learns from it, and no top-k in online mode.
    let top = distill.replace(
        "teacher/best\"\n",
        "teacher/best\"\nmode = \"cached\"\ntop_k = 2\n",
    );
    std::fs::write(
        d.join("top.toml"),
        config("kind = \"cnn\"\nwidth = 2", "top", &top),
    )
    .unwrap();
    ok_log(&trident(&["distill", "--config", "top.toml"], d));
    assert!(d.join("teacher/teacher-logits-top2.bin").is_file());
    assert!(accuracy(&d.join("top")) >= 0.9);
    let online_top = distill.replace("teacher/best\"\n", "teacher/best\"\ntop_k = 2\n");
    std::fs::write(
        d.join("t2.toml"),
        config("kind = \"cnn\"\nwidth = 2", "t2", &online_top),
    )
    .unwrap();
    let err = failed(&trident(&["distill", "--config", "t2.toml"], d));
    assert!(err.contains("distill.top_k is only used with"), "{err}");

    // The same cache for a changed teacher is refused before training.
    let cache = std::fs::read(d.join("logits.bin")).unwrap();
    let header_end = cache.iter().position(|&b| b == b'\n').unwrap();
    let header = String::from_utf8(cache[..header_end].to_vec()).unwrap();
    let fp_start = header.find("crc32c:").unwrap() + "crc32c:".len();
    let mut stale = cache.clone();
    stale[fp_start] = if stale[fp_start] == b'0' { b'1' } else { b'0' };
    std::fs::write(d.join("logits.bin"), stale).unwrap();
    std::fs::write(
        d.join("stale.toml"),
        config("kind = \"cnn\"\nwidth = 2", "stale", &cached),
    )
    .unwrap();
    let err = failed(&trident(&["distill", "--config", "stale.toml"], d));
    assert!(err.contains("stale teacher-logit cache"), "{err}");
    assert!(!d.join("stale").exists());

    // Bad input, refused before a run directory is made.
    let cases = [
        (
            "no-teacher",
            distill.replace("teacher/best", "nowhere"),
            "classes = [\"a\", \"b\", \"c\", \"d\"]",
            "not a checkpoint",
        ),
        (
            "classes",
            distill.to_string(),
            "classes = [\"a\", \"b\", \"c\", \"x\"]",
            "differ from the student's",
        ),
        (
            "norm",
            distill.to_string(),
            "classes = [\"a\", \"b\", \"c\", \"d\"]\nmean = 0.5",
            "mean/std",
        ),
    ];
    for (name, section, classes, want) in cases {
        let text = config("kind = \"cnn\"\nwidth = 2", name, &section)
            .replace("classes = [\"a\", \"b\", \"c\", \"d\"]", classes);
        let text = if name == "norm" {
            text.replace("mean = 0.3\n", "")
        } else {
            text
        };
        std::fs::write(d.join(format!("{name}.toml")), text).unwrap();
        let err = failed(&trident(&["distill", "--config", &format!("{name}.toml")], d));
        assert!(err.contains(want), "{name}: {err}");
        assert!(!d.join(name).exists(), "{name}: a run directory was made");
    }
    let err = failed(&trident(&["train", "--config", "student.toml"], d));
    assert!(err.contains("trident distill --config"), "{err}");
    let err = failed(&trident(&["distill", "--config", "teacher.toml"], d));
    assert!(err.contains("needs a [distill] section"), "{err}");
    let bad = config("kind = \"cnn\"\nwidth = 2", "t0", &distill.replace("2.0", "0.0"));
    std::fs::write(d.join("t0.toml"), bad).unwrap();
    let err = failed(&trident(&["distill", "--config", "t0.toml"], d));
    assert!(err.contains("distill.temperature"), "{err}");
    // A cache path in online mode would be ignored: refused instead.
    let ignored = config(
        "kind = \"cnn\"\nwidth = 2",
        "t1",
        &distill.replace("teacher/best\"\n", "teacher/best\"\ncache = \"x.bin\"\n"),
    );
    std::fs::write(d.join("t1.toml"), ignored).unwrap();
    let err = failed(&trident(&["distill", "--config", "t1.toml"], d));
    assert!(err.contains("distill.cache is only used with"), "{err}");
}

fn text_run(d: &Path, run: &str, model: &str, extra: &str) -> String {
    let reviews = reviews_data("reviews.tsv");
    let cfg = format!(
        r#"
[run]
dir = "{run}"
seed = 3
{reviews}[loader]
batch_size = 8
[model]
{model}
[train]
epochs = 3
lr = 3e-3
warmup_steps = 2
{extra}"#
    );
    let f = format!("{run}.toml");
    std::fs::write(d.join(&f), cfg).unwrap();
    f
}

/// Text students of a fine-tuned BERT teacher: a shallower BERT made of chosen teacher
/// layers, and a BiLSTM reading the teacher's tokenizer; a student with another tokenizer
/// or layers the teacher lacks is refused.
#[test]
fn text_students_learn_from_a_bert_teacher() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write_texts(d);
    let bert = tiny_bert();
    let teacher = text_run(
        d,
        "teacher",
        &format!(
            "kind = \"bert\"\npretrained = \"{}\"\npooling = \"cls\"",
            bert.display()
        ),
        "",
    );
    ok_log(&trident(&["train", "--config", &teacher], d));
    let distill = "[distill]\nteacher = \"teacher/best\"\nmode = \"cached\"\n[distill.loss]\nkind = \"soft\"\ntemperature = 2.0\nalpha = 0.5\n";

    // One encoder layer of the two: the teacher's layer 1 (and its embeddings and head).
    let layers = "kind = \"bert\"\npretrained = \"teacher/best\"\npooling = \"cls\"\nlayers = [1]";
    let f = text_run(d, "shallow", layers, distill);
    let log = ok_log(&trident(&["distill", "--config", &f], d));
    assert!(!log.contains("initialised (not in the pretrained file)"), "{log}");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("shallow/best/config.json")).unwrap()).unwrap();
    assert_eq!(config["num_hidden_layers"], 1);
    let names = String::from_utf8_lossy(&std::fs::read(d.join("shallow/best/model.safetensors")).unwrap())
        .into_owned();
    assert!(names.contains("bert.encoder.layer.0.") && !names.contains("bert.encoder.layer.1."));
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("shallow/report.json")).unwrap()).unwrap();
    let ratio = report["distill"]["param_ratio"].as_f64().unwrap();
    assert!(ratio > 0.5 && ratio < 1.0, "one of two layers kept: {ratio}");
    assert!(accuracy(&d.join("shallow")) >= 0.9, "{report}");
    // The student's checkpoint loads alone.
    ok_log(&trident(&["eval", "--model", "shallow/best"], d));

    // A narrower student (hidden 8 of 16): nothing of the teacher fits, so all of it is
    // initialised, and its checkpoint describes its own width.
    let narrow = format!("{layers}\nhidden = 8\nheads = 2\nintermediate = 16");
    let f = text_run(d, "narrow", &narrow, distill);
    let log = ok_log(&trident(&["distill", "--config", &f], d));
    assert!(
        log.contains("pretrained tensors of other shapes are initialised"),
        "{log}"
    );
    assert!(
        log.contains("embeddings projected onto the 8 leading principal directions"),
        "{log}"
    );
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("narrow/best/config.json")).unwrap()).unwrap();
    assert_eq!(
        (
            &config["hidden_size"],
            &config["num_attention_heads"],
            &config["intermediate_size"]
        ),
        (&8.into(), &2.into(), &16.into())
    );
    ok_log(&trident(&["eval", "--model", "narrow/best"], d));
    let f = text_run(d, "bad-heads", &narrow.replace("heads = 2", "heads = 3"), distill);
    let err = failed(&trident(&["distill", "--config", &f], d));
    assert!(err.contains("the heads must divide the hidden size"), "{err}");

    // Hidden-state matching (online): the student's embeddings and layer match the
    // teacher's embeddings and last layer.
    let hidden = "[distill]\nteacher = \"teacher/best\"\n[distill.hidden]\npairs = [[0, 0], [1, 2]]\nweight = 0.5\n[distill.loss]\nkind = \"soft\"\ntemperature = 2.0\nalpha = 0.5\n";
    let f = text_run(d, "matched", layers, hidden);
    ok_log(&trident(&["distill", "--config", &f], d));
    assert!(accuracy(&d.join("matched")) >= 0.9);
    // Interrupted after 2 optimizer steps and resumed, it ends with the same weights.
    let f = text_run(d, "matched-parts", layers, hidden);
    let log = ok_log(&trident(
        &["distill", "--config", &f, "--stop-after-steps", "2"],
        d,
    ));
    assert!(log.contains("resume with `trident distill"), "{log}");
    ok_log(&trident(&["distill", "--config", &f, "--resume"], d));
    for file in ["last/model.safetensors", "last/optimizer.safetensors"] {
        assert!(
            std::fs::read(d.join("matched").join(file)).unwrap()
                == std::fs::read(d.join("matched-parts").join(file)).unwrap(),
            "{file} differs between the uninterrupted and the resumed distillation"
        );
    }
    for (name, section, want) in [
        (
            "pair-range",
            hidden.replace("[1, 2]", "[1, 3]"),
            "[1, 3] is out of range",
        ),
        (
            "pair-cached",
            hidden.replace("teacher/best\"\n", "teacher/best\"\nmode = \"cached\"\n"),
            "distill.hidden needs distill.mode = \"online\"",
        ),
    ] {
        let f = text_run(d, name, layers, &section);
        let err = failed(&trident(&["distill", "--config", &f], d));
        assert!(err.contains(want), "{name}: {err}");
        assert!(!d.join(name).exists());
    }

    let f = text_run(d, "narrow-hidden", &narrow, hidden);
    let err = failed(&trident(&["distill", "--config", &f], d));
    assert!(err.contains("hidden size is 8, the teacher's 16"), "{err}");

    // A BiLSTM on the teacher's tokenizer.
    let lstm = format!(
        "kind = \"lstm\"\ntokenizer = \"{}\"\nembed = 16\nhidden = 16",
        bert.join("tokenizer.json").display()
    );
    let f = text_run(d, "lstm", &lstm, distill);
    ok_log(&trident(&["distill", "--config", &f], d));
    assert!(accuracy(&d.join("lstm")) >= 0.9);
    // Its embedding table can start from the teacher's, projected to its width.
    let pca = format!("{lstm}\nembeddings = \"teacher/best\"");
    let f = text_run(d, "lstm-pca", &pca, distill);
    let log = ok_log(&trident(&["distill", "--config", &f], d));
    assert!(
        log.contains("projected onto their 16 leading principal directions"),
        "{log}"
    );
    assert!(accuracy(&d.join("lstm-pca")) >= 0.9);
    // It has no transformer layers to match.
    let f = text_run(d, "lstm-hidden", &lstm, hidden);
    let err = failed(&trident(&["distill", "--config", &f], d));
    assert!(err.contains("must both be one"), "{err}");

    // Refused before training: another tokenizer (two words swap ids), missing layers.
    let tok = std::fs::read_to_string(bert.join("tokenizer.json"))
        .unwrap()
        .replace("\"good\": 5", "\"good\": 9")
        .replace("\"bad\": 9", "\"bad\": 5");
    std::fs::write(d.join("other-tokenizer.json"), tok).unwrap();
    let f = text_run(
        d,
        "other-tok",
        "kind = \"lstm\"\ntokenizer = \"other-tokenizer.json\"\nembed = 16\nhidden = 16",
        distill,
    );
    let err = failed(&trident(&["distill", "--config", &f], d));
    assert!(err.contains("tokenizer.json differs"), "{err}");
    let f = text_run(d, "wide-embed", &pca.replace("embed = 16", "embed = 32"), distill);
    let err = failed(&trident(&["distill", "--config", &f], d));
    assert!(err.contains("model.embed = 32 is wider than"), "{err}");
    assert!(!d.join("other-tok").exists());
    let f = text_run(d, "deep", &layers.replace("[1]", "[0, 2]"), distill);
    let err = failed(&trident(&["distill", "--config", &f], d));
    assert!(
        err.contains("model.layers = [0, 2]") && err.contains("0..2"),
        "{err}"
    );
    assert!(!d.join("deep").exists());
}
