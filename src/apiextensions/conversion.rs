//! Conversion webhooks (`spec.conversion.strategy: Webhook`): objects moved
//! between versions are sent to the definition's webhook in a
//! `ConversionReview` (`apiextensions.k8s.io/v1`, or `v1beta1` when that is
//! all the webhook accepts), and its answer is checked as kube checks it.
//!
//! Conversion is asynchronous on every read and write path: nothing waits
//! for a webhook on a runtime worker or under a lock. Many objects (a list,
//! a watch's initial events, a commit's events) go in batches, each
//! (object revision, version) is converted once and cached, and the watch
//! cache shares each event's conversion among its watchers
//! (`watch::WatchEvent::converted`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceConversion;
use serde_json::{json, Value};

/// kube's conversion webhook timeout.
const TIMEOUT: Duration = Duration::from_secs(30);
/// Objects in one ConversionReview at most (kube sends a list whole; a
/// bound keeps each review, and the answer it brings, small).
pub const BATCH_OBJECTS: usize = 100;
/// Bytes of objects in one ConversionReview at most (an object larger than
/// this goes alone).
pub const BATCH_BYTES: usize = 2 * 1024 * 1024;
/// Largest webhook answer read, as for admission webhooks.
pub const MAX_RESPONSE_BYTES: usize = crate::webhook_tls::MAX_ANSWER_BYTES;
/// Converted objects kept, shared by every reader of one version.
const CACHE_ENTRIES: usize = 8192;

type HttpsClient = Client<crate::webhook_tls::Connector, Full<Bytes>>;

pub struct Webhook {
    url: String,
    /// `host:port` dialled, as Go's errors name it.
    dial: String,
    review_version: &'static str,
    client: HttpsClient,
    cache: Mutex<HashMap<(String, String, String), Value>>,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook").field("url", &self.url).finish()
    }
}

impl Webhook {
    /// The webhook of a definition's `spec.conversion`, or why it cannot be used.
    pub fn from_spec(conv: &CustomResourceConversion) -> Result<Self, String> {
        let hook = conv.webhook.as_ref().ok_or(
            "spec.conversion.webhook: Required value: required when strategy is set to Webhook",
        )?;
        let versions = &hook.conversion_review_versions;
        let review_version = if versions.iter().any(|v| v == "v1") {
            "v1"
        } else if versions.iter().any(|v| v == "v1beta1") {
            "v1beta1"
        } else {
            return Err("spec.conversion.webhook.conversionReviewVersions: Unsupported value: must include at least one of v1, v1beta1".into());
        };
        let cc = hook
            .client_config
            .as_ref()
            .ok_or("spec.conversion.webhook.clientConfig: Required value")?;
        let url = match (&cc.url, &cc.service) {
            (Some(u), None) => u.clone(),
            (None, Some(s)) => format!(
                "https://{}.{}.svc:{}{}",
                s.name,
                s.namespace,
                s.port.unwrap_or(443),
                s.path.as_deref().unwrap_or("")
            ),
            _ => {
                return Err(
                    "spec.conversion.webhook.clientConfig: Required value: exactly one of url or service is required".into(),
                )
            }
        };
        let uri: http::Uri = url
            .parse()
            .map_err(|e| format!("spec.conversion.webhook.clientConfig.url: Invalid value: {e}"))?;
        let ca: &[u8] = cc
            .ca_bundle
            .as_ref()
            .map(|c| c.0.as_slice())
            .unwrap_or_default();
        let connector = crate::webhook_tls::connector(ca, None, TIMEOUT)
            .map_err(|e| format!("spec.conversion.webhook.clientConfig: {e}"))?;
        // Go's client names the dialled address in connection errors.
        let dial = format!(
            "{}:{}",
            uri.host().unwrap_or_default(),
            uri.port_u16().unwrap_or(443)
        );
        Ok(Self {
            url,
            dial,
            review_version,
            client: Client::builder(TokioExecutor::new()).build(connector),
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// Converts `objs` to `desired` (`group/version`): objects already there
    /// come back as they are, converted ones from the cache, and the rest go
    /// to the webhook in ConversionReviews of at most [`BATCH_OBJECTS`]
    /// objects and [`BATCH_BYTES`] bytes, one after the other, each bounded
    /// by kube's webhook timeout (the request's deadline bounds them all).
    /// Nothing is locked across a call.
    pub async fn convert_all(&self, objs: &[&Value], desired: &str) -> Result<Vec<Value>, String> {
        let mut out: Vec<Option<Value>> = vec![None; objs.len()];
        // Indices still to send, with their cache keys.
        let mut missing: Vec<(usize, Option<Key>)> = Vec::new();
        {
            let cache = self.lock();
            for (i, o) in objs.iter().enumerate() {
                if str_at(o, "/apiVersion") == desired {
                    out[i] = Some((*o).clone());
                    continue;
                }
                let key = cache_key(o, desired);
                match key.as_ref().and_then(|k| cache.get(k)) {
                    Some(hit) => out[i] = Some(hit.clone()),
                    None => missing.push((i, key)),
                }
            }
        }
        let mut rest = missing.as_slice();
        while !rest.is_empty() {
            let mut batch: Vec<&Value> = Vec::new();
            let mut bodies: Vec<Vec<u8>> = Vec::new();
            let mut bytes = 0;
            for (i, _) in rest {
                let body = serde_json::to_vec(objs[*i]).map_err(|e| e.to_string())?;
                if !batch.is_empty()
                    && (batch.len() >= BATCH_OBJECTS || bytes + body.len() > BATCH_BYTES)
                {
                    break;
                }
                bytes += body.len();
                bodies.push(body);
                batch.push(objs[*i]);
            }
            let converted = self.review(&batch, &bodies, desired).await?;
            let (sent, later) = rest.split_at(batch.len());
            let mut cache = self.lock();
            if cache.len() + converted.len() > CACHE_ENTRIES {
                cache.clear();
            }
            for ((i, key), value) in sent.iter().zip(converted) {
                if let Some(key) = key {
                    cache.insert(key.clone(), value.clone());
                }
                out[*i] = Some(value);
            }
            rest = later;
        }
        Ok(out.into_iter().flatten().collect())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Value>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Converts `objs` to `desired` from synchronous code, without the
    /// cache: the field manager (synchronous, inside server-side apply)
    /// converts objects not yet stored, which carry the uid and
    /// resourceVersion of the stored revision they replace. The call leaves
    /// its worker with `block_in_place` and holds no lock, so the runtime's
    /// other workers keep driving every task, the webhook's I/O included.
    pub fn convert_many_uncached_blocking(
        &self,
        objs: &[Value],
        desired: &str,
    ) -> Result<Vec<Value>, String> {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return Err("no runtime to call the conversion webhook from".into());
        };
        if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread {
            return Err("the conversion webhook cannot be called on this runtime".into());
        }
        tokio::task::block_in_place(|| handle.block_on(self.convert_many(objs, desired)))
    }

    /// One ConversionReview for one object, checked as kube checks it.
    pub async fn convert(&self, obj: &Value, desired: &str) -> Result<Value, String> {
        let mut out = self
            .convert_many(std::slice::from_ref(obj), desired)
            .await?;
        Ok(out.pop().unwrap_or_default())
    }

    /// [`Webhook::convert_all`] without the cache, each object sent.
    pub async fn convert_many(&self, objs: &[Value], desired: &str) -> Result<Vec<Value>, String> {
        let mut outs = Vec::with_capacity(objs.len());
        let mut rest = objs;
        while !rest.is_empty() {
            let mut bodies: Vec<Vec<u8>> = Vec::new();
            let mut bytes = 0;
            for o in rest {
                let body = serde_json::to_vec(o).map_err(|e| e.to_string())?;
                if !bodies.is_empty()
                    && (bodies.len() >= BATCH_OBJECTS || bytes + body.len() > BATCH_BYTES)
                {
                    break;
                }
                bytes += body.len();
                bodies.push(body);
            }
            let (batch, later) = rest.split_at(bodies.len());
            let batch: Vec<&Value> = batch.iter().collect();
            outs.extend(self.review(&batch, &bodies, desired).await?);
            rest = later;
        }
        Ok(outs)
    }

    /// One ConversionReview for `objs` (of one kind and version; `bodies`
    /// their JSON), checked as kube checks it: every object back, in order,
    /// in `desired`, its kind kept and its metadata changed only in labels
    /// and annotations. The answer is read up to [`MAX_RESPONSE_BYTES`].
    async fn review(
        &self,
        objs: &[&Value],
        bodies: &[Vec<u8>],
        desired: &str,
    ) -> Result<Vec<Value>, String> {
        let Some(first) = objs.first() else {
            return Ok(Vec::new());
        };
        let gvk = format!(
            "{}, Kind={}",
            str_at(first, "/apiVersion"),
            str_at(first, "/kind")
        );
        let uid = uuid::Uuid::new_v4().to_string();
        // In a traced request: kube's span for the call, and the POST's
        // (otelhttp's), whose context the webhook receives as `traceparent`.
        let span = crate::traces::Span::child_with(
            "Call conversion webhook",
            opentelemetry::trace::SpanKind::Internal,
            || {
                use opentelemetry::KeyValue;
                vec![
                    KeyValue::new("kind", gvk.clone()),
                    KeyValue::new("desired-api-version", desired.to_string()),
                    KeyValue::new("object-count", objs.len() as i64),
                    KeyValue::new("UID", uid.clone()),
                ]
            },
        );
        let post = span.as_ref().map(|s| {
            s.start_child(
                "HTTP POST",
                opentelemetry::trace::SpanKind::Client,
                vec![
                    opentelemetry::KeyValue::new("http.request.method", "POST"),
                    opentelemetry::KeyValue::new("url.full", self.url.clone()),
                ],
            )
        });
        let converted = self
            .review_with(objs, bodies, desired, &gvk, &uid, post.as_ref())
            .await;
        if let (Some(span), Err(e)) = (&span, &converted) {
            span.fail(e.clone());
        }
        converted
    }

    async fn review_with(
        &self,
        objs: &[&Value],
        bodies: &[Vec<u8>],
        desired: &str,
        gvk: &str,
        uid: &str,
        post: Option<&crate::traces::Span>,
    ) -> Result<Vec<Value>, String> {
        let failed = |e: String| format!("conversion webhook for {gvk} failed: {e}");
        // The objects' JSON is joined into the review as is: each object was
        // encoded once already to size the batch.
        let mut body = format!(
            r#"{{"kind":"ConversionReview","apiVersion":"apiextensions.k8s.io/{}","request":{{"uid":{},"desiredAPIVersion":{},"objects":["#,
            self.review_version,
            Value::from(uid),
            Value::from(desired),
        )
        .into_bytes();
        let total: usize = bodies.iter().map(|b| b.len() + 1).sum();
        body.reserve(total + 3);
        for (i, b) in bodies.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(b);
        }
        body.extend_from_slice(b"]}}");
        let mut req = http::Request::post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| failed(e.to_string()))?;
        match post {
            Some(s) => s.inject(req.headers_mut()),
            None => crate::traces::inject(req.headers_mut()),
        }
        let resp = tokio::time::timeout(TIMEOUT, self.client.request(req))
            .await
            .map_err(|_| failed(format!("Post {:?}: context deadline exceeded", self.url)))?
            .map_err(|e| {
                failed(format!(
                    "Post {:?}: {}",
                    self.url,
                    crate::webhook_tls::describe(&e, &self.dial)
                ))
            })?;
        // Bounded as admission webhooks' answers are: a webhook cannot make
        // the server hold an answer of any size.
        let bytes = tokio::time::timeout(
            TIMEOUT,
            http_body_util::Limited::new(resp.into_body(), MAX_RESPONSE_BYTES).collect(),
        )
        .await
        .map_err(|_| failed(format!("Post {:?}: context deadline exceeded", self.url)))?
        .map_err(|e| failed(format!("Post {:?}: {e}", self.url)))?
        .to_bytes();
        let answer: Value = serde_json::from_slice(&bytes).map_err(|e| failed(e.to_string()))?;
        let response = answer
            .get("response")
            .filter(|r| !r.is_null())
            .ok_or_else(|| failed("no response provided".into()))?;
        let got_uid = str_at(response, "/uid");
        if got_uid != uid {
            return Err(failed(format!(
                "expected response.uid={uid:?}, got {got_uid:?}"
            )));
        }
        let status = str_at(response, "/result/status");
        if status != "Success" {
            let message = str_at(response, "/result/message");
            return Err(failed(if message.is_empty() {
                format!("response.result.status was '{status}', not 'Success'")
            } else {
                message.to_string()
            }));
        }
        let converted = response
            .get("convertedObjects")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if converted.len() != objs.len() {
            return Err(format!(
                "conversion webhook for {gvk} returned {} objects, expected {}",
                converted.len(),
                objs.len()
            ));
        }
        let mut outs = Vec::with_capacity(objs.len());
        for (i, (obj, mut out)) in objs.iter().copied().zip(converted).enumerate() {
            let invalid = |e: String| {
                format!(
                    "conversion webhook for {gvk} returned invalid converted object at index {i}: {e}"
                )
            };
            let (got_av, got_kind) = (str_at(&out, "/apiVersion"), str_at(&out, "/kind"));
            if got_av != desired {
                return Err(invalid(format!(
                    "invalid groupVersion (expected {desired}, received {got_av})"
                )));
            }
            if got_kind != str_at(obj, "/kind") {
                return Err(invalid(format!(
                    "invalid kind (expected {}, received {got_kind})",
                    str_at(obj, "/kind")
                )));
            }
            restore_metadata(obj, &mut out).map_err(|e| {
                format!(
                    "conversion webhook for {gvk} returned invalid metadata in object at index {i}: {e}"
                )
            })?;
            outs.push(out);
        }
        Ok(outs)
    }
}

/// A converted object is remembered by uid, resourceVersion and version.
type Key = (String, String, String);

fn cache_key(obj: &Value, desired: &str) -> Option<Key> {
    let (uid, rv) = (
        str_at(obj, "/metadata/uid"),
        str_at(obj, "/metadata/resourceVersion"),
    );
    (!uid.is_empty() && !rv.is_empty())
        .then(|| (uid.to_string(), rv.to_string(), desired.to_string()))
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// kube keeps the original metadata but for labels and annotations, which a
/// webhook may change; name, namespace and uid must not change.
fn restore_metadata(original: &Value, converted: &mut Value) -> Result<(), String> {
    for (field, what) in [("name", "name"), ("namespace", "namespace"), ("uid", "UID")] {
        let (a, b) = (
            str_at(original, &format!("/metadata/{field}")),
            str_at(converted, &format!("/metadata/{field}")),
        );
        if a != b {
            return Err(format!("must have the same {what}: {a} != {b}"));
        }
    }
    let mut meta = original
        .get("metadata")
        .cloned()
        .unwrap_or_else(|| json!({}));
    for field in ["labels", "annotations"] {
        match converted.pointer(&format!("/metadata/{field}")) {
            Some(Value::Object(m)) => {
                if let Some((k, _)) = m.iter().find(|(_, v)| !v.is_string()) {
                    return Err(format!("metadata.{field}[{k}] must be a string"));
                }
                meta[field] = Value::Object(m.clone());
            }
            Some(Value::Null) | None => {
                if let Some(m) = meta.as_object_mut() {
                    m.remove(field);
                }
            }
            Some(_) => return Err(format!("invalid metadata.{field} in converted object")),
        }
    }
    converted["metadata"] = meta;
    Ok(())
}
