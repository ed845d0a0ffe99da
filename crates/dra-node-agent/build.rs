//! Generates the kubelet plugin gRPC code from the protos in `proto/`.
//!
//! protoc comes from the `protoc-bin-vendored` crate, so neither developers nor CI need a
//! system install.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    let protos = [
        "proto/pluginregistration.proto",
        "proto/dra_v1.proto",
        "proto/dra_v1beta1.proto",
        "proto/dra_health_v1.proto",
    ];
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_with_config(config, &protos, &["proto"])?;
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    Ok(())
}
