//! What the step examples (`minilm_step`, `vision_step`) share: the precision from
//! `PRECISION`, and the timed loop whose lines `benches/step_ab.sh` reads.

use std::time::Instant;

/// `PRECISION=bf16` turns on mixed precision while the returned guard lives; prints which.
pub fn precision_from_env() -> trident_nn::bf16::Autocast {
    let bf16 = std::env::var("PRECISION").is_ok_and(|v| v == "bf16");
    let guard = trident_nn::bf16::autocast(bf16);
    eprintln!(
        "precision: {}",
        if bf16 {
            format!("bf16 mixed ({})", trident_nn::bf16::mixed_precision())
        } else {
            "f32".into()
        }
    );
    guard
}

/// The ends of a step's phases, marked by the step as it goes (forward, backward,
/// optimizer).
pub struct Clock(Vec<Instant>);

impl Clock {
    /// Marks the end of the phase running now.
    pub fn mark(&mut self) {
        self.0.push(Instant::now());
    }
}

/// Runs steps 0..=`steps` with `step(n, clock)` (which returns the loss and marks its three
/// phases), printing `step N: loss L  forward F ms  backward B ms  optimizer O ms` for
/// each; step 0 warms caches and allocators and is not in the medians. The last line gives
/// the medians under `label`, the batch and the process's peak resident memory (VmHWM).
pub fn run(
    label: &str,
    steps: usize,
    batch: usize,
    mut step: impl FnMut(usize, &mut Clock) -> anyhow::Result<f32>,
) -> anyhow::Result<()> {
    let mut phases: [Vec<f64>; 3] = Default::default();
    for n in 0..=steps {
        let mut clock = Clock(vec![Instant::now()]);
        let loss = step(n, &mut clock)?;
        let t = &clock.0;
        anyhow::ensure!(
            t.len() == 4,
            "a step marks three phases, this one marked {}",
            t.len() - 1
        );
        let ms: Vec<f64> = t.windows(2).map(|w| (w[1] - w[0]).as_secs_f64() * 1e3).collect();
        eprintln!(
            "step {n}: loss {loss:.6}  forward {:.1} ms  backward {:.1} ms  optimizer {:.1} ms",
            ms[0], ms[1], ms[2]
        );
        if n > 0 {
            phases.iter_mut().zip(&ms).for_each(|(p, &v)| p.push(v));
        }
    }
    let [f, b, o] = phases.map(|mut v| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    });
    let peak = trident_train::monitor::peak_rss_bytes().unwrap_or(0) as f64 / (1 << 20) as f64;
    println!(
        "{label} median over {steps} steps: forward {f:.1} ms  backward {b:.1} ms  optimizer {o:.1} ms  step {:.1} ms  batch {batch}  peak RSS {peak:.0} MiB",
        f + b + o
    );
    Ok(())
}
