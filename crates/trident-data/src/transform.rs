//! Image normalisation and augmentation, and sequence padding.
//!
//! Augmentations draw from a [`SplitMix64`] seeded by (seed, epoch, example index), so an
//! example gets the same crop and flip whenever its epoch is replayed (resume, cached
//! teacher logits per augmented view) and a different one each epoch.

use crate::rng::SplitMix64;

/// `(x - mean) / std` in place.
pub fn normalize(pixels: &mut [f32], mean: f32, std: f32) {
    for p in pixels {
        *p = (*p - mean) / std;
    }
}

/// Mirrors an `h × w` single-channel image left to right, in place.
pub fn hflip(pixels: &mut [f32], h: usize, w: usize) {
    for row in pixels.chunks_exact_mut(w).take(h) {
        row.reverse();
    }
}

/// An `h × w` crop at a random offset of the image zero-padded by `pad` on each side
/// (the CIFAR/Fashion-MNIST recipe): the result has the input's size.
pub fn random_crop(pixels: &[f32], h: usize, w: usize, pad: usize, rng: &mut SplitMix64) -> Vec<f32> {
    let dy = rng.below(2 * pad as u64 + 1) as isize - pad as isize;
    let dx = rng.below(2 * pad as u64 + 1) as isize - pad as isize;
    let mut out = vec![0.0; h * w];
    for y in 0..h {
        for x in 0..w {
            let (sy, sx) = (y as isize + dy, x as isize + dx);
            if (0..h as isize).contains(&sy) && (0..w as isize).contains(&sx) {
                out[y * w + x] = pixels[sy as usize * w + sx as usize];
            }
        }
    }
    out
}

/// Standard augmentation of one example: random crop with `pad`, then a horizontal flip
/// with probability one half, reproducible from (seed, epoch, index).
pub fn augment(
    pixels: &[f32],
    h: usize,
    w: usize,
    pad: usize,
    seed: u64,
    epoch: u64,
    index: u64,
) -> Vec<f32> {
    let mut rng = SplitMix64::from_parts(&[seed, epoch, index]);
    let mut out = random_crop(pixels, h, w, pad, &mut rng);
    if rng.next_u64() & 1 == 1 {
        hflip(&mut out, h, w);
    }
    out
}

/// Pads (or truncates) token sequences to one length: the longest sequence, capped at
/// `max_len`. Returns the ids and the attention mask (1 = token, 0 = padding), row-major.
pub fn pad_sequences(seqs: &[Vec<u32>], pad_id: u32, max_len: usize) -> (Vec<u32>, Vec<u32>, usize) {
    let len = seqs.iter().map(Vec::len).max().unwrap_or(0).min(max_len);
    let (ids, mask) = pad_to(seqs, pad_id, len);
    (ids, mask, len)
}

/// `seqs` cut or padded with `pad_id` to exactly `len` each: row-major ids and the 0/1
/// mask.
pub fn pad_to(seqs: &[Vec<u32>], pad_id: u32, len: usize) -> (Vec<u32>, Vec<u32>) {
    let mut ids = Vec::with_capacity(seqs.len() * len);
    let mut mask = Vec::with_capacity(seqs.len() * len);
    for s in seqs {
        let n = s.len().min(len);
        ids.extend_from_slice(&s[..n]);
        ids.extend(std::iter::repeat_n(pad_id, len - n));
        mask.extend(std::iter::repeat_n(1, n).chain(std::iter::repeat_n(0, len - n)));
    }
    (ids, mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flip_crop_and_normalize() {
        let mut img: Vec<f32> = (0..6).map(|v| v as f32).collect(); // 2 × 3
        hflip(&mut img, 2, 3);
        assert_eq!(img, [2., 1., 0., 5., 4., 3.]);
        normalize(&mut img, 1.0, 2.0);
        assert_eq!(img[0], 0.5);
        let crop = random_crop(&img, 2, 3, 0, &mut SplitMix64::new(1));
        assert_eq!(crop, img, "no padding: the crop is the image");
    }

    #[test]
    fn augmentation_is_reproducible_per_epoch_and_index() {
        let img: Vec<f32> = (0..64).map(|v| v as f32).collect();
        let a = augment(&img, 8, 8, 2, 7, 3, 11);
        assert_eq!(a, augment(&img, 8, 8, 2, 7, 3, 11));
        let varied = (0..8).filter(|&e| augment(&img, 8, 8, 2, 7, e, 11) != a).count();
        assert!(varied >= 5, "other epochs give other views ({varied}/8 differ)");
        assert_eq!(a.len(), 64);
    }

    #[test]
    fn pads_and_truncates() {
        let (ids, mask, len) = pad_sequences(&[vec![5, 6, 7], vec![8]], 0, 2);
        assert_eq!(len, 2);
        assert_eq!(ids, [5, 6, 8, 0]);
        assert_eq!(mask, [1, 1, 1, 0]);
    }
}
