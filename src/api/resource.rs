//! Handlers for resource paths: thin glue from a parsed request to the
//! registry and back to a negotiated response.

use crate::object::MetaField;
use std::sync::Arc;

use axum::response::Response;
use bytes::Bytes;
use http::{header, HeaderMap, StatusCode};
use serde_json::Value;

use super::negotiate::{negotiate, negotiate_for, Shape};
use super::options::{delete_options, write_options, ListOptions, Query};
use super::request::{ResourceRequest, Verb};
use super::response::{self, error_response, ListMeta};
use super::ApiState;
use crate::registry::patch::{self, PatchType};
use crate::registry::scale::{apply_scale, to_scale};
use crate::registry::table::IncludeObject;
use crate::registry::write_admission::Caller;
use crate::registry::{DeleteOutcome, Item, Selectors, Subresource, Target};
use crate::status::ApiError;

const BODY_TYPES: &[&str] = &[
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
    "application/cbor",
];
/// The patch types kube lists in its 415 (apply-patch+cbor is accepted too,
/// but kube 1.36 lists it only with its CBOR feature gate on, off by default).
const PATCH_TYPES: &[&str] = &[
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/apply-patch+yaml",
];

pub struct Call<'a> {
    pub req: ResourceRequest,
    pub headers: &'a HeaderMap,
    pub query: &'a str,
    pub body: Bytes,
    pub initial_events_sent: Option<super::watch::InitialEventsSent>,
    /// The user and audit event; writes add their options for admission.
    pub caller: Caller,
}

fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
}

/// The body's media type, without parameters.
fn media_type(headers: &HeaderMap) -> &str {
    content_type(headers).split(';').next().unwrap_or("").trim()
}

fn json_error(kind: &str, e: serde_json::Error, body: &[u8]) -> ApiError {
    unrecognized(kind, &crate::registry::patch::go_json_error(&e), body)
}

/// kube's refusal of a body it cannot read the kind of: the decoder's error
/// and the start of the body (as text when it opens an object, else in hex).
fn unrecognized(kind: &str, error: &str, body: &[u8]) -> ApiError {
    const SHOWN: usize = 30;
    let head = &body[..body.len().min(SHOWN)];
    let mut shown = if body.is_empty() {
        "<empty>".to_string()
    } else if body.first() == Some(&b'{') {
        String::from_utf8_lossy(head).into_owned()
    } else {
        head.iter().map(|b| format!("{b:02x}")).collect()
    };
    if body.len() > SHOWN {
        shown.push_str(" ...");
    }
    ApiError::bad_request(format!(
        "the object provided is unrecognized (must be of type {kind}): couldn't get version/kind; json parse error: {error} ({shown})"
    ))
}

/// Go's error for a JSON document that is not an object where kube first
/// reads the apiVersion and kind (a null reads as an empty object).
fn not_an_object(kind: &str, value: &Value, body: &[u8]) -> Result<(), ApiError> {
    if value.is_object() || value.is_null() {
        return Ok(());
    }
    Err(unrecognized(
        kind,
        &format!(
            "json: cannot unmarshal {} into Go value of type struct {{ APIVersion string \"json:\\\"apiVersion,omitempty\\\"\"; Kind string \"json:\\\"kind,omitempty\\\"\" }}",
            crate::registry::patch::go_json_type(value)
        ),
        body,
    ))
}

/// Decodes a request body (JSON or YAML) into an object.
pub fn decode_body(headers: &HeaderMap, body: &[u8], kind: &str) -> Result<Value, ApiError> {
    let value: Value = match media_type(headers) {
        // An absent type is JSON, as kube reads it; a wildcard names no format: 415.
        "" | "application/json" => {
            let v: Value = serde_json::from_slice(body).map_err(|e| json_error(kind, e, body))?;
            not_an_object(kind, &v, body)?;
            v
        }
        "application/cbor" => super::encoding::cbor::from_cbor(body).map_err(|e| {
            ApiError::bad_request(format!(
                "the object provided is unrecognized (must be of type {kind}): {e}"
            ))
        })?,
        "application/yaml" => {
            let text = std::str::from_utf8(body)
                .map_err(|e| ApiError::bad_request(format!("invalid YAML: {e}")))?;
            serde_saphyr::from_str(text).map_err(|e| {
                // kube's wording around the parser's first line (the
                // parser's own words differ from go-yaml's; README).
                let e = e.to_string();
                let first = e.lines().next().unwrap_or("");
                unrecognized(
                    kind,
                    &format!("yaml: {}", first.trim_start_matches("error: ")),
                    body,
                )
            })?
        }
        _ => return Err(ApiError::unsupported_media_type(BODY_TYPES)),
    };
    Ok(value)
}

/// Decodes a server-side apply body: CBOR for `application/apply-patch+cbor`,
/// else YAML (of which JSON is a subset).
fn decode_apply_config(media: &str, body: &[u8]) -> Result<Value, ApiError> {
    if media == "application/apply-patch+cbor" {
        return super::encoding::cbor::from_cbor(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding CBOR: {e}")));
    }
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    serde_saphyr::from_str(text)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
}

pub async fn handle(state: &ApiState, call: Call<'_>) -> Response {
    let accept = call
        .headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let deprecation = deprecation_warning(state, &call.req);
    let warnings = call.caller.warnings.clone();
    let mut resp = match dispatch(state, call).await {
        Ok(r) => r,
        Err(e) => response::error_for(accept.as_deref(), &e),
    };
    // Admission webhooks' warnings reach the client even when the request
    // failed (a success carries them in order already; `warn` adds each once).
    for w in warnings.all() {
        response::warn(&mut resp, &w);
    }
    if let Some(text) = deprecation {
        response::warn_first(&mut resp, &text);
    }
    resp
}

/// The warning of the deprecated version a request addresses. kube adds it
/// once the CRD, its served version and the request's scope are resolved,
/// before the handler runs, so every answer carries it, errors included.
fn deprecation_warning(state: &ApiState, req: &ResourceRequest) -> Option<String> {
    let rt = state
        .registry
        .catalog()
        .find(&req.group, &req.version, &req.resource)?
        .clone();
    let across_namespaces = matches!(req.verb, Some(Verb::List | Verb::Watch));
    match (rt.namespaced, req.namespace.is_some()) {
        (false, true) => return None,
        (true, false) if !across_namespaces => return None,
        _ => {}
    }
    rt.version(&req.version)?.deprecation_warning.clone()
}

/// Resolves the request (resource, verb, scope, subresource) and runs its
/// verb's handler.
async fn dispatch(state: &ApiState, call: Call<'_>) -> Result<Response, ApiError> {
    let (rt, verb) = resource_and_verb(state, &call.req)?;
    // Counts the write request in flight for its whole handling (the
    // store tells a lone writer from one of many by it).
    let _writing =
        (!matches!(verb, Verb::Get | Verb::List | Verb::Watch)).then(|| state.registry.writing());
    let (target, sub) = target_of(&call.req, rt, verb)?;
    if let Some(name) = &call.req.name {
        state.registry.check_url_name(name)?;
    }
    let q = Query::parse(call.query);
    let include = IncludeObject::parse(q.get("includeObject").unwrap_or(""))
        .map_err(ApiError::bad_request)?;
    let name = call.req.name.clone().unwrap_or_default();
    let h = Handler {
        state,
        call: &call,
        t: target,
        sub,
        q,
        include,
        name,
    };
    match verb {
        Verb::Watch => h.watch().await,
        Verb::List => h.list().await,
        Verb::Get => h.get().await,
        Verb::Create => h.create().await,
        Verb::Update => h.update().await,
        Verb::Patch => h.patch().await,
        Verb::Delete => h.delete().await,
        Verb::DeleteCollection => h.delete_collection().await,
    }
}

/// The served resource a request addresses, and its verb (kube's 404 for
/// a resource not served, 405 for a method with no verb).
fn resource_and_verb(
    state: &ApiState,
    req: &ResourceRequest,
) -> Result<(Arc<crate::registry::ResourceType>, Verb), ApiError> {
    let rt = state
        .registry
        .catalog()
        .find(&req.group, &req.version, &req.resource)
        .cloned()
        .ok_or_else(ApiError::not_found_path)?;
    let verb = req
        .verb
        .ok_or_else(|| ApiError::method_not_supported(&rt.group, &rt.plural, "this method"))?;
    Ok((rt, verb))
}

/// The request's target and subresource, after kube's scope rules: no
/// namespace on a cluster-scoped resource, all namespaces only to list and
/// watch, subresources the version has, and only to get, update or patch.
fn target_of(
    req: &ResourceRequest,
    rt: Arc<crate::registry::ResourceType>,
    verb: Verb,
) -> Result<(Target, Option<&'static str>), ApiError> {
    let not_found = ApiError::not_found_path;
    if !rt.namespaced && req.namespace.is_some() {
        return Err(not_found());
    }
    let all_namespaces = rt.namespaced && req.namespace.is_none();
    if all_namespaces && !matches!(verb, Verb::List | Verb::Watch) {
        return Err(not_found());
    }
    let t = Target {
        rt: rt.clone(),
        version: req.version.clone(),
        namespace: req.namespace.clone().unwrap_or_default(),
    };
    let sub = match req.subresource.as_deref() {
        None => None,
        Some("status") if t.has_status() => Some("status"),
        Some("scale") if t.version_info().is_some_and(|v| v.scale.is_some()) => Some("scale"),
        Some(_) => {
            return Err(ApiError::not_found(
                &rt.group,
                &rt.plural,
                req.name.as_deref().unwrap_or(""),
            ))
        }
    };
    if sub.is_some() && !matches!(verb, Verb::Get | Verb::Update | Verb::Patch) {
        return Err(ApiError::method_not_supported(
            &rt.group,
            &format!("{}/{}", rt.plural, sub.unwrap_or("")),
            verb.as_str(),
        ));
    }
    Ok((t, sub))
}

/// A resolved request: one method per verb.
struct Handler<'a> {
    state: &'a ApiState,
    call: &'a Call<'a>,
    t: Target,
    /// `status` or `scale`.
    sub: Option<&'static str>,
    q: Query,
    include: IncludeObject,
    /// Empty for collections.
    name: String,
}

impl Handler<'_> {
    fn accept(&self) -> Option<&str> {
        self.call
            .headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
    }

    /// The main resource or its status.
    fn main_or_status(&self) -> Subresource {
        if self.sub == Some("status") {
            Subresource::Status
        } else {
            Subresource::Main
        }
    }

    /// Create, update and patch options with the caller as sent.
    fn write_options(
        &self,
        is_apply: bool,
        kind: &str,
    ) -> Result<crate::registry::WriteOptions, ApiError> {
        let mut wo = write_options(&self.q, self.call.headers, is_apply, kind)?;
        wo.caller = Some(write_caller(&self.call.caller, &self.q));
        Ok(wo)
    }

    /// Delete options with the caller as sent.
    fn delete_options(&self) -> Result<crate::registry::DeleteOptions, ApiError> {
        let mut opts = delete_options(&self.q, &self.call.body)?;
        opts.caller = Some(delete_caller(
            &self.call.caller,
            &self.q,
            &self.call.body,
            &opts,
        ));
        Ok(opts)
    }

    /// The object a write left, with the warnings it earned.
    async fn written(
        &self,
        code: StatusCode,
        item: &Item,
        out: &super::negotiate::Output,
        warnings: &[String],
    ) -> Response {
        with_warnings(
            response::object(code, &self.t, item, out, self.include).await,
            warnings,
        )
    }

    async fn watch(&self) -> Result<Response, ApiError> {
        let opts = ListOptions::parse(&self.q, self.call.req.legacy_watch)?;
        let hook = self.call.initial_events_sent.clone();
        let name = self.call.req.name.as_deref();
        super::watch::serve(self.state, &self.t, name, opts, self.accept(), hook).await
    }

    async fn list(&self) -> Result<Response, ApiError> {
        let out = negotiate_for(self.accept(), Shape::List)?;
        let opts = ListOptions::parse(&self.q, false)?;
        let at = opts.read_at()?;
        let sel = Selectors::parse(&self.t, &opts.label_selector, &opts.field_selector)?;
        let result = self
            .state
            .registry
            .list(&self.t, &sel, &at, opts.limit)
            .await?;
        let meta = ListMeta {
            resource_version: result.revision.to_string(),
            continue_token: result.continue_token,
            remaining: result.remaining,
        };
        Ok(response::list(&self.t, result.items, meta, &out, self.include).await)
    }

    async fn get(&self) -> Result<Response, ApiError> {
        let opts = ListOptions::parse(&self.q, false)?;
        let at = opts.get_read_at()?;
        let item = self.state.registry.get(&self.t, &self.name, &at).await?;
        if self.sub == Some("scale") {
            return Ok(scale_response(&self.t, &item, StatusCode::OK));
        }
        let out = negotiate_for(self.accept(), Shape::Object)?;
        Ok(response::object(StatusCode::OK, &self.t, &item, &out, self.include).await)
    }

    async fn create(&self) -> Result<Response, ApiError> {
        let rt = &self.t.rt;
        if rt.terminating {
            let mut e = ApiError::method_not_supported(&rt.group, &rt.plural, "create");
            e.message = "create not allowed while custom resource definition is terminating".into();
            return Err(e);
        }
        let out = negotiate(self.accept(), true)?;
        let mut wo = self.write_options(false, "CreateOptions")?;
        let (obj, dups) = decode_checked(self.call.headers, &self.call.body, &rt.kind, &wo)?;
        let dups = strict_later(&mut wo, dups);
        let done = self.state.registry.create(&self.t, obj, &wo).await?;
        let warnings = merge_warnings(dups, &done.warnings);
        Ok(self
            .written(StatusCode::CREATED, &done.item, &out, &warnings)
            .await)
    }

    async fn update(&self) -> Result<Response, ApiError> {
        let (t, reg) = (&self.t, &self.state.registry);
        let out = negotiate(self.accept(), true)?;
        let mut wo = self.write_options(false, "UpdateOptions")?;
        let (obj, dups) = decode_checked(self.call.headers, &self.call.body, &t.rt.kind, &wo)?;
        let dups = strict_later(&mut wo, dups);
        if self.sub == Some("scale") {
            let spec = scale_spec(t)?;
            let done = reg
                .update_with(t, &self.name, Subresource::Scale, &wo, |cur| {
                    apply_scale(&spec, cur, &obj, &t.rt.kind, &t.rt.group)
                })
                .await?;
            return Ok(scale_response(t, &done.item, StatusCode::OK));
        }
        let sr = self.main_or_status();
        let done = reg.update(t, &self.name, obj, sr, &wo).await?;
        let warnings = merge_warnings(dups, &done.warnings);
        Ok(self
            .written(StatusCode::OK, &done.item, &out, &warnings)
            .await)
    }

    /// Server-side apply or a JSON, merge or strategic patch, by content type.
    async fn patch(&self) -> Result<Response, ApiError> {
        let ct = content_type(self.call.headers);
        let media = ct.split(';').next().unwrap_or("").trim();
        if matches!(
            media,
            "application/apply-patch+yaml" | "application/apply-patch+cbor"
        ) {
            self.apply(media).await
        } else {
            self.patch_with(ct).await
        }
    }

    async fn apply(&self, media: &str) -> Result<Response, ApiError> {
        let (t, reg, name) = (&self.t, &self.state.registry, &self.name);
        let out = negotiate(self.accept(), true)?;
        let wo = self.write_options(true, "PatchOptions")?;
        let force = self.q.bool("force").unwrap_or(false);
        let config = decode_apply_config(media, &self.call.body)?;
        if self.sub == Some("scale") {
            // The Scale's replicas, applied as the main resource's
            // replicas path and owned "with subresource scale".
            let spec = scale_spec(t)?;
            let parent = crate::registry::scale::scale_as_apply_config(
                &spec,
                &config,
                &t.api_version(),
                &t.rt.kind,
                name,
            )?;
            let done = reg
                .apply(t, name, parent, force, Subresource::Scale, &wo)
                .await?;
            return Ok(scale_response(t, &done.item, StatusCode::OK));
        }
        let sr = self.main_or_status();
        let done = reg.apply(t, name, config, force, sr, &wo).await?;
        // kube: 201 when the apply created the object.
        let code = if done.created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        Ok(self.written(code, &done.item, &out, &done.warnings).await)
    }

    /// A JSON, merge or strategic merge patch of content type `ct`.
    async fn patch_with(&self, ct: &str) -> Result<Response, ApiError> {
        let (t, reg, name) = (&self.t, &self.state.registry, &self.name);
        let out = negotiate(self.accept(), true)?;
        let wo = self.write_options(false, "PatchOptions")?;
        if self.q.get("force").is_some() {
            return Err(ApiError::invalid(
                "meta.k8s.io",
                "PatchOptions",
                "",
                &[crate::status::FieldError::forbidden(
                    "force",
                    "may not be specified for non-apply patch",
                )],
            ));
        }
        // Strategic merge patch only for kube's built-in types kshard
        // serves (with their patch metadata); a custom resource's is 415.
        let patch_meta =
            crate::admission::builtin_crds::strategic_merge_meta(&t.rt.group, &t.rt.plural);
        let kind = PatchType::from_content_type(ct)
            .filter(|k| *k != PatchType::Strategic || patch_meta.is_some())
            .ok_or_else(|| ApiError::unsupported_media_type(PATCH_TYPES))?;
        let body = &self.call.body;
        if self.sub == Some("scale") {
            let spec = scale_spec(t)?;
            let done = reg
                .update_with(t, name, Subresource::Scale, &wo, |cur| {
                    let scale = patch::apply(kind, &to_scale(&spec, cur), body)?;
                    apply_scale(&spec, cur, &scale, &t.rt.kind, &t.rt.group)
                })
                .await?;
            return Ok(scale_response(t, &done.item, StatusCode::OK));
        }
        let sr = self.main_or_status();
        let done = reg
            .update_with(t, name, sr, &wo, |cur| {
                patch::apply_with(kind, cur, body, patch_meta.as_ref())
            })
            .await?;
        Ok(self
            .written(StatusCode::OK, &done.item, &out, &done.warnings)
            .await)
    }

    async fn delete(&self) -> Result<Response, ApiError> {
        let out = negotiate(self.accept(), true)?;
        let opts = self.delete_options()?;
        match self
            .state
            .registry
            .delete(&self.t, &self.name, &opts)
            .await?
        {
            DeleteOutcome::Pending(item) => {
                Ok(response::object(StatusCode::OK, &self.t, &item, &out, self.include).await)
            }
            DeleteOutcome::Deleted(item) => {
                let uid = item
                    .value()
                    .meta_field("uid")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let rt = &self.t.rt;
                Ok(response::json_response(
                    StatusCode::OK,
                    &serde_json::json!({
                        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                        "details": {"name": self.name, "group": rt.group, "kind": rt.plural, "uid": uid},
                    }),
                ))
            }
        }
    }

    async fn delete_collection(&self) -> Result<Response, ApiError> {
        let reg = &self.state.registry;
        let out = negotiate(self.accept(), true)?;
        let lopts = ListOptions::parse(&self.q, false)?;
        lopts.read_at()?;
        let sel = Selectors::parse(&self.t, &lopts.label_selector, &lopts.field_selector)?;
        let opts = self.delete_options()?;
        let items: Vec<Item> = reg.delete_collection(&self.t, &sel, &opts).await?;
        let meta = ListMeta {
            resource_version: reg.revision().to_string(),
            continue_token: None,
            remaining: None,
        };
        Ok(response::list(&self.t, items, meta, &out, self.include).await)
    }
}

/// The caller of a create, update or patch, with the options as sent.
fn write_caller(base: &Caller, q: &Query) -> Arc<Caller> {
    Arc::new(Caller {
        field_manager: q.get("fieldManager").unwrap_or("").to_string(),
        field_validation: q.get("fieldValidation").unwrap_or("").to_string(),
        ..base.clone()
    })
}

/// The caller of a delete, with its DeleteOptions as kube decodes them (the
/// body's, then the query's parameters, in Go's field order).
fn delete_caller(
    base: &Caller,
    q: &Query,
    body: &[u8],
    opts: &crate::registry::DeleteOptions,
) -> Arc<Caller> {
    let sent: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let mut o = serde_json::Map::new();
    let grace = sent.get("gracePeriodSeconds").cloned().or_else(|| {
        q.get("gracePeriodSeconds")
            .and_then(|g| g.parse::<i64>().ok())
            .map(Value::from)
    });
    if let Some(g) = grace {
        o.insert("gracePeriodSeconds".into(), g);
    }
    if let Some(p) = sent.get("preconditions").filter(|p| p.is_object()) {
        o.insert("preconditions".into(), p.clone());
    }
    if let Some(orphan) = sent
        .get("orphanDependents")
        .cloned()
        .or_else(|| q.bool("orphanDependents").map(Value::Bool))
    {
        o.insert("orphanDependents".into(), orphan);
    }
    let propagation = sent
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .or_else(|| q.get("propagationPolicy"));
    if let Some(p) = propagation {
        o.insert("propagationPolicy".into(), Value::from(p));
    }
    if opts.dry_run {
        o.insert("dryRun".into(), serde_json::json!(["All"]));
    }
    Arc::new(Caller {
        delete_options: Some(Value::Object(o)),
        ..base.clone()
    })
}

/// A write's body decoded, with the warnings its repeated keys earn (or the
/// strict decoding error). A JSON body is parsed once for both.
fn decode_checked(
    headers: &HeaderMap,
    body: &[u8],
    kind: &str,
    wo: &crate::registry::WriteOptions,
) -> Result<(Value, Vec<String>), ApiError> {
    if !matches!(media_type(headers), "" | "application/json") {
        let dups = duplicate_check(super::strict::duplicate_fields(body), wo)?;
        return Ok((decode_body(headers, body, kind)?, dups));
    }
    let (value, dups) =
        super::strict::from_slice_with_duplicates(body).map_err(|e| json_error(kind, e, body))?;
    not_an_object(kind, &value, body)?;
    Ok((value, duplicate_check(dups, wo)?))
}

/// Repeated JSON keys: an error under Strict, warnings under Warn (as kube's
/// strict decoder reports them).
fn duplicate_check(
    dups: Vec<String>,
    wo: &crate::registry::WriteOptions,
) -> Result<Vec<String>, ApiError> {
    let dups: Vec<String> = dups
        .iter()
        .map(|p| format!("duplicate field {}", crate::status::quote(p)))
        .collect();
    match wo.field_validation {
        _ if dups.is_empty() => Ok(dups),
        // Reported with the schema's unknown fields (`strict_duplicates`).
        crate::registry::FieldValidation::Strict => Ok(dups),
        crate::registry::FieldValidation::Warn => Ok(dups),
        crate::registry::FieldValidation::Ignore => Ok(Vec::new()),
    }
}

/// Under Strict, repeated keys go with the request to be reported with the
/// unknown fields; otherwise they are warnings.
fn strict_later(wo: &mut crate::registry::WriteOptions, dups: Vec<String>) -> Vec<String> {
    if wo.field_validation == crate::registry::FieldValidation::Strict {
        wo.strict_duplicates = dups;
        Vec::new()
    } else {
        dups
    }
}

fn merge_warnings(mut first: Vec<String>, rest: &[String]) -> Vec<String> {
    first.extend(rest.iter().cloned());
    first
}

/// Adds one `Warning: 299 - "..."` header per warning, as kube does.
fn with_warnings(mut resp: Response, warnings: &[String]) -> Response {
    for w in warnings {
        response::warn(&mut resp, w);
    }
    resp
}

fn scale_spec(t: &Target) -> Result<crate::apiextensions::catalog::ScaleSpec, ApiError> {
    t.version_info()
        .and_then(|v| v.scale.clone())
        .ok_or_else(ApiError::not_found_path)
}

fn scale_response(t: &Target, item: &Item, code: StatusCode) -> Response {
    match scale_spec(t) {
        Ok(spec) => response::bytes_response(
            code,
            response::JSON,
            response::json_document(super::encoding::typed_order::to_vec(&to_scale(
                &spec,
                item.value(),
            ))),
        ),
        Err(e) => error_response(&e),
    }
}

pub type Shared = Arc<ApiState>;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const YAML_TOKENS: &[&str] = &[
        "a",
        "b",
        "- ",
        ": ",
        "&a ",
        "*a",
        "&b ",
        "*b",
        "!!str ",
        "!!binary ",
        "!!map ",
        "!x ",
        "<<: *a",
        "{",
        "}",
        "[",
        "]",
        ", ",
        "\n",
        "  ",
        "? ",
        "|",
        ">",
        "'",
        "\"",
        "# c",
        "---",
        "...",
        "%YAML 1.2\n",
        "~",
        "null",
        "1e999",
        "-.inf",
        ".nan",
        "0x1F",
        "0o17",
        "2024-01-01",
        "\t",
        "é",
        "\u{0}",
        "\u{feff}",
        "\\",
        "\"\\ud800\"",
    ];

    const MEDIA: &[&str] = &[
        "",
        "application/json",
        "application/json; charset=utf-8",
        "application/yaml",
        "application/cbor",
        "*/*",
        "text/plain",
        "application/vnd.kubernetes.protobuf",
    ];

    fn body() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            4 => crate::fuzz::body_bytes(),
            3 => crate::fuzz::token_soup(YAML_TOKENS, 40).prop_map(String::into_bytes),
            1 => crate::fuzz::nested("- ", "").prop_map(String::into_bytes),
            1 => crate::fuzz::nested("{a: ", "}").prop_map(String::into_bytes),
            1 => crate::fuzz::json_value().prop_map(|v| crate::api::encoding::cbor::to_cbor(&v)),
        ]
    }

    fn headers(media: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Ok(v) = http::HeaderValue::from_str(media) {
            h.insert(header::CONTENT_TYPE, v);
        }
        h
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

        /// Any body of any content type: a value or a 400/415, never a panic
        /// or a stack overflow.
        #[test]
        fn prop_decode_body_never_panics(media in prop::sample::select(MEDIA), body in body()) {
            if let Err(e) = decode_body(&headers(media), &body, "W") {
                prop_assert!(e.code == 400 || e.code == 415, "{}", e.code);
            }
            for media in ["application/apply-patch+yaml", "application/apply-patch+cbor"] {
                if let Err(e) = decode_apply_config(media, &body) {
                    prop_assert_eq!(e.code, 400);
                }
            }
        }
    }

    /// 10,000 levels of nesting in every body format are refused.
    #[test]
    fn deeply_nested_bodies_are_refused() {
        let n = 10_000;
        let json = format!("{}{}", "[".repeat(n), "]".repeat(n));
        let flow = format!("{}{}", "{a: ".repeat(n), "}".repeat(n));
        let block = format!("{}x", "- ".repeat(n));
        // Each level one space deeper: 1,000 levels are already 500 kB.
        let indented: String = (0..1_000)
            .map(|i| format!("{}a:\n", " ".repeat(i)))
            .collect();
        let mut cbor = vec![0x81; n];
        cbor.push(0);
        for (media, body) in [
            ("application/json", json.as_bytes()),
            ("application/yaml", json.as_bytes()),
            ("application/yaml", flow.as_bytes()),
            ("application/yaml", block.as_bytes()),
            ("application/yaml", indented.as_bytes()),
            ("application/cbor", &cbor),
        ] {
            let e = decode_body(&headers(media), body, "W").expect_err(media);
            assert_eq!(e.code, 400, "{media}");
        }
        for body in [json.as_bytes(), flow.as_bytes(), block.as_bytes()] {
            let e = decode_apply_config("application/apply-patch+yaml", body).expect_err("deep");
            assert_eq!(e.code, 400);
        }
    }

    /// An alias bomb (9⁹ leaves) is refused by the YAML budget, not expanded.
    #[test]
    fn yaml_alias_bomb_is_refused() {
        let mut doc = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x]\n");
        for i in 1..9 {
            let p = i - 1;
            doc.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        let h = headers("application/yaml");
        assert_eq!(
            decode_body(&h, doc.as_bytes(), "W").map_err(|e| e.code),
            Err(400)
        );
    }
}
