//! Binary wire encodings kube-apiserver offers besides JSON and YAML.
//!
//! Both modules are pure byte-level codecs with no knowledge of HTTP or
//! storage: the response layer picks one after content negotiation and hands
//! it the JSON form kshard already builds.
//!
//! - [`protobuf`]: the `k8s\x00` envelope around `runtime.Unknown`, the
//!   meta.k8s.io/v1 messages kube can serve for custom resources
//!   (`PartialObjectMetadata[List]`, `Status`, `WatchEvent`) and the
//!   length-delimited watch stream framing.
//! - [`cbor`]: `application/cbor` bodies (RFC 8949, self-described) and
//!   `application/cbor-seq` watch streams (RFC 8742), with kube's encoder and
//!   decoder rules.
//!
//! What kube serves in which encoding for custom resources (kube-apiserver's
//! `apiextensions-apiserver` handler and `RequestScope::AllowsMediaTypeTransform`):
//! the resource itself in JSON, YAML and CBOR only; `PartialObjectMetadata`
//! and `PartialObjectMetadataList` in every encoding including protobuf; `Table`
//! in JSON and YAML only (it has no protobuf message, and CBOR is refused).

pub mod cbor;
pub mod protobuf;
pub mod typed_order;
