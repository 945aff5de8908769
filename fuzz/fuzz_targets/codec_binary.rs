//! The HTTP inference codec with binary tensor data: the first two bytes give the
//! Inference-Header-Content-Length, the rest is the body.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let [a, b, body @ ..] = data {
        trident_fuzz::codec(body, Some(u16::from_le_bytes([*a, *b]) as usize));
    }
});
