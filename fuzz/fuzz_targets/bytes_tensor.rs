//! The BYTES element decoder and tensor construction from untrusted bytes and shapes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    trident_fuzz::bytes_tensor(data);
});
