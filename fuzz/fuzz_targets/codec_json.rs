//! The HTTP inference codec on a whole-JSON body: decoding never panics, and what
//! decodes re-encodes and decodes to the same tensors.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    trident_fuzz::codec(data, None);
});
