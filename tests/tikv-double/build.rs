//! Generates the double's gRPC server code from the vendored kvproto files with
//! a pure-Rust protobuf compiler (no `protoc` needed). Only the methods the
//! double implements get server routes; every other method answers
//! `Unimplemented`, as a tonic server does for an unknown path.

#[cfg(feature = "server")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    use prost_build::{Service, ServiceGenerator};

    /// Forwards to tonic's generator with the service trimmed to the served methods.
    struct Trimmed(Box<dyn ServiceGenerator>);

    const SERVED: &[(&str, &[&str])] = &[
        (
            "Tikv",
            &[
                "KvGet",
                "KvScan",
                "KvPrewrite",
                "KvCommit",
                "KvBatchGet",
                "KvBatchRollback",
                "KvCleanup",
                "KvScanLock",
                "KvResolveLock",
                "KvTxnHeartBeat",
                "KvCheckTxnStatus",
                "KvCheckSecondaryLocks",
                "KvPessimisticRollback",
                "KvDeleteRange",
            ],
        ),
        (
            "PD",
            &[
                "GetMembers",
                "Tso",
                "GetRegion",
                "GetPrevRegion",
                "GetRegionByID",
                "ScanRegions",
                "GetStore",
                "GetAllStores",
                "GetGCSafePoint",
                "UpdateGCSafePoint",
            ],
        ),
    ];

    impl ServiceGenerator for Trimmed {
        fn generate(&mut self, mut service: Service, buf: &mut String) {
            let Some((_, methods)) = SERVED.iter().find(|(s, _)| *s == service.proto_name) else {
                return;
            };
            service
                .methods
                .retain(|m| methods.contains(&m.proto_name.as_str()));
            self.0.generate(service, buf);
        }
        fn finalize(&mut self, buf: &mut String) {
            self.0.finalize(buf);
        }
    }

    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["tikvpb.proto", "pdpb.proto"], ["proto", "proto/include"])?;
    let tonic = tonic_build::configure()
        .build_client(false)
        .build_server(true)
        .service_generator();
    prost_build::Config::new()
        .service_generator(Box::new(Trimmed(tonic)))
        .include_file("protos.rs")
        .compile_fds(fds)?;
    Ok(())
}

#[cfg(not(feature = "server"))]
fn main() {}
