//! Kubernetes protobuf encoding (`application/vnd.kubernetes.protobuf`).
//!
//! Every body is the 4-byte magic `k8s\x00` followed by a `runtime.Unknown`
//! message whose `raw` field holds the encoded object. Watch streams
//! (`;stream=watch`) are a sequence of `metav1.WatchEvent` messages, each
//! prefixed with its length as a 4-byte big-endian integer and *without* the
//! magic; the event's `object.raw` is the full envelope of the object.
//!
//! The messages below are hand-written mirrors of
//! `k8s.io/apimachinery/pkg/runtime/generated.proto` and
//! `k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto`, limited to what
//! kube serves for custom resources. Field numbers are kube's. Fields that
//! are plain (non-pointer) values in Go are `Some(..)` even when empty,
//! because kube's generated marshallers always write them; this keeps our
//! output byte-identical to kube-apiserver's.
//!
//! `metav1.Table` is deliberately absent: it is `+protobuf=false` in kube, has
//! no message in `generated.proto`, and kube-apiserver only serves
//! `as=Table` as JSON or YAML, so a protobuf Table request must be answered
//! with 406 Not Acceptable.

use chrono::DateTime;
use prost::Message;
use serde_json::{Map, Value};

/// Media type of protobuf bodies.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";
/// Media type of protobuf watch streams.
pub const WATCH_MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf;stream=watch";
/// Magic number that starts every protobuf body.
pub const MAGIC: [u8; 4] = *b"k8s\x00";

#[derive(Debug, thiserror::Error)]
pub enum ProtobufError {
    #[error("empty data")]
    EmptyData,
    #[error("provided data does not appear to be a protobuf message, expected prefix {MAGIC:?}")]
    MissingMagic,
    #[error("empty body")]
    EmptyBody,
    #[error("invalid protobuf message: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("{field}: {reason}")]
    InvalidField { field: String, reason: String },
}

fn invalid(field: &str, reason: impl Into<String>) -> ProtobufError {
    ProtobufError::InvalidField {
        field: field.to_owned(),
        reason: reason.into(),
    }
}

// ---------------------------------------------------------------------------
// k8s.io.apimachinery.pkg.runtime
// ---------------------------------------------------------------------------

/// `runtime.TypeMeta`.
#[derive(Clone, PartialEq, Message)]
pub struct TypeMeta {
    #[prost(string, optional, tag = "1")]
    pub api_version: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub kind: Option<String>,
}

/// `runtime.Unknown`: the envelope message after the magic number.
#[derive(Clone, PartialEq, Message)]
pub struct Unknown {
    #[prost(message, optional, tag = "1")]
    pub type_meta: Option<TypeMeta>,
    #[prost(bytes = "vec", optional, tag = "2")]
    pub raw: Option<Vec<u8>>,
    #[prost(string, optional, tag = "3")]
    pub content_encoding: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub content_type: Option<String>,
}

/// `runtime.RawExtension`.
#[derive(Clone, PartialEq, Message)]
pub struct RawExtension {
    #[prost(bytes = "vec", optional, tag = "1")]
    pub raw: Option<Vec<u8>>,
}

// ---------------------------------------------------------------------------
// k8s.io.apimachinery.pkg.apis.meta.v1
// ---------------------------------------------------------------------------

/// `metav1.Time`. Kube writes whole seconds only (`nanos` is always 0) and
/// the zero time as an empty message.
#[derive(Clone, PartialEq, Message)]
pub struct Time {
    #[prost(int64, optional, tag = "1")]
    pub seconds: Option<i64>,
    #[prost(int32, optional, tag = "2")]
    pub nanos: Option<i32>,
}

/// One entry of a proto `map<string, string>`. The wire form of a map is a
/// repeated entry message; spelling it out lets us write empty values the way
/// kube does (prost's map support omits default keys and values).
#[derive(Clone, PartialEq, Message)]
pub struct StringMapEntry {
    #[prost(string, optional, tag = "1")]
    pub key: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub value: Option<String>,
}

/// `metav1.ShardInfo`.
#[derive(Clone, PartialEq, Message)]
pub struct ShardInfo {
    #[prost(string, optional, tag = "1")]
    pub selector: Option<String>,
}

/// `metav1.ListMeta`.
#[derive(Clone, PartialEq, Message)]
pub struct ListMeta {
    #[prost(string, optional, tag = "1")]
    pub self_link: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub resource_version: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub r#continue: Option<String>,
    #[prost(int64, optional, tag = "4")]
    pub remaining_item_count: Option<i64>,
    #[prost(message, optional, tag = "5")]
    pub shard_info: Option<ShardInfo>,
}

/// `metav1.OwnerReference`.
#[derive(Clone, PartialEq, Message)]
pub struct OwnerReference {
    #[prost(string, optional, tag = "1")]
    pub kind: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub uid: Option<String>,
    #[prost(string, optional, tag = "5")]
    pub api_version: Option<String>,
    #[prost(bool, optional, tag = "6")]
    pub controller: Option<bool>,
    #[prost(bool, optional, tag = "7")]
    pub block_owner_deletion: Option<bool>,
}

/// `metav1.FieldsV1`: `raw` is the JSON serialization of the field set.
#[derive(Clone, PartialEq, Message)]
pub struct FieldsV1 {
    #[prost(bytes = "vec", optional, tag = "1")]
    pub raw: Option<Vec<u8>>,
}

/// `metav1.ManagedFieldsEntry`.
#[derive(Clone, PartialEq, Message)]
pub struct ManagedFieldsEntry {
    #[prost(string, optional, tag = "1")]
    pub manager: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub operation: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub api_version: Option<String>,
    #[prost(message, optional, tag = "4")]
    pub time: Option<Time>,
    #[prost(string, optional, tag = "6")]
    pub fields_type: Option<String>,
    #[prost(message, optional, tag = "7")]
    pub fields_v1: Option<FieldsV1>,
    #[prost(string, optional, tag = "8")]
    pub subresource: Option<String>,
}

/// `metav1.ObjectMeta`.
#[derive(Clone, PartialEq, Message)]
pub struct ObjectMeta {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub generate_name: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub namespace: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub self_link: Option<String>,
    #[prost(string, optional, tag = "5")]
    pub uid: Option<String>,
    #[prost(string, optional, tag = "6")]
    pub resource_version: Option<String>,
    #[prost(int64, optional, tag = "7")]
    pub generation: Option<i64>,
    #[prost(message, optional, tag = "8")]
    pub creation_timestamp: Option<Time>,
    #[prost(message, optional, tag = "9")]
    pub deletion_timestamp: Option<Time>,
    #[prost(int64, optional, tag = "10")]
    pub deletion_grace_period_seconds: Option<i64>,
    /// `map<string, string> labels = 11`, sorted by key as kube writes it.
    #[prost(message, repeated, tag = "11")]
    pub labels: Vec<StringMapEntry>,
    /// `map<string, string> annotations = 12`, sorted by key.
    #[prost(message, repeated, tag = "12")]
    pub annotations: Vec<StringMapEntry>,
    #[prost(message, repeated, tag = "13")]
    pub owner_references: Vec<OwnerReference>,
    #[prost(string, repeated, tag = "14")]
    pub finalizers: Vec<String>,
    #[prost(message, repeated, tag = "17")]
    pub managed_fields: Vec<ManagedFieldsEntry>,
}

/// `metav1.PartialObjectMetadata`.
#[derive(Clone, PartialEq, Message)]
pub struct PartialObjectMetadata {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
}

/// `metav1.PartialObjectMetadataList`.
#[derive(Clone, PartialEq, Message)]
pub struct PartialObjectMetadataList {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ListMeta>,
    #[prost(message, repeated, tag = "2")]
    pub items: Vec<PartialObjectMetadata>,
}

/// `metav1.StatusCause` (field 1 is `reason` in JSON and proto).
#[derive(Clone, PartialEq, Message)]
pub struct StatusCause {
    #[prost(string, optional, tag = "1")]
    pub reason: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub message: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub field: Option<String>,
}

/// `metav1.StatusDetails`.
#[derive(Clone, PartialEq, Message)]
pub struct StatusDetails {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub group: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub kind: Option<String>,
    #[prost(message, repeated, tag = "4")]
    pub causes: Vec<StatusCause>,
    #[prost(int32, optional, tag = "5")]
    pub retry_after_seconds: Option<i32>,
    #[prost(string, optional, tag = "6")]
    pub uid: Option<String>,
}

/// `metav1.Status`.
#[derive(Clone, PartialEq, Message)]
pub struct Status {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ListMeta>,
    #[prost(string, optional, tag = "2")]
    pub status: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub message: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub reason: Option<String>,
    #[prost(message, optional, tag = "5")]
    pub details: Option<StatusDetails>,
    #[prost(int32, optional, tag = "6")]
    pub code: Option<i32>,
}

/// `metav1.WatchEvent`.
#[derive(Clone, PartialEq, Message)]
pub struct WatchEvent {
    #[prost(string, optional, tag = "1")]
    pub r#type: Option<String>,
    #[prost(message, optional, tag = "2")]
    pub object: Option<RawExtension>,
}

// ---------------------------------------------------------------------------
// Envelope and framing
// ---------------------------------------------------------------------------

/// Wraps an encoded message the way kube's protobuf serializer does:
/// magic, then `Unknown{typeMeta, raw, contentEncoding: "", contentType: ""}`.
pub fn encode_envelope(api_version: &str, kind: &str, message_bytes: &[u8]) -> Vec<u8> {
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.to_owned()),
            kind: Some(kind.to_owned()),
        }),
        raw: Some(message_bytes.to_vec()),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    let mut out = Vec::with_capacity(MAGIC.len() + unknown.encoded_len());
    out.extend_from_slice(&MAGIC);
    unknown.encode_raw(&mut out);
    out
}

/// Encodes `message` and wraps it in the envelope.
pub fn encode_object<M: Message>(api_version: &str, kind: &str, message: &M) -> Vec<u8> {
    encode_envelope(api_version, kind, &message.encode_to_vec())
}

/// Checks the magic and unwraps the envelope, returning the type and the raw
/// bytes of the inner message. Errors mirror kube's serializer.
pub fn decode_envelope(bytes: &[u8]) -> Result<(TypeMeta, Vec<u8>), ProtobufError> {
    if bytes.is_empty() {
        return Err(ProtobufError::EmptyData);
    }
    let body = bytes
        .strip_prefix(&MAGIC[..])
        .ok_or(ProtobufError::MissingMagic)?;
    if body.is_empty() {
        return Err(ProtobufError::EmptyBody);
    }
    let unknown = Unknown::decode(body)?;
    Ok((
        unknown.type_meta.unwrap_or_default(),
        unknown.raw.unwrap_or_default(),
    ))
}

/// One frame of a protobuf watch stream: the 4-byte big-endian length, then
/// `WatchEvent{type, object: RawExtension{raw: inner_envelope}}` (no magic).
/// `inner_envelope` is the object as [`encode_envelope`] writes it.
pub fn watch_event_frame(event_type: &str, inner_envelope: &[u8]) -> Vec<u8> {
    let event = WatchEvent {
        r#type: Some(event_type.to_owned()),
        object: Some(RawExtension {
            raw: Some(inner_envelope.to_vec()),
        }),
    };
    let len = event.encoded_len();
    let mut out = Vec::with_capacity(4 + len);
    // kube's framer writes the length as a uint32; a frame over 4 GiB cannot
    // be produced because request and object size limits are far below it.
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    event.encode_raw(&mut out);
    out
}

// ---------------------------------------------------------------------------
// JSON -> proto conversion
// ---------------------------------------------------------------------------

/// Reads the members of one JSON object, treating a missing member and
/// `null` alike (as Go's JSON decoding into plain fields does).
struct Fields<'a> {
    path: &'a str,
    map: Option<&'a Map<String, Value>>,
}

impl<'a> Fields<'a> {
    fn new(path: &'a str, v: &'a Value) -> Result<Self, ProtobufError> {
        match v {
            Value::Null => Ok(Fields { path, map: None }),
            Value::Object(map) => Ok(Fields {
                path,
                map: Some(map),
            }),
            _ => Err(invalid(path, "expected an object")),
        }
    }

    fn path(&self, key: &str) -> String {
        format!("{}.{key}", self.path)
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.and_then(|m| m.get(key)).filter(|v| !v.is_null())
    }

    fn opt_str(&self, key: &str) -> Result<Option<String>, ProtobufError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(invalid(&self.path(key), "expected a string")),
        }
    }

    /// A Go `string` field: always written, empty when absent.
    fn str(&self, key: &str) -> Result<Option<String>, ProtobufError> {
        Ok(Some(self.opt_str(key)?.unwrap_or_default()))
    }

    fn opt_i64(&self, key: &str) -> Result<Option<i64>, ProtobufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| invalid(&self.path(key), "expected a 64-bit integer")),
        }
    }

    fn opt_i32(&self, key: &str) -> Result<Option<i32>, ProtobufError> {
        match self.opt_i64(key)? {
            None => Ok(None),
            Some(n) => i32::try_from(n)
                .map(Some)
                .map_err(|_| invalid(&self.path(key), "expected a 32-bit integer")),
        }
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>, ProtobufError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(invalid(&self.path(key), "expected a boolean")),
        }
    }

    fn opt_time(&self, key: &str) -> Result<Option<Time>, ProtobufError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => time_from_rfc3339(s)
                .map(Some)
                .map_err(|reason| invalid(&self.path(key), reason)),
            Some(_) => Err(invalid(&self.path(key), "expected an RFC 3339 timestamp")),
        }
    }

    fn array(&self, key: &str) -> Result<&'a [Value], ProtobufError> {
        match self.get(key) {
            None => Ok(&[]),
            Some(Value::Array(items)) => Ok(items),
            Some(_) => Err(invalid(&self.path(key), "expected an array")),
        }
    }

    fn string_map(&self, key: &str) -> Result<Vec<StringMapEntry>, ProtobufError> {
        let map = match self.get(key) {
            None => return Ok(Vec::new()),
            Some(Value::Object(map)) => map,
            Some(_) => return Err(invalid(&self.path(key), "expected an object")),
        };
        let mut entries = map
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok(StringMapEntry {
                    key: Some(k.clone()),
                    value: Some(s.clone()),
                }),
                _ => Err(invalid(
                    &format!("{}.{k}", self.path(key)),
                    "expected a string",
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Go's generated marshaller sorts map keys (byte order, like str's Ord).
        entries.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(entries)
    }
}

/// Parses an RFC 3339 timestamp into kube's proto `Time`: whole seconds
/// since the epoch, nanos always 0 (metav1.Time's proto form drops them).
fn time_from_rfc3339(s: &str) -> Result<Time, String> {
    let t = DateTime::parse_from_rfc3339(s).map_err(|e| format!("invalid timestamp {s:?}: {e}"))?;
    Ok(Time {
        seconds: Some(t.timestamp()),
        nanos: Some(0),
    })
}

/// Converts the JSON `metadata` of an object to `ObjectMeta`.
pub fn object_meta_from_json(v: &Value) -> Result<ObjectMeta, ProtobufError> {
    let f = Fields::new("metadata", v)?;
    let owner_references = f
        .array("ownerReferences")?
        .iter()
        .map(|o| {
            let o = Fields::new("metadata.ownerReferences[]", o)?;
            Ok(OwnerReference {
                kind: o.str("kind")?,
                name: o.str("name")?,
                uid: o.str("uid")?,
                api_version: o.str("apiVersion")?,
                controller: o.opt_bool("controller")?,
                block_owner_deletion: o.opt_bool("blockOwnerDeletion")?,
            })
        })
        .collect::<Result<Vec<_>, ProtobufError>>()?;
    let finalizers = f
        .array("finalizers")?
        .iter()
        .map(|s| {
            s.as_str()
                .map(str::to_owned)
                .ok_or_else(|| invalid("metadata.finalizers[]", "expected a string"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let managed_fields = f
        .array("managedFields")?
        .iter()
        .map(managed_fields_entry_from_json)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ObjectMeta {
        name: f.str("name")?,
        generate_name: f.str("generateName")?,
        namespace: f.str("namespace")?,
        self_link: f.str("selfLink")?,
        uid: f.str("uid")?,
        resource_version: f.str("resourceVersion")?,
        generation: Some(f.opt_i64("generation")?.unwrap_or(0)),
        // A plain Time in Go: always written, as an empty message when zero.
        creation_timestamp: Some(f.opt_time("creationTimestamp")?.unwrap_or_default()),
        deletion_timestamp: f.opt_time("deletionTimestamp")?,
        deletion_grace_period_seconds: f.opt_i64("deletionGracePeriodSeconds")?,
        labels: f.string_map("labels")?,
        annotations: f.string_map("annotations")?,
        owner_references,
        finalizers,
        managed_fields,
    })
}

fn managed_fields_entry_from_json(v: &Value) -> Result<ManagedFieldsEntry, ProtobufError> {
    let f = Fields::new("metadata.managedFields[]", v)?;
    let fields_v1 = match f.get("fieldsV1") {
        None => None,
        Some(fields) => Some(FieldsV1 {
            raw: Some(
                serde_json::to_vec(fields)
                    .map_err(|e| invalid("metadata.managedFields[].fieldsV1", e.to_string()))?,
            ),
        }),
    };
    Ok(ManagedFieldsEntry {
        manager: f.str("manager")?,
        operation: f.str("operation")?,
        api_version: f.str("apiVersion")?,
        time: f.opt_time("time")?,
        fields_type: f.str("fieldsType")?,
        fields_v1,
        subresource: f.str("subresource")?,
    })
}

fn list_meta_from_json(v: &Value) -> Result<ListMeta, ProtobufError> {
    let f = Fields::new("metadata", v)?;
    let shard_info = match f.get("shardInfo") {
        None => None,
        Some(s) => Some(ShardInfo {
            selector: Fields::new("metadata.shardInfo", s)?.str("selector")?,
        }),
    };
    Ok(ListMeta {
        self_link: f.str("selfLink")?,
        resource_version: f.str("resourceVersion")?,
        r#continue: f.str("continue")?,
        remaining_item_count: f.opt_i64("remainingItemCount")?,
        shard_info,
    })
}

/// Converts a JSON `Status` object.
pub fn status_from_json(v: &Value) -> Result<Status, ProtobufError> {
    let f = Fields::new("status", v)?;
    let details = match f.get("details") {
        None => None,
        Some(d) => {
            let d = Fields::new("details", d)?;
            let causes = d
                .array("causes")?
                .iter()
                .map(|c| {
                    let c = Fields::new("details.causes[]", c)?;
                    Ok(StatusCause {
                        reason: c.str("reason")?,
                        message: c.str("message")?,
                        field: c.str("field")?,
                    })
                })
                .collect::<Result<Vec<_>, ProtobufError>>()?;
            Some(StatusDetails {
                name: d.str("name")?,
                group: d.str("group")?,
                kind: d.str("kind")?,
                causes,
                retry_after_seconds: Some(d.opt_i32("retryAfterSeconds")?.unwrap_or(0)),
                uid: d.str("uid")?,
            })
        }
    };
    Ok(Status {
        metadata: Some(list_meta_from_json(
            f.get("metadata").unwrap_or(&Value::Null),
        )?),
        status: f.str("status")?,
        message: f.str("message")?,
        reason: f.str("reason")?,
        details,
        code: Some(f.opt_i32("code")?.unwrap_or(0)),
    })
}

/// Builds `PartialObjectMetadata` from any JSON object with a `metadata`
/// member (a full custom resource or an existing PartialObjectMetadata).
pub fn partial_object_metadata_from_json(
    v: &Value,
) -> Result<PartialObjectMetadata, ProtobufError> {
    let f = Fields::new("object", v)?;
    Ok(PartialObjectMetadata {
        metadata: Some(object_meta_from_json(
            f.get("metadata").unwrap_or(&Value::Null),
        )?),
    })
}

/// Builds `PartialObjectMetadataList` from a JSON list (`metadata` + `items`,
/// the items being full objects or PartialObjectMetadata).
pub fn partial_object_metadata_list_from_json(
    v: &Value,
) -> Result<PartialObjectMetadataList, ProtobufError> {
    let f = Fields::new("list", v)?;
    Ok(PartialObjectMetadataList {
        metadata: Some(list_meta_from_json(
            f.get("metadata").unwrap_or(&Value::Null),
        )?),
        items: f
            .array("items")?
            .iter()
            .map(partial_object_metadata_from_json)
            .collect::<Result<Vec<_>, _>>()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    // Wire bytes from kube's pkg/test/runtime_serializer_protobuf_protobuf_test.go.
    #[test]
    fn envelope_matches_kube_empty_object() {
        let got = encode_envelope("", "", &[]);
        let want = [
            0x6b, 0x38, 0x73, 0x00, 0x0a, 0x04, 0x0a, 0x00, 0x12, 0x00, 0x12, 0x00, 0x1a, 0x00,
            0x22, 0x00,
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn envelope_matches_kube_typed_object() {
        let got = encode_envelope("other/version", "test", &[1, 2, 3]);
        let mut want = vec![0x6b, 0x38, 0x73, 0x00, 0x0a, 0x15, 0x0a, 0x0d];
        want.extend_from_slice(b"other/version");
        want.extend_from_slice(&[0x12, 0x04]);
        want.extend_from_slice(b"test");
        want.extend_from_slice(&[0x12, 0x03, 1, 2, 3, 0x1a, 0x00, 0x22, 0x00]);
        assert_eq!(got, want);
    }

    #[test]
    fn decode_envelope_round_trip_and_errors() {
        let bytes = encode_envelope("meta.k8s.io/v1", "PartialObjectMetadata", b"xyz");
        let (tm, raw) = decode_envelope(&bytes).unwrap();
        assert_eq!(tm.api_version.as_deref(), Some("meta.k8s.io/v1"));
        assert_eq!(tm.kind.as_deref(), Some("PartialObjectMetadata"));
        assert_eq!(raw, b"xyz");

        assert!(matches!(
            decode_envelope(&[]),
            Err(ProtobufError::EmptyData)
        ));
        assert!(matches!(
            decode_envelope(&[0x6b]),
            Err(ProtobufError::MissingMagic)
        ));
        assert!(matches!(
            decode_envelope(&[0x6b, 0x38, 0x73, 0x01, 0x0a, 0x00]),
            Err(ProtobufError::MissingMagic)
        ));
        assert!(matches!(
            decode_envelope(&MAGIC),
            Err(ProtobufError::EmptyBody)
        ));
        assert!(matches!(
            decode_envelope(&[0x6b, 0x38, 0x73, 0x00, 0x0a, 0x05, 0x01]),
            Err(ProtobufError::Decode(_))
        ));
    }

    // Kube's test wire2 carries raw bytes that themselves start with the magic.
    #[test]
    fn decode_envelope_kube_vector() {
        let mut wire = vec![0x6b, 0x38, 0x73, 0x00, 0x0a, 0x15, 0x0a, 0x0d];
        wire.extend_from_slice(b"other/version");
        wire.extend_from_slice(&[0x12, 0x04]);
        wire.extend_from_slice(b"test");
        wire.extend_from_slice(&[
            0x12, 0x07, 0x6b, 0x38, 0x73, 0x00, 1, 2, 3, 0x1a, 0x00, 0x22, 0x00,
        ]);
        let (tm, raw) = decode_envelope(&wire).unwrap();
        assert_eq!(tm.kind.as_deref(), Some("test"));
        assert_eq!(raw, [0x6b, 0x38, 0x73, 0x00, 1, 2, 3]);
    }

    #[test]
    fn empty_object_meta_matches_gogo_layout() {
        // Every plain Go field is written even when empty; creationTimestamp
        // is a zero-length message; pointers and empty collections are absent.
        let meta = object_meta_from_json(&json!({})).unwrap();
        assert_eq!(
            hex(&meta.encode_to_vec()),
            "0a0012001a0022002a00320038004200"
        );
    }

    #[test]
    fn object_meta_field_numbers_and_order() {
        let meta = object_meta_from_json(&json!({
            "name": "a",
            "namespace": "ns",
            "uid": "u",
            "resourceVersion": "7",
            "generation": 2,
            "creationTimestamp": "1970-01-01T00:01:40Z",
            "deletionTimestamp": "1970-01-01T00:00:01Z",
            "deletionGracePeriodSeconds": 30,
            "labels": {"z": "", "b": "v"},
            "finalizers": ["f"],
            "ownerReferences": [{"apiVersion": "v1", "kind": "K", "name": "o", "uid": "x", "controller": true}],
        }))
        .unwrap();
        let got = hex(&meta.encode_to_vec());
        let want = [
            "0a0161",           // 1 name "a"
            "1200",             // 2 generateName ""
            "1a026e73",         // 3 namespace "ns"
            "2200",             // 4 selfLink ""
            "2a0175",           // 5 uid "u"
            "320137",           // 6 resourceVersion "7"
            "3802",             // 7 generation 2
            "420408641000",     // 8 creationTimestamp {seconds 100, nanos 0}
            "4a0408011000",     // 9 deletionTimestamp {seconds 1, nanos 0}
            "501e",             // 10 deletionGracePeriodSeconds 30
            "5a060a0162120176", // 11 labels b=v (sorted first)
            "5a050a017a1200",   // 11 labels z="" (value still written)
            // 13 ownerReferences: kind(1) name(3) uid(4) apiVersion(5) controller(6)
            "6a0f0a014b1a016f2201782a0276313001",
            "720166", // 14 finalizers "f"
        ]
        .concat();
        assert_eq!(got, want);
    }

    #[test]
    fn managed_fields_carry_json_raw() {
        let meta = object_meta_from_json(&json!({
            "managedFields": [{
                "manager": "m", "operation": "Apply", "apiVersion": "g/v1",
                "time": "2024-01-02T03:04:05Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {}}}
            }]
        }))
        .unwrap();
        let entry = &meta.managed_fields[0];
        assert_eq!(
            entry.fields_v1.as_ref().and_then(|f| f.raw.as_deref()),
            Some(&br#"{"f:metadata":{"f:labels":{}}}"#[..])
        );
        assert_eq!(
            entry.time.as_ref().and_then(|t| t.seconds),
            Some(1_704_164_645)
        );
        assert_eq!(entry.subresource.as_deref(), Some(""));
        // Field 17 has a two-byte key: (17 << 3 | 2) = 0x8a 0x01.
        let bytes = meta.encode_to_vec();
        let pos = bytes.windows(2).position(|w| w == [0x8a, 0x01]);
        assert!(pos.is_some(), "{}", hex(&bytes));
        assert_eq!(ObjectMeta::decode(&bytes[..]).unwrap(), meta);
    }

    #[test]
    fn time_truncates_to_seconds_like_kube() {
        let t = time_from_rfc3339("2024-01-02T03:04:05.999+01:00").unwrap();
        assert_eq!(t.seconds, Some(1_704_161_045));
        assert_eq!(t.nanos, Some(0));
        assert!(time_from_rfc3339("yesterday").is_err());
    }

    #[test]
    fn status_round_trip() {
        let status = status_from_json(&json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": "foos.g \"x\" not found", "reason": "NotFound",
            "details": {"name": "x", "group": "g", "kind": "foos",
                        "causes": [{"reason": "FieldValueInvalid", "message": "bad", "field": "spec.a"}]},
            "code": 404
        }))
        .unwrap();
        let bytes = status.encode_to_vec();
        assert_eq!(Status::decode(&bytes[..]).unwrap(), status);
        assert_eq!(status.code, Some(404));
        let details = status.details.as_ref().unwrap();
        assert_eq!(details.retry_after_seconds, Some(0));
        assert_eq!(details.causes[0].field.as_deref(), Some("spec.a"));
        // metadata (empty ListMeta: three empty strings) comes first, code last.
        assert!(hex(&bytes).starts_with("0a060a0012001a00"));
        assert!(hex(&bytes).ends_with("309403"));
    }

    #[test]
    fn status_without_details_has_no_field_5() {
        let status = status_from_json(&json!({"status": "Success", "code": 200})).unwrap();
        assert_eq!(
            hex(&status.encode_to_vec()),
            "0a060a0012001a00120753756363657373 1a00 2200 30c801".replace(' ', "")
        );
    }

    #[test]
    fn partial_object_metadata_list_round_trip() {
        let list = partial_object_metadata_list_from_json(&json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
            "metadata": {"resourceVersion": "10", "continue": "c", "remainingItemCount": 3},
            "items": [
                {"apiVersion": "g/v1", "kind": "Foo", "metadata": {"name": "a", "annotations": {"k": "v"}}, "spec": {"x": 1}},
                {"metadata": {"name": "b"}}
            ]
        }))
        .unwrap();
        assert_eq!(list.items.len(), 2);
        assert_eq!(
            list.metadata.as_ref().unwrap().remaining_item_count,
            Some(3)
        );
        let bytes = list.encode_to_vec();
        assert_eq!(PartialObjectMetadataList::decode(&bytes[..]).unwrap(), list);

        let env = encode_object("meta.k8s.io/v1", "PartialObjectMetadataList", &list);
        let (tm, raw) = decode_envelope(&env).unwrap();
        assert_eq!(tm.kind.as_deref(), Some("PartialObjectMetadataList"));
        assert_eq!(raw, bytes);
    }

    #[test]
    fn partial_object_metadata_from_full_object() {
        let pom = partial_object_metadata_from_json(&json!({
            "apiVersion": "g/v1", "kind": "Foo",
            "metadata": {"name": "a", "creationTimestamp": null}, "spec": {}
        }))
        .unwrap();
        let meta = pom.metadata.as_ref().unwrap();
        assert_eq!(meta.name.as_deref(), Some("a"));
        assert_eq!(meta.creation_timestamp, Some(Time::default()));
        // PartialObjectMetadata{metadata = 1}
        assert_eq!(pom.encode_to_vec()[0], 0x0a);
    }

    #[test]
    fn converters_reject_wrong_types() {
        assert!(object_meta_from_json(&json!({"name": 1})).is_err());
        assert!(object_meta_from_json(&json!({"labels": {"a": 1}})).is_err());
        assert!(object_meta_from_json(&json!({"creationTimestamp": "now"})).is_err());
        assert!(status_from_json(&json!({"code": 1_u64 << 40})).is_err());
        assert!(object_meta_from_json(&json!([])).is_err());
    }

    #[test]
    fn watch_event_frame_is_length_prefixed_event() {
        let inner = encode_envelope("meta.k8s.io/v1", "PartialObjectMetadata", &[0x0a, 0x00]);
        let frame = watch_event_frame("ADDED", &inner);
        let len = u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize;
        assert_eq!(len, frame.len() - 4);
        // No magic on the event itself: it starts with field 1 (type).
        assert_eq!(&frame[4..11], b"\x0a\x05ADDED");
        let event = WatchEvent::decode(&frame[4..]).unwrap();
        assert_eq!(event.r#type.as_deref(), Some("ADDED"));
        assert_eq!(event.object.and_then(|o| o.raw), Some(inner));
    }

    /// Varint lengths: small, at byte boundaries, huge, and malformed (ten
    /// continuation bytes overflow a u64).
    const VARINTS: &[&[u8]] = &[
        &[0x00],
        &[0x01],
        &[0x05],
        &[0x7f],
        &[0x80, 0x01],
        &[0xff, 0xff, 0xff, 0xff, 0x0f],
        &[0x80, 0x80, 0x80, 0x80, 0x10],
        &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
        &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
        &[
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ],
        &[0xff],
    ];

    /// Field keys: Unknown's four fields, other wire types (varint, fixed,
    /// groups) and unknown field numbers.
    const KEYS: &[u8] = &[
        0x0a, 0x12, 0x1a, 0x22, 0x08, 0x09, 0x0d, 0x0b, 0x0c, 0x2a, 0x2b, 0x2c, 0x0f, 0x00, 0xfa,
    ];

    fn field() -> impl Strategy<Value = Vec<u8>> {
        (
            prop::sample::select(KEYS),
            prop::sample::select(VARINTS),
            prop::collection::vec(any::<u8>(), 0..12),
        )
            .prop_map(|(k, len, payload)| [&[k][..], len, &payload].concat())
    }

    fn envelope() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            1 => prop::collection::vec(any::<u8>(), 0..64),
            4 => prop::collection::vec(field(), 0..8)
                .prop_map(|fields| [&MAGIC[..], &fields.concat()].concat()),
            // TypeMeta (field 1) holding generated fields, its length honest or not.
            2 => (prop::collection::vec(field(), 0..4), prop::sample::select(VARINTS), any::<bool>())
                .prop_map(|(inner, claimed, honest)| {
                    let inner = inner.concat();
                    let len: Vec<u8> = if honest {
                        let mut b = Vec::new();
                        prost::encoding::encode_varint(inner.len() as u64, &mut b);
                        b
                    } else {
                        claimed.to_vec()
                    };
                    [&MAGIC[..], &[0x0a], &len, &inner].concat()
                }),
            1 => (prop::sample::select(&[0x2bu8, 0x0b, 0x0a][..]), 1..20_000usize)
                .prop_map(|(b, n)| [&MAGIC[..], &vec![b; n]].concat()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 5000, ..ProptestConfig::default() })]

        /// Any bytes unwrap to a type and raw bytes, or a `ProtobufError`.
        #[test]
        fn prop_decode_envelope_never_panics(bytes in envelope()) {
            if let Ok((tm, raw)) = decode_envelope(&bytes) {
                let again = encode_envelope(
                    tm.api_version.as_deref().unwrap_or(""),
                    tm.kind.as_deref().unwrap_or(""),
                    &raw,
                );
                let (tm2, raw2) = decode_envelope(&again).map_err(|e| TestCaseError::fail(e.to_string()))?;
                // Encoding writes empty strings where the input had none.
                let norm = |t: TypeMeta| (t.api_version.unwrap_or_default(), t.kind.unwrap_or_default());
                prop_assert_eq!((norm(tm2), raw2), (norm(tm), raw));
            }
        }

        /// The JSON-to-proto converters take any JSON: a message or an error.
        #[test]
        fn prop_json_to_proto_never_panics(v in crate::fuzz::json_value(), meta in crate::fuzz::json_value()) {
            let obj = json!({"metadata": meta});
            let _ = partial_object_metadata_from_json(&obj).map(|m| m.encode_to_vec());
            let _ = partial_object_metadata_from_json(&v);
            let _ = partial_object_metadata_list_from_json(&json!({"metadata": v, "items": [obj]}));
            let _ = status_from_json(&v).map(|m| m.encode_to_vec());
        }
    }

    /// Lengths that claim more than the body holds are a decode error.
    #[test]
    fn huge_length_prefixes_are_decode_errors() {
        for len in [
            &[0xff, 0xff, 0xff, 0xff, 0x0f][..],
            &[0xff; 9][..],
            &[0xff; 10][..],
        ] {
            for key in [0x0a, 0x12, 0x1a] {
                let bytes = [&MAGIC[..], &[key], len, b"abc"].concat();
                assert!(
                    matches!(decode_envelope(&bytes), Err(ProtobufError::Decode(_))),
                    "{bytes:x?}"
                );
            }
        }
        // 100,000 nested unknown groups stop at prost's recursion limit.
        let bytes = [&MAGIC[..], &[0x2b; 100_000][..]].concat();
        assert!(matches!(
            decode_envelope(&bytes),
            Err(ProtobufError::Decode(_))
        ));
    }
}
