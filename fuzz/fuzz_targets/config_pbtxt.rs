//! `config.pbtxt` parsing and validation: errors, never panics.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    trident_fuzz::config(data);
});
