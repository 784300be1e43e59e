//! Generates gnostic's OpenAPI v2 protobuf messages (`openapi.v2`, served at
//! `/openapi/v2` for protobuf clients such as kubectl) from the vendored
//! `proto/openapiv2/OpenAPIv2.proto`, with a pure-Rust protobuf compiler
//! (protox): no `protoc` needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTO: &str = "proto/openapiv2/OpenAPIv2.proto";
    println!("cargo:rerun-if-changed={PROTO}");
    let files = protox::compile([PROTO], ["proto"])?;
    prost_build::Config::new()
        // google.protobuf.Any as a message of its own (kshard has no
        // prost-types); gnostic's parser never sets it.
        .compile_well_known_types()
        .compile_fds(files)?;
    Ok(())
}
