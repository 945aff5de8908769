//! Compiles ONNX's `onnx.proto` (vendored from onnx/onnx 1.23, Apache-2.0, as the pip
//! package ships it) into Rust types with prost; protox compiles it, so no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/onnx.proto");
    let fds = protox::compile(["onnx.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
