//! Conversion webhooks (`spec.conversion.strategy: Webhook`): objects moved
//! between versions are sent to the definition's webhook in a
//! `ConversionReview` (`apiextensions.k8s.io/v1`, or `v1beta1` when that is
//! all the webhook accepts), and its answer is checked as kube checks it.
//!
//! Conversion is called from the synchronous encoders of every read path;
//! the call leaves its worker thread with `block_in_place` so the runtime
//! keeps serving, and each (object revision, version) is converted once and
//! cached, so every watcher of one version shares one conversion.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceConversion;
use kube::client::ConfigExt;
use serde_json::{json, Value};

/// kube's conversion webhook timeout.
const TIMEOUT: Duration = Duration::from_secs(30);
/// Converted objects kept, shared by every reader of one version.
const CACHE_ENTRIES: usize = 8192;

type HttpsClient = Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
>;

pub struct Webhook {
    url: String,
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
        let mut config = kube::Config::new(uri);
        if let Some(ca) = &cc.ca_bundle {
            config.root_cert = Some(pem_certs(&ca.0));
        }
        config.read_timeout = Some(TIMEOUT);
        config.connect_timeout = Some(TIMEOUT);
        let connector = config
            .rustls_https_connector()
            .map_err(|e| format!("spec.conversion.webhook.clientConfig: {e}"))?;
        Ok(Self {
            url,
            review_version,
            client: Client::builder(TokioExecutor::new()).build(connector),
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// Converts `obj` to `desired` (`group/version`) from synchronous code.
    pub fn convert_blocking(&self, obj: &Value, desired: &str) -> Result<Value, String> {
        let key = cache_key(obj, desired);
        if let Some(hit) = key.as_ref().and_then(|k| self.lock().get(k).cloned()) {
            return Ok(hit);
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return Err("no runtime to call the conversion webhook from".into());
        };
        let converted = match handle.runtime_flavor() {
            tokio::runtime::RuntimeFlavor::CurrentThread => {
                return Err("the conversion webhook cannot be called on this runtime".into())
            }
            _ => tokio::task::block_in_place(|| handle.block_on(self.convert(obj, desired)))?,
        };
        if let Some(key) = key {
            let mut cache = self.lock();
            if cache.len() >= CACHE_ENTRIES {
                cache.clear();
            }
            cache.insert(key, converted.clone());
        }
        Ok(converted)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Value>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Converts the objects of one list to `desired` in one ConversionReview,
    /// as kube sends a list (each object converted alone would be one call
    /// per object), and remembers each result for the per-object path.
    /// Objects already converted, or already in `desired`, are not sent.
    pub fn prefetch_blocking(&self, objs: &[&Value], desired: &str) -> Result<(), String> {
        let missing: Vec<(Key, Value)> = {
            let cache = self.lock();
            objs.iter()
                .filter(|o| str_at(o, "/apiVersion") != desired)
                .filter_map(|o| {
                    let key = cache_key(o, desired)?;
                    (!cache.contains_key(&key)).then(|| (key, (*o).clone()))
                })
                .collect()
        };
        if missing.len() < 2 {
            return Ok(());
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return Err("no runtime to call the conversion webhook from".into());
        };
        if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread {
            return Err("the conversion webhook cannot be called on this runtime".into());
        }
        let objects: Vec<Value> = missing.iter().map(|(_, o)| o.clone()).collect();
        let converted =
            tokio::task::block_in_place(|| handle.block_on(self.convert_many(&objects, desired)))?;
        let mut cache = self.lock();
        if cache.len() + converted.len() > CACHE_ENTRIES {
            cache.clear();
        }
        for ((key, _), out) in missing.into_iter().zip(converted) {
            cache.insert(key, out);
        }
        Ok(())
    }

    /// Converts `objs` to `desired` in one ConversionReview from synchronous
    /// code, without the cache: the field manager converts objects not yet
    /// stored, which carry the uid and resourceVersion of the stored revision
    /// they replace.
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

    /// One ConversionReview for `objs` (of one kind and version), checked as
    /// kube checks it: every object back, in order, in `desired`, its kind
    /// kept and its metadata changed only in labels and annotations.
    pub async fn convert_many(&self, objs: &[Value], desired: &str) -> Result<Vec<Value>, String> {
        let Some(first) = objs.first() else {
            return Ok(Vec::new());
        };
        let gvk = format!(
            "{}, Kind={}",
            str_at(first, "/apiVersion"),
            str_at(first, "/kind")
        );
        let failed = |e: String| format!("conversion webhook for {gvk} failed: {e}");
        let uid = uuid::Uuid::new_v4().to_string();
        let review = json!({
            "apiVersion": format!("apiextensions.k8s.io/{}", self.review_version),
            "kind": "ConversionReview",
            "request": {"uid": uid, "desiredAPIVersion": desired, "objects": objs},
        });
        let body = serde_json::to_vec(&review).map_err(|e| failed(e.to_string()))?;
        let req = http::Request::post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| failed(e.to_string()))?;
        let resp = tokio::time::timeout(TIMEOUT, self.client.request(req))
            .await
            .map_err(|_| failed(format!("Post {:?}: context deadline exceeded", self.url)))?
            .map_err(|e| failed(format!("Post {:?}: {e}", self.url)))?;
        let bytes = tokio::time::timeout(TIMEOUT, resp.into_body().collect())
            .await
            .map_err(|_| failed("context deadline exceeded".into()))?
            .map_err(|e| failed(e.to_string()))?
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
        for (i, (obj, mut out)) in objs.iter().zip(converted).enumerate() {
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

/// The certificates of a PEM bundle, DER-encoded.
fn pem_certs(pem: &[u8]) -> Vec<Vec<u8>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .map(|c| c.to_vec())
        .collect()
}
