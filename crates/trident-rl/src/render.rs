//! Pictures of an episode: each built-in environment drawn from its observation (CartPole's
//! cart and pole, Acrobot's two links, MountainCar's car on its hill, the grid worlds as
//! tiles), written as an animated GIF — RL users look at their agent before they trust a
//! number.

use crate::env::Obs;
use image::{Rgba, RgbaImage};
use std::path::Path;

const W: u32 = 300;
const H: u32 = 200;
const WHITE: Rgba<u8> = Rgba([255, 255, 255, 255]);
const BLACK: Rgba<u8> = Rgba([30, 30, 30, 255]);
const BLUE: Rgba<u8> = Rgba([66, 110, 200, 255]);
const BROWN: Rgba<u8> = Rgba([202, 152, 101, 255]);
const GREEN: Rgba<u8> = Rgba([80, 170, 90, 255]);
const RED: Rgba<u8> = Rgba([210, 70, 60, 255]);
const ICE: Rgba<u8> = Rgba([200, 230, 250, 255]);
const YELLOW: Rgba<u8> = Rgba([240, 200, 40, 255]);

fn rect(img: &mut RgbaImage, x0: i64, y0: i64, x1: i64, y1: i64, c: Rgba<u8>) {
    for y in y0.max(0)..y1.min(img.height() as i64) {
        for x in x0.max(0)..x1.min(img.width() as i64) {
            img.put_pixel(x as u32, y as u32, c);
        }
    }
}

fn disc(img: &mut RgbaImage, cx: f64, cy: f64, r: f64, c: Rgba<u8>) {
    let (x0, x1) = ((cx - r).floor() as i64, (cx + r).ceil() as i64);
    let (y0, y1) = ((cy - r).floor() as i64, (cy + r).ceil() as i64);
    for y in y0.max(0)..=y1.min(img.height() as i64 - 1) {
        for x in x0.max(0)..=x1.min(img.width() as i64 - 1) {
            let (dx, dy) = (x as f64 - cx, y as f64 - cy);
            if dx * dx + dy * dy <= r * r {
                img.put_pixel(x as u32, y as u32, c);
            }
        }
    }
}

fn line(img: &mut RgbaImage, a: (f64, f64), b: (f64, f64), width: f64, c: Rgba<u8>) {
    let n = ((b.0 - a.0).hypot(b.1 - a.1)).ceil().max(1.0) as usize;
    for i in 0..=n {
        let t = i as f64 / n as f64;
        disc(img, a.0 + t * (b.0 - a.0), a.1 + t * (b.1 - a.1), width / 2.0, c);
    }
}

/// CartPole's cart (4.8 units of track across the width, as gymnasium draws it) and pole.
fn cartpole(img: &mut RgbaImage, v: &[f32]) {
    // 4.8 units of track across the width, as gymnasium draws it.
    let scale = f64::from(W) / 4.8;
    let (x, theta) = (f64::from(v[0]), f64::from(v[2]));
    let (cx, cy) = (x * scale + f64::from(W) / 2.0, 140.0);
    rect(img, 0, 140, W as i64, 141, BLACK);
    rect(
        img,
        cx as i64 - 25,
        cy as i64 - 15,
        cx as i64 + 25,
        cy as i64 + 15,
        BLACK,
    );
    let len = scale * 1.0;
    line(
        img,
        (cx, cy - 5.0),
        (cx + len * theta.sin(), cy - 5.0 - len * theta.cos()),
        8.0,
        BROWN,
    );
    disc(img, cx, cy - 5.0, 4.0, BLUE);
}

/// Acrobot's two links hanging from the bar.
fn acrobot(img: &mut RgbaImage, v: &[f32]) {
    let (t1, t2) = (
        f64::from(v[1]).atan2(f64::from(v[0])),
        f64::from(v[3]).atan2(f64::from(v[2])),
    );
    let (ox, oy, l) = (f64::from(W) / 2.0, 100.0, 45.0);
    let p1 = (ox + l * t1.sin(), oy + l * t1.cos());
    let p2 = (p1.0 + l * (t1 + t2).sin(), p1.1 + l * (t1 + t2).cos());
    rect(img, 0, 55, W as i64, 56, BLACK);
    line(img, (ox, oy), p1, 8.0, BLUE);
    line(img, p1, p2, 8.0, BLUE);
    disc(img, ox, oy, 4.0, YELLOW);
    disc(img, p1.0, p1.1, 4.0, YELLOW);
}

/// MountainCar's hill, the flag and the car.
fn mountain_car(img: &mut RgbaImage, v: &[f32]) {
    let (lo, hi) = (-1.2, 0.6);
    let sx = f64::from(W) / (hi - lo);
    let y = |p: f64| 170.0 - ((3.0 * p).sin() * 0.45 + 0.55) * 120.0;
    for i in 0..W {
        let p = lo + f64::from(i) / sx;
        rect(
            img,
            i64::from(i),
            y(p) as i64,
            i64::from(i) + 1,
            y(p) as i64 + 2,
            BLACK,
        );
    }
    let flag = (0.5 - lo) * sx;
    line(img, (flag, y(0.5)), (flag, y(0.5) - 30.0), 2.0, BLACK);
    rect(
        img,
        flag as i64,
        y(0.5) as i64 - 30,
        flag as i64 + 12,
        y(0.5) as i64 - 22,
        YELLOW,
    );
    let p = f64::from(v[0]);
    disc(img, (p - lo) * sx, y(p) - 8.0, 8.0, RED);
}

/// The lake's tiles and the agent.
fn frozen_lake(img: &mut RgbaImage, id: &str, s: &usize) {
    let map: &[&str] = if id == "FrozenLake-v1" {
        &crate::envs::frozen_lake::MAP_4X4
    } else {
        &crate::envs::frozen_lake::MAP_8X8
    };
    let n = map.len() as i64;
    let cell = i64::from(H) / n;
    let left = (i64::from(W) - cell * n) / 2;
    for (r, row) in map.iter().enumerate() {
        for (c, ch) in row.bytes().enumerate() {
            let (x, y) = (left + c as i64 * cell, r as i64 * cell);
            let colour = match ch {
                b'H' => BLUE,
                b'G' => GREEN,
                _ => ICE,
            };
            rect(img, x + 1, y + 1, x + cell - 1, y + cell - 1, colour);
        }
    }
    let (r, c) = ((*s as i64) / n, (*s as i64) % n);
    let half = cell as f64 / 2.0;
    disc(
        img,
        (left + c * cell) as f64 + half,
        (r * cell) as f64 + half,
        half * 0.6,
        RED,
    );
}

/// Taxi's grid, walls, destination, taxi and passenger.
fn taxi(img: &mut RgbaImage, s: &usize) {
    let (row, col, pass, dest) = crate::envs::taxi::decode(*s);
    let cell = 36i64;
    let (left, top) = ((i64::from(W) - 5 * cell) / 2, (i64::from(H) - 5 * cell) / 2);
    let spots = [(0usize, 0usize), (0, 4), (4, 0), (4, 3)];
    for r in 0..5 {
        for c in 0..5 {
            let (x, y) = (left + c * cell, top + r * cell);
            let colour = if spots.contains(&(r as usize, c as usize)) {
                ICE
            } else {
                Rgba([235, 235, 235, 255])
            };
            rect(img, x + 1, y + 1, x + cell - 1, y + cell - 1, colour);
        }
    }
    // Walls between cells, from the map's '|' characters.
    for (r, line_text) in crate::envs::taxi::MAP[1..6].iter().enumerate() {
        for (k, ch) in line_text.bytes().enumerate() {
            if ch == b'|' && k > 0 && k < 10 {
                let x = left + (k as i64 / 2) * cell;
                rect(
                    img,
                    x - 2,
                    top + r as i64 * cell,
                    x + 2,
                    top + (r as i64 + 1) * cell,
                    BLACK,
                );
            }
        }
    }
    let centre = |(r, c): (usize, usize)| {
        (
            (left + c as i64 * cell) as f64 + 18.0,
            (top + r as i64 * cell) as f64 + 18.0,
        )
    };
    let d = centre(spots[dest]);
    rect(
        img,
        d.0 as i64 - 14,
        d.1 as i64 - 14,
        d.0 as i64 + 14,
        d.1 as i64 + 14,
        GREEN,
    );
    let t = centre((row, col));
    rect(
        img,
        t.0 as i64 - 11,
        t.1 as i64 - 8,
        t.0 as i64 + 11,
        t.1 as i64 + 8,
        if pass == 4 { RED } else { YELLOW },
    );
    if pass < 4 {
        let p = centre(spots[pass]);
        disc(img, p.0, p.1, 6.0, BLUE);
    }
}

/// One frame of environment `id` in the state `obs` shows; `None` for an environment this
/// module cannot draw.
pub fn frame(id: &str, obs: &Obs) -> Option<RgbaImage> {
    let mut img = RgbaImage::from_pixel(W, H, WHITE);
    match (id, obs) {
        ("CartPole-v1", Obs::Values(v)) => cartpole(&mut img, v),
        ("Acrobot-v1", Obs::Values(v)) => acrobot(&mut img, v),
        ("MountainCar-v0", Obs::Values(v)) => mountain_car(&mut img, v),
        ("FrozenLake-v1" | "FrozenLake8x8-v1", Obs::Index(s)) => frozen_lake(&mut img, id, s),
        ("Taxi-v4", Obs::Index(s)) => taxi(&mut img, s),
        _ => return None,
    }
    Some(img)
}

/// The observations of an episode as an animated GIF at `path` (`delay_ms` a frame; long
/// episodes keep every k-th frame so the file stays under `max_frames` frames), written
/// atomically. `Ok(false)` when the environment has no drawing.
pub fn write_gif(
    path: &Path,
    id: &str,
    observations: &[Obs],
    delay_ms: u32,
    max_frames: usize,
) -> Result<bool, String> {
    use image::codecs::gif::{GifEncoder, Repeat};
    use image::{Delay, Frame};
    let stride = observations.len().div_ceil(max_frames.max(1)).max(1);
    let mut frames = Vec::new();
    for o in observations.iter().step_by(stride) {
        let Some(img) = frame(id, o) else {
            return Ok(false);
        };
        frames.push(Frame::from_parts(
            img,
            0,
            0,
            Delay::from_numer_denom_ms(delay_ms * stride as u32, 1),
        ));
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let tmp = path.with_extension("gif.tmp");
    {
        let file = std::fs::File::create(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
        let mut enc = GifEncoder::new_with_speed(std::io::BufWriter::new(file), 10);
        enc.set_repeat(Repeat::Infinite).map_err(|e| e.to_string())?;
        enc.encode_frames(frames)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every built-in environment is drawn, from its first observation on; a GIF of a few
    /// frames decodes back to that many frames.
    #[test]
    fn every_environment_is_drawn() {
        for id in crate::ENV_IDS {
            let mut env = crate::make(id).unwrap();
            let (obs, _) = env.reset(Some(0));
            let mut frames = vec![obs];
            for a in [0, 1, 0] {
                frames.push(env.step(a).obs);
            }
            let first = frame(id, &frames[0]).unwrap_or_else(|| panic!("{id} is not drawn"));
            assert!(first.pixels().any(|p| *p != WHITE), "{id}: a blank frame");
            let dir = std::env::temp_dir().join(format!("trident-render-{}-{id}", std::process::id()));
            let path = dir.join("episode.gif");
            assert!(write_gif(&path, id, &frames, 40, 300).unwrap());
            let decoder = image::codecs::gif::GifDecoder::new(std::fs::File::open(&path).unwrap()).unwrap();
            use image::AnimationDecoder;
            assert_eq!(decoder.into_frames().count(), 4, "{id}");
            std::fs::remove_dir_all(dir).unwrap();
        }
    }
}
