//! Compiles `proto/hark/v1/*.proto` with protox (no `protoc` needed) and keeps the encoded file
//! descriptor set for gRPC server reflection.

use std::{env, fs, path::PathBuf};

use protox::prost::Message as _;

const PROTOS: &[&str] = &[
    "proto/hark/v1/types.proto",
    "proto/hark/v1/control.proto",
    "proto/hark/v1/service.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?);
    fs::write(
        out_dir.join("hark_descriptor.bin"),
        descriptors.encode_to_vec(),
    )?;
    // What reflection serves to anyone: the public API and what it imports, never the
    // worker ↔ task-control schema.
    let public = protox::compile(["proto/hark/v1/service.proto"], ["proto"])?;
    fs::write(
        out_dir.join("hark_public_descriptor.bin"),
        public.encode_to_vec(),
    )?;
    tonic_prost_build::configure()
        .codec_path("crate::codec::HarkCodec")
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
