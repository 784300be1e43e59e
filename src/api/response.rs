//! Building responses: Status errors, objects and lists in the negotiated
//! form. Lists stream the cached object bytes instead of re-encoding them.

use crate::object::MetaField;
use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{header, HeaderValue, StatusCode};
use serde_json::{json, Value};

use super::encoding::{cbor, protobuf};
use super::negotiate::Output;
use crate::registry::table::{partial_metadata, table, Columns, IncludeObject};
use crate::registry::Item;
use crate::registry::Target;
use crate::status::ApiError;

pub const JSON: &str = "application/json";

/// The approximate size of a streamed body (its length is not known up front),
/// so compression can decide as kube does (gzip above 128 KiB).
#[derive(Debug, Clone, Copy)]
pub struct SizeEstimate(pub u64);

/// Marks responses that are never compressed (watch streams).
#[derive(Debug, Clone, Copy)]
pub struct NoCompression;

pub fn bytes_response(code: StatusCode, content_type: &str, body: impl Into<Body>) -> Response {
    let mut r = Response::new(body.into());
    *r.status_mut() = code;
    if let Ok(v) = HeaderValue::from_str(content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

/// kube's `Warning` header for a warning text: `299 - "<text>"` with `"` and
/// `\` backslashed and anything else, UTF-8 included, as is. `None` where
/// kube sends nothing (empty text, control characters).
pub fn warning_header(text: &str) -> Option<HeaderValue> {
    if text.is_empty() || text.chars().any(char::is_control) {
        return None;
    }
    let mut v = String::with_capacity(text.len() + 8);
    v.push_str("299 - \"");
    for c in text.chars() {
        if c == '"' || c == '\\' {
            v.push('\\');
        }
        v.push(c);
    }
    v.push('"');
    HeaderValue::from_bytes(v.as_bytes()).ok()
}

/// Adds a warning after those already there, unless it is one of them
/// (kube's recorder sends each text once).
pub fn warn(resp: &mut Response, text: &str) {
    let Some(value) = warning_header(text) else {
        return;
    };
    let headers = resp.headers_mut();
    if !headers.get_all(header::WARNING).iter().any(|v| *v == value) {
        headers.append(header::WARNING, value);
    }
}

/// Puts a warning before those already there (kube records a deprecated
/// version's warning before the handler adds its own), once.
pub fn warn_first(resp: &mut Response, text: &str) {
    let Some(value) = warning_header(text) else {
        return;
    };
    let headers = resp.headers_mut();
    let rest: Vec<HeaderValue> = headers
        .get_all(header::WARNING)
        .iter()
        .filter(|v| **v != value)
        .cloned()
        .collect();
    headers.insert(header::WARNING, value);
    for v in rest {
        headers.append(header::WARNING, v);
    }
}

/// A JSON document as kube writes it: its own kinds in their structs'
/// field order, anything else (custom resources) with keys sorted.
pub fn json_response(code: StatusCode, value: &Value) -> Response {
    bytes_response(
        code,
        JSON,
        json_document(super::encoding::typed_order::to_vec(value)),
    )
}

/// A JSON document's body as kube sends it: ended by a newline (Go's
/// `json.Encoder` writes one after every document).
pub fn json_document(bytes: impl Into<Vec<u8>>) -> Vec<u8> {
    let mut body = bytes.into();
    body.push(b'\n');
    body
}

/// Above this size a stored object's bytes are sent as they are, followed
/// by the newline in a second frame, instead of being copied to add it.
const COPY_FOR_NEWLINE: usize = 64 * 1024;

/// A stored object's JSON as an answer's body, ended by a newline.
/// Compact JSON as kube's `WriteRawJSON` writes it (`/version`, an answer
/// the client's Accept rules out): indented, no final newline.
pub fn raw_json_document(compact: Vec<u8>) -> Vec<u8> {
    super::indent_bytes(&compact).unwrap_or(compact)
}

pub fn object_body(json: &Bytes) -> Body {
    if json.len() <= COPY_FOR_NEWLINE {
        let mut body = Vec::with_capacity(json.len() + 1);
        body.extend_from_slice(json);
        body.push(b'\n');
        return Body::from(body);
    }
    Body::new(http_body_util::StreamBody::new(futures::stream::iter([
        Ok::<_, std::convert::Infallible>(http_body::Frame::data(json.clone())),
        Ok(http_body::Frame::data(Bytes::from_static(b"\n"))),
    ])))
}

pub fn error_response(e: &ApiError) -> Response {
    if e.is_page_not_found() {
        return page_not_found();
    }
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    // kube cannot negotiate a form for it either and falls back to `WriteRawJSON`.
    let body = if code == StatusCode::NOT_ACCEPTABLE {
        raw_json_document(e.status_json())
    } else {
        json_document(e.status_json())
    };
    let mut r = bytes_response(code, JSON, body);
    if let Some(n) = e.retry_after() {
        if let Ok(v) = HeaderValue::from_str(&n.to_string()) {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
    }
    r
}

/// Go's `http.NotFound`, which kube's mux answers for paths nothing serves.
pub fn page_not_found() -> Response {
    bytes_response(
        StatusCode::NOT_FOUND,
        "text/plain; charset=utf-8",
        bytes::Bytes::from_static(b"404 page not found\n"),
    )
}

impl axum::response::IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error_response(&self)
    }
}

pub fn cbor_response(code: StatusCode, value: &Value) -> Response {
    bytes_response(code, cbor::MEDIA_TYPE, cbor::to_cbor(value))
}

/// A Status error in the media type the client prefers (kube's
/// `ErrorNegotiated`): JSON, YAML, CBOR or protobuf.
pub fn error_for(accept: Option<&str>, e: &ApiError) -> Response {
    use super::negotiate::{error_media, ErrorMedia};
    if e.is_page_not_found() {
        return page_not_found();
    }
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = match error_media(accept) {
        ErrorMedia::Json => return error_response(e),
        ErrorMedia::Yaml => yaml_response(code, &e.to_json()),
        ErrorMedia::Cbor => cbor_response(code, &e.to_json()),
        ErrorMedia::Protobuf => match protobuf::status_from_json(&e.to_json()) {
            Ok(status) => bytes_response(
                code,
                protobuf::MEDIA_TYPE,
                protobuf::encode_object("v1", "Status", &status),
            ),
            Err(_) => return error_response(e),
        },
    };
    if let Some(n) = e.retry_after() {
        if let Ok(v) = HeaderValue::from_str(&n.to_string()) {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
    }
    r
}

fn proto_meta_response(code: StatusCode, v: &str, value: &Value, list: bool) -> Response {
    let encoded = if list {
        protobuf::partial_object_metadata_list_from_json(value)
            .map(|m| protobuf::encode_object(v, "PartialObjectMetadataList", &m))
    } else {
        protobuf::partial_object_metadata_from_json(value)
            .map(|m| protobuf::encode_object(v, "PartialObjectMetadata", &m))
    };
    match encoded {
        Ok(bytes) => bytes_response(code, protobuf::MEDIA_TYPE, bytes),
        Err(e) => error_response(&ApiError::internal(e)),
    }
}

pub fn yaml_response(code: StatusCode, value: &Value) -> Response {
    match serde_saphyr::to_string(value) {
        Ok(s) => bytes_response(code, "application/yaml", s),
        Err(e) => error_response(&ApiError::internal(e)),
    }
}

/// An object in the target's version (converted, and pruned by that
/// version's schema, when it is stored in another); one already in it
/// comes back as is, uncloned.
pub async fn in_version(t: &Target, item: Item) -> Result<Item, ApiError> {
    let api_version = t.api_version();
    if item.api_version() == api_version {
        return Ok(item);
    }
    let value = crate::registry::convert_value(&t.rt, item.value(), &api_version).await?;
    let json = serde_json::to_vec(&value).map_err(ApiError::internal)?;
    Ok(Item::new(value, Bytes::from(json)))
}

/// One object in the negotiated form.
pub async fn object(
    code: StatusCode,
    t: &Target,
    item: &Item,
    out: &Output,
    include: IncludeObject,
) -> Response {
    let item = match in_version(t, item.clone()).await {
        Ok(i) => i,
        Err(e) => return error_response(&e),
    };
    let item = &item;
    match out {
        Output::Json => bytes_response(code, JSON, object_body(item.json())),
        Output::Yaml => yaml_response(code, item.value()),
        Output::Cbor => cbor_response(code, item.value()),
        Output::ProtoMeta(v) => proto_meta_response(code, v, item.value(), false),
        Output::Table(v) => {
            let cols = Columns::for_target(t);
            let mut doc = table(
                Some(&cols),
                vec![cols.row(item.value(), include)],
                json!({
                    "resourceVersion": item.value().meta_field("resourceVersion").cloned().unwrap_or(Value::Null)
                }),
            );
            doc["apiVersion"] = json!(v);
            json_response(code, &doc)
        }
        Output::PartialMeta(v) => {
            let mut doc = partial_metadata(item.value());
            doc["apiVersion"] = json!(v);
            json_response(code, &doc)
        }
    }
}

pub struct ListMeta {
    pub resource_version: String,
    pub continue_token: Option<String>,
    pub remaining: Option<u64>,
}

impl ListMeta {
    pub fn to_json(&self) -> Value {
        let mut m = serde_json::Map::new();
        m.insert("resourceVersion".into(), json!(self.resource_version));
        if let Some(c) = &self.continue_token {
            m.insert("continue".into(), json!(c));
        }
        if let Some(n) = self.remaining {
            m.insert("remainingItemCount".into(), json!(n));
        }
        Value::Object(m)
    }

    /// The metadata of a custom resource list: kube builds it as an
    /// unstructured list, whose `continue` is always set (empty on the last
    /// page), unlike the typed lists of tables and metadata views.
    pub fn to_json_unstructured(&self) -> Value {
        let mut v = self.to_json();
        if let Some(m) = v.as_object_mut() {
            if !m.contains_key("continue") {
                m.insert("continue".into(), json!(""));
            }
        }
        v
    }
}

/// A list in the negotiated form; JSON lists stream the items' stored bytes.
pub async fn list(
    t: &Target,
    items: Vec<Item>,
    meta: ListMeta,
    out: &Output,
    include: IncludeObject,
) -> Response {
    let api_version = t.api_version();
    // Metadata-only views need no conversion (kube converts them without
    // the webhook too); everything else is shown in the target's version.
    let items = if matches!(out, Output::ProtoMeta(_) | Output::PartialMeta(_)) {
        items
    } else {
        // Items already in the target's version move through untouched;
        // the others are converted together (in batches, as kube converts
        // a list whole).
        let foreign: Vec<usize> = (0..items.len())
            .filter(|i| items[*i].api_version() != api_version)
            .collect();
        let values: Vec<&Value> = foreign.iter().map(|i| items[*i].value()).collect();
        let converted = match crate::registry::convert_values(&t.rt, &values, &api_version).await {
            Ok(c) => c,
            Err(e) => return error_response(&e),
        };
        let mut items = items;
        for (i, value) in foreign.into_iter().zip(converted) {
            let json = match serde_json::to_vec(&value) {
                Ok(j) => Bytes::from(j),
                Err(e) => return error_response(&ApiError::internal(e)),
            };
            items[i] = Item::new(value, json);
        }
        items
    };
    match out {
        Output::Json => {
            // kube writes a custom resource list from a map, keys sorted:
            // `{"apiVersion":…,"items":[` … `],"kind":…,"metadata":{…}}`.
            let head = serde_json::to_vec(&json!({"apiVersion": api_version})).unwrap_or_default();
            let tail = serde_json::to_vec(&json!({
                "kind": t.rt.list_kind,
                "metadata": meta.to_json_unstructured(),
            }))
            .unwrap_or_default();
            let mut prefix = head;
            prefix.pop();
            prefix.extend_from_slice(b",\"items\":[");
            let mut suffix = b"],".to_vec();
            suffix.extend_from_slice(tail.get(1..).unwrap_or_default());
            suffix.push(b'\n');
            let estimate = prefix.len() as u64
                + items.iter().map(|i| i.json().len() as u64 + 1).sum::<u64>()
                + suffix.len() as u64;
            let body = Body::from_stream(ListChunks {
                prefix: Some(Bytes::from(prefix)),
                suffix: Bytes::from(suffix),
                items: items.into_iter(),
                first: true,
                done: false,
            });
            let mut r = bytes_response(StatusCode::OK, JSON, body);
            r.extensions_mut().insert(SizeEstimate(estimate));
            r
        }
        Output::Yaml | Output::Cbor => {
            let values: Vec<Value> = items.iter().map(|i| i.value().clone()).collect();
            let doc = json!({"apiVersion": api_version, "kind": t.rt.list_kind, "metadata": meta.to_json_unstructured(), "items": values});
            if *out == Output::Cbor {
                cbor_response(StatusCode::OK, &doc)
            } else {
                yaml_response(StatusCode::OK, &doc)
            }
        }
        Output::ProtoMeta(v) => {
            let values: Vec<Value> = items.iter().map(|i| i.value().clone()).collect();
            proto_meta_response(
                StatusCode::OK,
                v,
                &json!({"metadata": meta.to_json(), "items": values}),
                true,
            )
        }
        Output::Table(v) => {
            let cols = Columns::for_target(t);
            let rows: Vec<Value> = items.iter().map(|i| cols.row(i.value(), include)).collect();
            let mut doc = table(Some(&cols), rows, meta.to_json());
            doc["apiVersion"] = json!(v);
            json_response(StatusCode::OK, &doc)
        }
        Output::PartialMeta(v) => {
            let metas: Vec<Value> = items
                .iter()
                .map(|i| {
                    let mut m = partial_metadata(i.value());
                    m["apiVersion"] = json!(v);
                    m
                })
                .collect();
            json_response(
                StatusCode::OK,
                &json!({"kind": "PartialObjectMetadataList", "apiVersion": v, "metadata": meta.to_json(), "items": metas}),
            )
        }
    }
}

/// Target size of one body chunk: large enough that TLS records and syscalls
/// stay few, small enough that a big list never sits in memory twice.
const CHUNK: usize = 64 * 1024;

/// Streams a JSON list body, packing the items' stored bytes into chunks lazily.
struct ListChunks {
    prefix: Option<Bytes>,
    /// `]` and the list's keys after `items`.
    suffix: Bytes,
    items: std::vec::IntoIter<Item>,
    first: bool,
    done: bool,
}

impl futures::Stream for ListChunks {
    type Item = Result<Bytes, std::convert::Infallible>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        if self.done {
            return std::task::Poll::Ready(None);
        }
        let mut buf = Vec::with_capacity(CHUNK + 4096);
        if let Some(p) = self.prefix.take() {
            buf.extend_from_slice(&p);
        }
        while buf.len() < CHUNK {
            let Some(item) = self.items.next() else {
                buf.extend_from_slice(&self.suffix);
                self.done = true;
                break;
            };
            if !self.first {
                buf.push(b',');
            }
            self.first = false;
            buf.extend_from_slice(item.json());
        }
        std::task::Poll::Ready(Some(Ok(Bytes::from(buf))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warning_headers_are_quoted_as_kube_quotes_them() {
        let v = warning_header(r#"say "hi" \ → ok"#).map(|v| v.as_bytes().to_vec());
        assert_eq!(
            v.as_deref(),
            Some(r#"299 - "say \"hi\" \\ → ok""#.as_bytes())
        );
        assert!(warning_header("").is_none());
        assert!(
            warning_header("a\nb").is_none(),
            "kube sends no header for control characters"
        );
    }
}
