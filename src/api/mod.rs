//! The HTTP surface: routing, request info, query options, content
//! negotiation, discovery, OpenAPI, and the resource and watch handlers.

pub mod discovery;
pub mod encoding;
pub mod health;
pub mod negotiate;
pub mod openapi;
pub mod openapi_proto;
pub mod options;
pub mod request;
pub mod resource;
pub mod response;
pub mod review;
pub mod strict;
pub mod watch;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use axum::Router;
use http::{header, HeaderMap, HeaderValue, StatusCode};
use serde_json::{json, Value};

use crate::registry::Registry;
use crate::status::ApiError;
use request::Route;
use response::{bytes_response, error_response, json_response};

pub struct ApiState {
    pub registry: Arc<Registry>,
    pub readiness: Arc<health::Readiness>,
    pub bookmark_interval: Duration,
    /// Watches without `timeoutSeconds` last between this and twice this.
    pub min_request_timeout: Duration,
    /// `--request-timeout`: also bounds converting a watch's initial events.
    pub request_timeout: Duration,
    /// Cancelled at shutdown: every watch stream ends cleanly.
    pub stop_watches: tokio_util::sync::CancellationToken,
    /// Standalone, kshard answers kubectl's identity reviews itself; behind
    /// a host, the host serves those groups.
    pub serve_reviews: bool,
}

impl ApiState {
    fn reviews(&self) -> &'static [review::Review] {
        if self.serve_reviews {
            &review::REVIEWS
        } else {
            &[]
        }
    }
}

pub fn router(state: Arc<ApiState>) -> Router {
    Router::new().fallback(handle).with_state(state)
}

async fn handle(State(state): State<Arc<ApiState>>, req: Request) -> Response {
    let pretty = wants_pretty(req.uri().path(), req.uri().query().unwrap_or(""));
    let resp = serve(&state, req).await;
    if pretty {
        indent_json(resp).await
    } else {
        resp
    }
}

/// `?pretty=` as kube reads it (Go's `strconv.ParseBool`); never for watches,
/// whose events are one JSON document per line.
fn wants_pretty(path: &str, query: &str) -> bool {
    let truthy = |v: &str| matches!(v, "1" | "t" | "T" | "true" | "TRUE" | "True");
    let mut pretty = false;
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match &*k {
            "pretty" => pretty = truthy(&v),
            "watch" if truthy(&v) => return false,
            _ => {}
        }
    }
    pretty && !path.split('/').any(|s| s == "watch")
}

/// A JSON answer indented as kube's `?pretty=true` gives it (two spaces, no
/// final newline).
async fn indent_json(resp: Response) -> Response {
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json"));
    if !is_json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        tracing::debug!("a response body failed while being indented");
        return error_response(&ApiError::internal("the response could not be read"));
    };
    // Every JSON answer is written in kube's order already (its own kinds
    // in their structs' field order, custom resources sorted): indenting
    // the bytes as written keeps it, where a `Value` would sort them all.
    let out = indent_bytes(&bytes).unwrap_or_else(|| bytes.to_vec());
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(out))
}

/// Compact JSON indented as it is, keys in their order (two spaces, no
/// final newline: Go's `json.MarshalIndent`).
fn indent_bytes(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(bytes.len() * 2);
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let mut ser = serde_json::Serializer::pretty(&mut out);
    serde_transcode::transcode(&mut de, &mut ser).ok()?;
    de.end().ok()?;
    Some(out)
}

async fn serve(state: &ApiState, req: Request) -> Response {
    let (mut parts, body) = req.into_parts();
    let info = request::RequestInfo::take(&parts.method, &parts.uri, &mut parts.extensions);
    let query = parts.uri.query().unwrap_or("").to_string();
    let body = match crate::scope::read_within(body, &parts.extensions).await {
        Ok(b) => b,
        Err(e) => return error_response(&e),
    };
    let accept = parts
        .headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let catalog = &*state.registry.catalog();
    let reviews = state.reviews();
    match info.route {
        Route::Resource(r) if state.serve_reviews && review::addressed(&r).is_some() => {
            let Some(review) = review::addressed(&r) else {
                return error_response(&ApiError::not_found_path());
            };
            review::handle(
                review,
                review::Call {
                    method: &parts.method,
                    headers: &parts.headers,
                    query: &query,
                    body: &body,
                    user: parts
                        .extensions
                        .get::<crate::auth::Identity>()
                        .cloned()
                        .unwrap_or_default(),
                    authorizer: parts.extensions.get::<crate::authz::Authorizer>().cloned(),
                },
            )
            .await
        }
        Route::Resource(r) => {
            resource::handle(
                state,
                resource::Call {
                    req: r,
                    headers: &parts.headers,
                    query: &query,
                    body,
                    initial_events_sent: parts
                        .extensions
                        .get::<watch::InitialEventsSent>()
                        .cloned(),
                    caller: caller_of(&parts.extensions),
                },
            )
            .await
        }
        Route::LegacyRoot => discovery_doc(
            &parts.headers,
            accept.as_deref(),
            discovery::legacy_root,
            |v| discovery::aggregated(catalog, reviews, v, true),
        ),
        Route::Apis => discovery_doc(
            &parts.headers,
            accept.as_deref(),
            || discovery::apis(catalog, reviews),
            |v| discovery::aggregated(catalog, reviews, v, false),
        ),
        Route::LegacyV1 => error_response(&ApiError::not_found_legacy()),
        Route::Group(g) => match discovery::group(catalog, reviews, &g) {
            Some(doc) => json_response(StatusCode::OK, &doc),
            None => error_response(&ApiError::not_found_path()),
        },
        Route::GroupVersion(g, v) => {
            match discovery::group_version_resources(catalog, reviews, &g, &v) {
                Some(doc) => json_response(StatusCode::OK, &doc),
                None => error_response(&ApiError::not_found_path()),
            }
        }
        Route::Version => bytes_response(
            StatusCode::OK,
            response::JSON,
            response::raw_json_document(encoding::typed_order::to_vec_as(
                &version_info(),
                encoding::typed_order::VERSION_INFO,
            )),
        ),
        Route::Health(h) => {
            health::respond(
                &state.readiness,
                h,
                &info.path,
                parts.uri.query().unwrap_or(""),
            )
            .await
        }
        Route::OpenApiV2 => openapi_v2(
            &parts.method,
            &parts.headers,
            accept.as_deref(),
            &openapi::v2(catalog),
        ),
        Route::OpenApiV3Root => etagged(
            &parts.headers,
            &openapi::v3_root(catalog),
            "application/json",
        ),
        Route::OpenApiV3GroupVersion(g, v) => openapi_v3(
            &parts.method,
            &parts.headers,
            accept.as_deref(),
            &parts.uri,
            openapi::v3_group_version(catalog, &g, &v),
        ),
        // The server routes it before this handler (`server::snapshot`).
        Route::Snapshot | Route::NotFound => error_response(&ApiError::not_found_path()),
    }
}

/// Who a write comes from, for admission: the acting user (after
/// impersonation) and the request's audit event for annotations.
fn caller_of(ext: &http::Extensions) -> crate::registry::write_admission::Caller {
    let annotate: Option<crate::registry::write_admission::Annotate> = ext
        .get::<Arc<crate::audit::Recording>>()
        .cloned()
        .map(|rec| {
            Arc::new(move |k: &str, v: &str| rec.annotate(k, v))
                as crate::registry::write_admission::Annotate
        });
    crate::registry::write_admission::Caller {
        user: ext
            .get::<crate::auth::Identity>()
            .cloned()
            .unwrap_or_default(),
        annotate,
        ..Default::default()
    }
}

pub fn version_info() -> Value {
    // kube-apiserver 1.35's fields, in its order: the emulated version and
    // the oldest version it stays compatible with (one minor back).
    json!({
        "major": "1",
        "minor": "35",
        "emulationMajor": "1",
        "emulationMinor": "35",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "34",
        "gitVersion": concat!("v1.35.0-kshard.", env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "",
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
    })
}

fn etagged(headers: &HeaderMap, doc: &Value, content_type: &str) -> Response {
    let body = response::json_document(encoding::typed_order::to_vec(doc));
    let etag = discovery::etag(&body);
    let not_modified = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == etag);
    let mut r = if not_modified {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::NOT_MODIFIED;
        r
    } else {
        bytes_response(StatusCode::OK, content_type, body)
    };
    if let Ok(v) = HeaderValue::from_str(&etag) {
        r.headers_mut().insert(header::ETAG, v);
    }
    r.headers_mut()
        .insert(header::VARY, HeaderValue::from_static("Accept"));
    r
}

/// `/openapi/v2` as kube-openapi's `OpenAPIService` serves it: the first of
/// the client's media ranges (by q, specific before wildcard) that names JSON
/// or gnostic's protobuf picks the form; none is a bare 406. Both forms carry
/// the quoted hash of the JSON document as their ETag (the answer varies by
/// Accept), and a matching If-None-Match is a 304 (412 for methods other than
/// GET and HEAD, as Go's `ServeContent` answers).
fn openapi_v2(
    method: &http::Method,
    headers: &HeaderMap,
    accept: Option<&str>,
    doc: &Value,
) -> Response {
    let mut r = match openapi::negotiate_v2(accept) {
        None => {
            let mut r = Response::new(Body::empty());
            *r.status_mut() = StatusCode::NOT_ACCEPTABLE;
            r
        }
        Some(form) => {
            let json = serde_json::to_vec(doc).unwrap_or_default();
            let etag = discovery::etag(&json);
            let mut r = if openapi::if_none_match(headers, &etag) {
                let mut r = Response::new(Body::empty());
                *r.status_mut() = if method == http::Method::GET || method == http::Method::HEAD {
                    StatusCode::NOT_MODIFIED
                } else {
                    StatusCode::PRECONDITION_FAILED
                };
                r
            } else {
                match form {
                    openapi::V2Form::Json => bytes_response(StatusCode::OK, response::JSON, json),
                    openapi::V2Form::Protobuf => bytes_response(
                        StatusCode::OK,
                        openapi::V2_PROTOBUF,
                        openapi_proto::encode(doc),
                    ),
                }
            };
            if let Ok(v) = HeaderValue::from_str(&etag) {
                r.headers_mut().insert(header::ETAG, v);
            }
            r
        }
    };
    r.headers_mut()
        .insert(header::VARY, HeaderValue::from_static("Accept"));
    r
}

/// `/openapi/v3/<group>/<version>` as kube-openapi's v3 handler serves it:
/// an unknown group-version is a bare 404, a form the client cannot take a
/// bare 406; a `hash` query that is not the document's redirects (301) to
/// the current one, and one that is makes the answer cacheable for a year;
/// If-None-Match the document's ETag is a 304 (412 unless GET or HEAD).
fn openapi_v3(
    method: &http::Method,
    headers: &HeaderMap,
    accept: Option<&str>,
    uri: &http::Uri,
    doc: Option<Value>,
) -> Response {
    let bare = |code: StatusCode| {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = code;
        r
    };
    let Some(doc) = doc else {
        return bare(StatusCode::NOT_FOUND);
    };
    if !openapi::v3_accepts_json(accept) {
        // kube-openapi names the header its answer varies by here too.
        let mut r = bare(StatusCode::NOT_ACCEPTABLE);
        r.headers_mut()
            .insert(header::VARY, HeaderValue::from_static("Accept"));
        return r;
    }
    let json = serde_json::to_vec(&doc).unwrap_or_default();
    let etag = discovery::etag(&json);
    let hash = etag.trim_matches('"');
    let asked = form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
        .find(|(k, _)| k == "hash")
        .map(|(_, v)| v.into_owned())
        .filter(|v| !v.is_empty());
    let mut r = match asked.as_deref() {
        Some(h) if h != hash => {
            let mut r = bare(StatusCode::MOVED_PERMANENTLY);
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(response::JSON),
            );
            // The same path with the current hash as its only query.
            let location = format!("{}?hash={hash}", uri.path());
            if let Ok(v) = HeaderValue::from_str(&location) {
                r.headers_mut().insert(header::LOCATION, v);
            }
            r
        }
        _ if openapi::if_none_match(headers, &etag) => bare(
            if method == http::Method::GET || method == http::Method::HEAD {
                StatusCode::NOT_MODIFIED
            } else {
                StatusCode::PRECONDITION_FAILED
            },
        ),
        _ => bytes_response(StatusCode::OK, response::JSON, json),
    };
    if asked.as_deref() == Some(hash) && r.status() == StatusCode::OK {
        r.headers_mut().insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("public, immutable"),
        );
        // Go's time.RFC1123, which names the zone `UTC`.
        let expires = (chrono::Utc::now() + chrono::Duration::days(365))
            .format("%a, %d %b %Y %H:%M:%S UTC")
            .to_string();
        if let Ok(v) = HeaderValue::from_str(&expires) {
            r.headers_mut().insert(header::EXPIRES, v);
        }
    }
    if let Ok(v) = HeaderValue::from_str(&etag) {
        r.headers_mut().insert(header::ETAG, v);
    }
    r.headers_mut()
        .insert(header::VARY, HeaderValue::from_static("Accept"));
    r
}

fn discovery_doc(
    headers: &HeaderMap,
    accept: Option<&str>,
    legacy: impl FnOnce() -> Value,
    aggregated: impl FnOnce(&str) -> Value,
) -> Response {
    match discovery::wants_aggregated(accept) {
        Some(v) => {
            let mut r = etagged(headers, &aggregated(v), discovery::AGGREGATED_V2);
            r.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("public"));
            r
        }
        None if discovery::accepts_legacy(accept) => json_response(StatusCode::OK, &legacy()),
        None => error_response(&ApiError::not_acceptable(&discovery::LEGACY_TYPES)),
    }
}
