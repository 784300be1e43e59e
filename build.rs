//! Checks the checked-in OpenAPI v2 protobuf messages (`src/api/generated/`,
//! gnostic's `openapi.v2`, served at `/openapi/v2` for protobuf clients such
//! as kubectl) against a fresh generation from the vendored
//! `proto/openapiv2/OpenAPIv2.proto` with a pure-Rust protobuf compiler
//! (protox; no `protoc`) and prost-build. Only with the `tikv` feature
//! (every test build), whose test double compiles both crates anyway; the
//! default build compiles neither. `KSHARD_REGENERATE_PROTO=1` writes the
//! generated files instead of failing on a difference.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    #[cfg(feature = "tikv")]
    generated::check()?;
    Ok(())
}

#[cfg(feature = "tikv")]
mod generated {
    use std::path::PathBuf;

    const PROTO: &str = "proto/openapiv2/OpenAPIv2.proto";
    const DIR: &str = "src/api/generated";
    const FILES: [&str; 2] = ["google.protobuf.rs", "openapi.v2.rs"];
    const HEADER: &str =
        "// Generated from proto/openapiv2/OpenAPIv2.proto by build.rs (protox and\n\
        // prost-build); do not edit. Regenerate with\n\
        // `KSHARD_REGENERATE_PROTO=1 cargo build --features tikv`.\n\n";

    pub fn check() -> Result<(), Box<dyn std::error::Error>> {
        println!("cargo:rerun-if-changed={PROTO}");
        println!("cargo:rerun-if-env-changed=KSHARD_REGENERATE_PROTO");
        for f in FILES {
            println!("cargo:rerun-if-changed={DIR}/{f}");
        }
        let out = PathBuf::from(std::env::var("OUT_DIR")?).join("openapiv2");
        std::fs::create_dir_all(&out)?;
        let files = protox::compile([PROTO], ["proto"])?;
        prost_build::Config::new()
            // google.protobuf.Any as a message of its own (kshard has no
            // prost-types); gnostic's parser never sets it.
            .compile_well_known_types()
            .out_dir(&out)
            .compile_fds(files)?;
        let write = std::env::var_os("KSHARD_REGENERATE_PROTO").is_some();
        for f in FILES {
            let fresh = format!("{HEADER}{}", std::fs::read_to_string(out.join(f))?);
            let path = PathBuf::from(DIR).join(f);
            if write {
                std::fs::write(&path, fresh)?;
            } else if std::fs::read_to_string(&path).ok().as_deref() != Some(fresh.as_str()) {
                return Err(format!(
                    "{} is not what {PROTO} generates now; regenerate it with \
                     KSHARD_REGENERATE_PROTO=1 cargo build --features tikv",
                    path.display()
                )
                .into());
            }
        }
        Ok(())
    }
}
