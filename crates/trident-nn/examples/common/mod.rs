//! What the kernel benchmarks share.

use std::time::Instant;

/// The median wall time of `runs` calls of `f`, in milliseconds, after a quarter of a
/// second of untimed calls.
pub fn median_ms(runs: usize, mut f: impl FnMut()) -> f64 {
    // A quarter of a second, not one call: on the AMD EPYC VM the first tenth of a second
    // or so of a fresh process's work now and then ran at half speed, so the first shape
    // timed came out bimodal (`ONLY="CNN conv2"` forward 1.3 or 2.6 ms, the bf16 forward
    // product 3.1 or 6.2 ms in 1 run of 5 or so); with this warm-up, 1.35–1.5 in 8 runs and
    // 2.8–3.4 in 10.
    let warm = Instant::now();
    while warm.elapsed().as_secs_f64() < 0.25 {
        f();
    }
    let mut times: Vec<f64> = (0..runs.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(|a, b| a.total_cmp(b));
    times[times.len() / 2]
}
