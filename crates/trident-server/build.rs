//! Generates the `inference.GRPCInferenceService` server stub from Triton's
//! `grpc_service.proto` (vendored in trident-core, BSD-3-Clause). The messages are
//! trident-core's (`extern_path`), so HTTP, gRPC and the configuration share one set of
//! types. protox compiles the proto in Rust, so no `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "../trident-core/proto";
    println!("cargo:rerun-if-changed={proto}/grpc_service.proto");
    let fds = protox::compile(["grpc_service.proto"], [proto])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .extern_path(".inference", "::trident_core::config::pb")
        .compile_fds(fds)?;
    Ok(())
}
