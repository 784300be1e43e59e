//! placeholder
#[cfg(feature = "server")]
pub mod proto {
    #![allow(clippy::all, missing_docs, rustdoc::all)]
    include!(concat!(env!("OUT_DIR"), "/protos.rs"));
}
