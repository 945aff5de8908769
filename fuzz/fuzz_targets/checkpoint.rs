//! Checkpoint loading: `state.json` and `model.safetensors` contents, errors not panics.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    trident_fuzz::checkpoint(data);
});
