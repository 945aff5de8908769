//! What load to offer when: traffic phases (closed loop), concurrency ranges, and request
//! arrival times (open loop, constant or Poisson).

use anyhow::{bail, Context, Result};
use std::time::Duration;
use trident_data::rng::SplitMix64;

/// One traffic phase, with the semantics of SageMaker Inference Recommender's
/// `TrafficPattern` phases: the phase starts with `initial_users` and adds
/// `spawn_per_minute` users per minute (spread evenly over the minute) for `duration`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Phase {
    /// Users at the start of the phase.
    pub initial_users: u32,
    /// Users added per minute.
    pub spawn_per_minute: f64,
    /// Length of the phase.
    pub duration: Duration,
}

/// Phases run one after another.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Phases(pub Vec<Phase>);

impl Phases {
    /// Parses `initial:spawn_per_minute:seconds[,…]`, e.g. `2:2:60,10:0:120`.
    pub fn parse(s: &str) -> Result<Self> {
        let mut phases = Vec::new();
        for (i, part) in s.split(',').enumerate() {
            let fields: Vec<&str> = part.trim().split(':').collect();
            let [users, spawn, secs] = fields[..] else {
                bail!(
                    "--phases: phase {} is `{part}`, expected initial_users:spawn_per_minute:seconds",
                    i + 1
                )
            };
            let initial_users: u32 = users.parse().with_context(|| {
                format!(
                    "--phases: phase {}: initial users `{users}` is not a whole number",
                    i + 1
                )
            })?;
            let spawn_per_minute: f64 = spawn
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && *v >= 0.0)
                .with_context(|| {
                    format!(
                        "--phases: phase {}: spawn rate `{spawn}` is not a number ≥ 0",
                        i + 1
                    )
                })?;
            let secs: f64 = secs
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && *v > 0.0)
                .with_context(|| {
                    format!(
                        "--phases: phase {}: duration `{secs}` is not a number of seconds > 0",
                        i + 1
                    )
                })?;
            if initial_users == 0 && spawn_per_minute == 0.0 {
                bail!("--phases: phase {} has no users and spawns none", i + 1)
            }
            phases.push(Phase {
                initial_users,
                spawn_per_minute,
                duration: Duration::from_secs_f64(secs),
            });
        }
        Ok(Phases(phases))
    }

    /// Total length.
    pub fn total(&self) -> Duration {
        self.0.iter().map(|p| p.duration).sum()
    }

    /// (phase index, users) at time `t` since the start; `None` once every phase is over.
    pub fn at(&self, t: Duration) -> Option<(usize, u32)> {
        let mut start = Duration::ZERO;
        for (i, p) in self.0.iter().enumerate() {
            if t < start + p.duration {
                let into = (t - start).as_secs_f64();
                let spawned = (p.spawn_per_minute * into / 60.0).floor() as u32;
                return Some((i, p.initial_users.saturating_add(spawned)));
            }
            start += p.duration;
        }
        None
    }

    /// The most users any moment asks for.
    pub fn max_users(&self) -> u32 {
        self.0
            .iter()
            .map(|p| {
                let spawned = (p.spawn_per_minute * p.duration.as_secs_f64() / 60.0).floor() as u32;
                p.initial_users.saturating_add(spawned)
            })
            .max()
            .unwrap_or(0)
    }
}

/// `start[:end[:step]]` of `flag`, with end = start and step = `unit` when left out.
fn triple<T: std::str::FromStr + Copy>(flag: &str, s: &str, unit: T, what: &str) -> Result<(T, T, T)> {
    let nums: Vec<T> = s
        .split(':')
        .map(|v| v.trim().parse::<T>().ok())
        .collect::<Option<_>>()
        .with_context(|| format!("{flag}: `{s}` is not start[:end[:step]] of {what}"))?;
    match nums[..] {
        [a] => Ok((a, a, unit)),
        [a, b] => Ok((a, b, unit)),
        [a, b, c] => Ok((a, b, c)),
        _ => bail!("{flag}: `{s}` has more than three parts (start:end:step)"),
    }
}

/// Parses a perf_analyzer-style range `start[:end[:step]]` (end inclusive, linear step
/// default 1) of whole numbers ≥ 1.
pub fn parse_range(flag: &str, s: &str) -> Result<Vec<u32>> {
    let (start, end, step) = triple(flag, s, 1u32, "whole numbers")?;
    if start == 0 || step == 0 || end < start {
        bail!("{flag}: `{s}` needs 1 ≤ start ≤ end and step ≥ 1")
    }
    Ok((start..=end).step_by(step as usize).collect())
}

/// Parses a range of request rates `start[:end[:step]]` (requests per second, > 0).
pub fn parse_rates(s: &str) -> Result<Vec<f64>> {
    let (start, end, step) = triple("--request-rate", s, 1.0f64, "numbers")?;
    if !(start > 0.0 && end >= start && step > 0.0 && end.is_finite()) {
        bail!("--request-rate: `{s}` needs 0 < start ≤ end and step > 0")
    }
    let n = ((end - start) / step + 1e-9).floor() as usize;
    Ok((0..=n).map(|i| start + i as f64 * step).collect())
}

/// How request arrivals are spaced in request-rate mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Distribution {
    /// Evenly, `1 / rate` apart.
    Constant,
    /// Exponential gaps of mean `1 / rate` (a Poisson process).
    Poisson,
}

/// Intended send times, in seconds from the start, of an open-loop load.
pub struct Arrivals {
    rate: f64,
    distribution: Distribution,
    rng: SplitMix64,
    next: f64,
    count: u64,
}

impl Arrivals {
    /// Arrivals at `rate` per second, seeded.
    pub fn new(rate: f64, distribution: Distribution, seed: u64) -> Self {
        Arrivals {
            rate,
            distribution,
            rng: SplitMix64::new(seed),
            next: 0.0,
            count: 0,
        }
    }
}

impl Iterator for Arrivals {
    type Item = f64;

    fn next(&mut self) -> Option<f64> {
        let t = match self.distribution {
            // From the count, not by summing gaps: no drift over long runs.
            Distribution::Constant => self.count as f64 / self.rate,
            Distribution::Poisson => {
                let t = self.next;
                // 1 - u lies in (0, 1]: the logarithm is finite.
                let u = (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                self.next += -(1.0 - u).ln() / self.rate;
                t
            }
        };
        self.count += 1;
        Some(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_follow_the_traffic_pattern_semantics() {
        let p = Phases::parse("2:2:60, 10:0:120").unwrap();
        assert_eq!(p.total(), Duration::from_secs(180));
        let at = |s: f64| p.at(Duration::from_secs_f64(s));
        assert_eq!(at(0.0), Some((0, 2)));
        assert_eq!(at(29.9), Some((0, 2)));
        assert_eq!(at(30.0), Some((0, 3)), "2 per minute: one more every 30 s");
        assert_eq!(at(59.9), Some((0, 3)));
        assert_eq!(
            at(60.0),
            Some((1, 10)),
            "a phase starts from its own initial users"
        );
        assert_eq!(at(179.9), Some((1, 10)));
        assert_eq!(at(180.0), None);
        assert_eq!(p.max_users(), 10);
        assert_eq!(Phases::parse("0:60:10").unwrap().max_users(), 10);
    }

    #[test]
    fn bad_phases_and_ranges_are_named() {
        for (bad, says) in [
            ("2:2", "phase 1 is `2:2`"),
            ("1:1:10,x:1:1", "phase 2: initial users `x`"),
            ("1:-1:10", "spawn rate `-1`"),
            ("1:1:0", "duration `0`"),
            ("0:0:10", "no users"),
        ] {
            let e = Phases::parse(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
        assert_eq!(parse_range("--concurrency-range", "1:8:3").unwrap(), [1, 4, 7]);
        assert_eq!(parse_range("--concurrency-range", "4").unwrap(), [4]);
        assert!(parse_range("--concurrency-range", "0:4").is_err());
        assert!(parse_range("--concurrency-range", "4:1").is_err());
        assert_eq!(parse_rates("100:300:100").unwrap(), [100.0, 200.0, 300.0]);
        assert!(parse_rates("-5").is_err());
    }

    #[test]
    fn constant_arrivals_are_evenly_spaced() {
        let t: Vec<f64> = Arrivals::new(4.0, Distribution::Constant, 0).take(5).collect();
        assert_eq!(t, [0.0, 0.25, 0.5, 0.75, 1.0]);
    }

    /// The gaps of a Poisson process are exponential: mean and standard deviation 1/rate,
    /// and P(gap > 1/rate) = e⁻¹. 200 000 gaps put each estimate within 1 % (many
    /// standard errors).
    #[test]
    fn poisson_arrivals_have_exponential_gaps() {
        let rate = 50.0;
        let t: Vec<f64> = Arrivals::new(rate, Distribution::Poisson, 7)
            .take(200_001)
            .collect();
        let gaps: Vec<f64> = t.windows(2).map(|w| w[1] - w[0]).collect();
        let n = gaps.len() as f64;
        let mean = gaps.iter().sum::<f64>() / n;
        let sd = (gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / n).sqrt();
        let above = gaps.iter().filter(|&&g| g > 1.0 / rate).count() as f64 / n;
        assert!((mean * rate - 1.0).abs() < 0.01, "mean gap {mean}");
        assert!((sd * rate - 1.0).abs() < 0.01, "sd {sd}");
        assert!((above - (-1f64).exp()).abs() < 0.01, "P(gap > mean) {above}");
        assert!(gaps.iter().all(|g| *g > 0.0));
    }
}
