//! gymnasium's random numbers, reproduced: `reset(seed=s)` seeds
//! `np.random.Generator(PCG64(SeedSequence(s)))`, and the environments draw doubles from it.
//! numpy's `SeedSequence` (its entropy pool and hash) is written here, since no crate
//! reproduces it; the PCG64 generator itself is `rand_pcg`'s, which numpy's equals (same
//! 128-bit LCG, seeding, and XSL-RR output).

use rand_core::RngCore;
use rand_pcg::Pcg64;

const INIT_A: u32 = 0x43b0_d7e5;
const MULT_A: u32 = 0x931e_8875;
const INIT_B: u32 = 0x8b51_f9dd;
const MULT_B: u32 = 0x58f3_8ded;
const MIX_MULT_L: u32 = 0xca01_f9dd;
const MIX_MULT_R: u32 = 0x4973_f715;
const XSHIFT: u32 = 16;
const POOL_SIZE: usize = 4;

/// numpy's `SeedSequence(entropy)` without spawn keys: its pool of four 32-bit words mixed
/// from the entropy's 32-bit words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedSequence {
    pool: [u32; POOL_SIZE],
}

impl SeedSequence {
    /// The sequence of a non-negative integer seed (its 32-bit words, least significant
    /// first, as numpy splits a Python int).
    pub fn new(seed: u128) -> Self {
        let mut words = Vec::new();
        let mut rest = seed;
        loop {
            words.push(rest as u32);
            rest >>= 32;
            if rest == 0 {
                break;
            }
        }
        let mut hash_const = INIT_A;
        let mut hashmix = |value: u32| {
            let mut value = value ^ hash_const;
            hash_const = hash_const.wrapping_mul(MULT_A);
            value = value.wrapping_mul(hash_const);
            value ^ (value >> XSHIFT)
        };
        let mix = |x: u32, y: u32| {
            let r = MIX_MULT_L
                .wrapping_mul(x)
                .wrapping_sub(MIX_MULT_R.wrapping_mul(y));
            r ^ (r >> XSHIFT)
        };
        let mut pool = [0u32; POOL_SIZE];
        for (i, slot) in pool.iter_mut().enumerate() {
            *slot = hashmix(words.get(i).copied().unwrap_or(0));
        }
        for src in 0..POOL_SIZE {
            for dst in 0..POOL_SIZE {
                if src != dst {
                    let h = hashmix(pool[src]);
                    pool[dst] = mix(pool[dst], h);
                }
            }
        }
        for &word in words.iter().skip(POOL_SIZE) {
            for slot in pool.iter_mut() {
                let h = hashmix(word);
                *slot = mix(*slot, h);
            }
        }
        SeedSequence { pool }
    }

    /// `generate_state(n, np.uint64)`: `n` 64-bit words, each two 32-bit words of the
    /// stream, low word first.
    pub fn generate_u64(&self, n: usize) -> Vec<u64> {
        let mut hash_const = INIT_B;
        let words: Vec<u32> = (0..2 * n)
            .map(|i| {
                let mut v = self.pool[i % POOL_SIZE] ^ hash_const;
                hash_const = hash_const.wrapping_mul(MULT_B);
                v = v.wrapping_mul(hash_const);
                v ^ (v >> XSHIFT)
            })
            .collect();
        words
            .chunks(2)
            .map(|p| u64::from(p[0]) | (u64::from(p[1]) << 32))
            .collect()
    }
}

/// An environment's generator: numpy's `Generator(PCG64(SeedSequence(seed)))`, with the
/// draws gymnasium's environments make.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NpRandom {
    pcg: Pcg64,
}

impl NpRandom {
    /// gymnasium's `seeding.np_random(seed)`.
    pub fn from_seed(seed: u64) -> Self {
        let s = SeedSequence::new(u128::from(seed)).generate_u64(4);
        let state = (u128::from(s[0]) << 64) | u128::from(s[1]);
        let stream = (u128::from(s[2]) << 64) | u128::from(s[3]);
        NpRandom {
            pcg: Pcg64::new(state, stream),
        }
    }

    /// A generator from the operating system's entropy (`reset()` before any seed).
    pub fn from_entropy() -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        Self::from_seed(h.finish())
    }

    /// `random()`: a double in [0, 1) from the top 53 bits of the next output.
    pub fn random(&mut self) -> f64 {
        (self.pcg.next_u64() >> 11) as f64 * (1.0 / 9_007_199_254_740_992.0)
    }

    /// `uniform(low, high)`: `low + (high - low) · random()`.
    pub fn uniform(&mut self, low: f64, high: f64) -> f64 {
        let range = high - low;
        low + range * self.random()
    }

    /// gymnasium's `categorical_sample(p)`: the first index whose running sum of `p`
    /// (summed left to right, as `np.cumsum`) exceeds one `random()` draw; 0 if none does.
    pub fn categorical(&mut self, p: &[f64]) -> usize {
        let r = self.random();
        let mut sum = 0.0;
        for (i, &pi) in p.iter().enumerate() {
            sum += pi;
            if sum > r {
                return i;
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CartPole-v1's reset draws, recorded from gymnasium 1.4.0 (numpy 2).
    #[test]
    fn cartpole_resets_match_numpy() {
        let draw = |seed| {
            let mut r = NpRandom::from_seed(seed);
            [0; 4].map(|_| r.uniform(-0.05, 0.05))
        };
        assert_eq!(
            draw(123),
            [
                0.018235186324814343,
                -0.04461789811977773,
                -0.027964012722738865,
                -0.03156281893013303
            ]
        );
        assert_eq!(
            draw(42),
            [
                0.027395604855596334,
                -0.006112156024794771,
                0.03585979199113824,
                0.019736802905936393
            ]
        );
    }
}
