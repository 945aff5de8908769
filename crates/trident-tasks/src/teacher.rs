//! Distillation's teacher: loaded from its checkpoint and checked against the student
//! (classes, input), its logits cached once over every view of the training set the run
//! will see (cached mode), and the distillation step of the student, the teacher and the
//! configured loss.

use crate::config::{self, DistillMode, RunConfig};
use crate::data::{InputSpec, Model};
use anyhow::{bail, Context};
use std::sync::atomic::Ordering;
use trident_data::Dataset;
use trident_train::distill::{teacher_fingerprint, Distill, LogitCache};
use trident_train::TrainStep;

/// The `[distill]` teacher, checked against the student before anything is trained: a
/// checkpoint of `trident train` with the same classes and the same input (image shape and
/// normalisation, or tokenizer).
pub fn load_teacher(c: &RunConfig, student: &Model) -> anyhow::Result<Option<(Model, Option<LogitCache>)>> {
    let Some(d) = &c.distill else { return Ok(None) };
    let dir = &d.teacher;
    if !dir.join("trident.json").is_file() {
        bail!(
            "distill.teacher = {}: not a checkpoint of `trident train` (no trident.json); train the teacher first",
            dir.display()
        )
    }
    let teacher =
        Model::load_checkpoint(dir).with_context(|| format!("distill.teacher = {}", dir.display()))?;
    if teacher.card.classes != student.card.classes {
        bail!(
            "distill.teacher = {}: its classes {:?} differ from the student's {:?}",
            dir.display(),
            teacher.card.classes,
            student.card.classes
        )
    }
    match (&teacher.card.input, &student.card.input) {
        (InputSpec::Image { .. }, InputSpec::Image { .. })
        | (InputSpec::Table { .. }, InputSpec::Table { .. }) => {
            let t = serde_json::to_string(&teacher.card.input)?;
            let s = serde_json::to_string(&student.card.input)?;
            if t != s {
                let what = match teacher.card.input {
                    InputSpec::Image { .. } => "image size and mean/std",
                    _ => "label, feature columns and scaling",
                };
                bail!(
                    "distill.teacher = {}: it was trained on input {t}, the student's data gives {s} \
                     (both models see the same batches: use the teacher's {what})",
                    dir.display()
                )
            }
        }
        (InputSpec::Text { .. }, InputSpec::Text { .. }) => {
            let tokenizer = |m: &Model| -> anyhow::Result<Option<Vec<u8>>> {
                Ok(m.checkpoint_files()?
                    .into_iter()
                    .find(|(n, _)| n == "tokenizer.json")
                    .map(|(_, b)| b))
            };
            if tokenizer(&teacher)? != tokenizer(student)? {
                bail!(
                    "distill.teacher = {}: its tokenizer.json differs from the student's (both models \
                     read the same token ids: give the student the teacher's tokenizer)",
                    dir.display()
                )
            }
        }
        _ => bail!(
            "distill.teacher = {}: the teacher and the student take different kinds of input",
            dir.display()
        ),
    }
    if let Some(h) = &d.hidden {
        let (Some((ts, tw)), Some((ss, sw))) = (teacher.hidden_layout(), student.hidden_layout()) else {
            bail!("distill.hidden matches transformer (bert) layers; the teacher and the student must both be one")
        };
        if tw != sw {
            bail!(
                "distill.hidden: the student's hidden size is {sw}, the teacher's {tw}; matching needs \
                 them equal (a learned projection is not built)"
            )
        }
        for &[s, t] in &h.pairs {
            if s >= ss || t >= ts {
                bail!(
                    "distill.hidden.pairs: [{s}, {t}] is out of range: the student has states 0..={}, \
                     the teacher 0..={} (0 = embeddings, i = after layer i)",
                    ss - 1,
                    ts - 1
                )
            }
        }
    }
    teacher.params.set_trainable("", false);
    let cache = match d.mode {
        DistillMode::Online => None,
        DistillMode::Cached => {
            let fingerprint = teacher_fingerprint(dir)?;
            let cache = LogitCache::open(&d.cache_path(), &fingerprint, teacher.card.classes.len(), d.top_k)?;
            eprintln!(
                "teacher-logit cache {}: {} entries for teacher {fingerprint}",
                cache.path().display(),
                cache.len()
            );
            Some(cache)
        }
    };
    Ok(Some((teacher, cache)))
}

/// Cached mode: runs the teacher once over every view of the training set the run will
/// see (one per epoch with augmentation, else one), storing what the cache lacks.
pub fn fill_cache<S, T, D>(
    step: &Distill<S, T>,
    train: &trident_data::DataLoader<D, S::Batch>,
    views: u64,
) -> anyhow::Result<()>
where
    S: TrainStep,
    S::Batch: trident_train::distill::RowKeys,
    T: TrainStep<Batch = S::Batch>,
    D: Dataset + 'static,
{
    let total = train.batches_per_epoch() as u64 * views;
    let bar = indicatif::ProgressBar::new(total).with_style(
        indicatif::ProgressStyle::with_template(
            "teacher logits {bar:30} {pos}/{len} batches {elapsed} (eta {eta})",
        )
        .expect("template"),
    );
    let before = step.teacher_batches.load(Ordering::Relaxed);
    let t0 = std::time::Instant::now();
    for epoch in 0..views {
        for batch in train.epoch(epoch) {
            step.teacher_logits(&batch?)?;
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    step.save_cache()?;
    let ran = step.teacher_batches.load(Ordering::Relaxed) - before;
    eprintln!(
        "teacher logits: {views} view(s) of the training set, {ran} of {total} batches computed, \
         the rest from the cache ({:.1} s)",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The distillation step of `d`'s loss and hidden-state matching.
pub fn distill_step(
    d: &config::DistillSection,
    student: Model,
    teacher: Model,
    cache: Option<LogitCache>,
) -> Distill<Model, Model> {
    let step = Distill::new(student, teacher, d.loss, cache);
    match &d.hidden {
        Some(h) => step.with_hidden(h.clone()),
        None => step,
    }
}
