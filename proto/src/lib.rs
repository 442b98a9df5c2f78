//! hark's wire contracts, generated from `proto/hark/v1/*.proto` at build time.
//!
//! The `.proto` files are compiled with `protox`, so building needs no `protoc`. The encoded file
//! descriptor set is kept in [`FILE_DESCRIPTOR_SET`] for gRPC server reflection.

pub mod codec;

/// Package `hark.v1`: messages shared by every service, the worker control protocol, and the
/// `TaskService` API.
#[allow(missing_debug_implementations, unused_qualifications, clippy::all)]
pub mod v1 {
    tonic::include_proto!("hark.v1");
}

/// The encoded `FileDescriptorSet` of every hark `.proto` file.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("hark_descriptor");

/// The descriptors of the public API (`hark.v1.TaskService` and the types it uses) alone: what
/// gRPC reflection serves.
pub const PUBLIC_FILE_DESCRIPTOR_SET: &[u8] =
    tonic::include_file_descriptor_set!("hark_public_descriptor");

/// The version written into every bus message this build produces.
pub const WIRE_VERSION: u32 = 1;
