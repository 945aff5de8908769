//! The `inference.GRPCInferenceService` client stub from Triton's `grpc_service.proto`
//! (vendored in trident-core), over trident-core's message types; protox compiles the
//! proto in Rust, so no `protoc` is needed. No tonic transport: requests travel on the
//! hyper client the HTTP load already uses (HTTP/2 there).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "../trident-core/proto";
    println!("cargo:rerun-if-changed={proto}/grpc_service.proto");
    let fds = protox::compile(["grpc_service.proto"], [proto])?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .build_transport(false)
        .extern_path(".inference", "::trident_core::config::pb")
        .compile_fds(fds)?;
    Ok(())
}
