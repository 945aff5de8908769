//! Compiles Triton's `model_config.proto` (vendored from triton-inference-server/common,
//! BSD-3-Clause, see `proto/LICENSE-triton`) into Rust types with prost, and saves the
//! file descriptor set so `config.pbtxt` can be parsed with prost-reflect's text-format
//! parser. protox is a pure-Rust protobuf compiler, so no `protoc` is needed.

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/model_config.proto");
    let fds = protox::compile(["model_config.proto"], ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("model_config.bin"), fds.encode_to_vec())?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
