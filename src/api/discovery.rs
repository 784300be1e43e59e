//! Discovery documents: legacy (`/api`, `/apis`, `/apis/G`, `/apis/G/V`) and
//! aggregated (apidiscovery.k8s.io v2 and v2beta1), built from the catalog.

use serde_json::{json, Value};
use sha2::{Digest, Sha512};

use super::review::Review;
use crate::registry::{Catalog, ResourceType};

const MAIN_VERBS: [&str; 8] = [
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "create",
    "update",
    "watch",
];
const SUB_VERBS: [&str; 3] = ["get", "patch", "update"];

pub const AGGREGATED_V2: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
/// The media types the legacy documents can be had in, as kube lists them
/// when an Accept header names none of them.
pub const LEGACY_TYPES: [&str; 3] = [
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
];

/// Whether an Accept header allows the legacy documents: a media range
/// without the parameters of another form (aggregated discovery, Table).
pub fn accepts_legacy(accept: Option<&str>) -> bool {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return true;
    };
    accept.split(',').any(|part| {
        let mut p = part.split(';').map(str::trim);
        let base = p.next().unwrap_or("");
        let plain = p.all(|param| {
            let key = param.split('=').next().unwrap_or("").trim();
            matches!(key, "q" | "charset" | "")
        });
        plain && (base == "*/*" || base == "application/*" || LEGACY_TYPES.contains(&base))
    })
}

/// Which aggregated discovery version an Accept header asks for, if any:
/// only v2, as kube 1.36 (v2beta1 is no longer served; a client asking for
/// it alone gets 406).
pub fn wants_aggregated(accept: Option<&str>) -> Option<&'static str> {
    let accept = accept?;
    for part in accept.split(',') {
        let p: Vec<&str> = part.split(';').map(str::trim).collect();
        let has = |x: &str| p.contains(&x);
        if p.first() == Some(&"application/json")
            && has("g=apidiscovery.k8s.io")
            && has("as=APIGroupDiscoveryList")
            && has("v=v2")
        {
            return Some("v2");
        }
    }
    None
}

pub fn legacy_root() -> Value {
    json!({"kind": "APIVersions", "versions": [], "serverAddressByClientCIDRs": []})
}

fn group_version(g: &str, v: &str) -> Value {
    json!({"groupVersion": format!("{g}/{v}"), "version": v})
}

fn group_doc(g: &crate::apiextensions::catalog::Group) -> Value {
    let versions: Vec<Value> = g
        .versions
        .iter()
        .map(|v| group_version(&g.name, v))
        .collect();
    json!({
        "name": g.name,
        "versions": versions,
        "preferredVersion": group_version(&g.name, &g.versions[0]),
    })
}

pub fn apis(catalog: &Catalog, reviews: &[Review]) -> Value {
    // Built-in groups come first, as kube lists them before custom ones.
    let groups: Vec<Value> = review_groups(reviews)
        .iter()
        .chain(catalog.groups().iter().filter(|g| !g.versions.is_empty()))
        .map(group_doc)
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub fn group(catalog: &Catalog, reviews: &[Review], name: &str) -> Option<Value> {
    let g = review_groups(reviews)
        .into_iter()
        .chain(catalog.groups())
        .find(|g| g.name == name && !g.versions.is_empty())?;
    let mut doc = group_doc(&g);
    if let Some(o) = doc.as_object_mut() {
        o.insert("kind".into(), json!("APIGroup"));
        o.insert("apiVersion".into(), json!("v1"));
    }
    Some(doc)
}

fn resource_entries(rt: &ResourceType, version: &str) -> Vec<Value> {
    let mut main = json!({
        "name": rt.plural,
        "singularName": rt.singular,
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": MAIN_VERBS,
        "storageVersionHash": rt.storage_version_hash(),
    });
    if let Some(o) = main.as_object_mut() {
        if !rt.short_names.is_empty() {
            o.insert("shortNames".into(), json!(rt.short_names));
        }
        if !rt.categories.is_empty() {
            o.insert("categories".into(), json!(rt.categories));
        }
    }
    let mut out = vec![main];
    if let Some(v) = rt.version(version) {
        if v.status_subresource {
            out.push(json!({
                "name": format!("{}/status", rt.plural), "singularName": "",
                "namespaced": rt.namespaced, "kind": rt.kind, "verbs": SUB_VERBS,
            }));
        }
        if v.scale.is_some() {
            out.push(json!({
                "name": format!("{}/scale", rt.plural), "singularName": "",
                "namespaced": rt.namespaced, "group": "autoscaling", "version": "v1",
                "kind": "Scale", "verbs": SUB_VERBS,
            }));
        }
    }
    out
}

/// The groups of the identity reviews kshard answers itself
/// (`super::review`; standalone only), each with its one version.
fn review_groups(reviews: &[Review]) -> Vec<crate::apiextensions::catalog::Group> {
    reviews
        .iter()
        .map(|r| crate::apiextensions::catalog::Group {
            name: r.group.to_string(),
            versions: vec!["v1".to_string()],
        })
        .collect()
}

pub fn group_version_resources(
    catalog: &Catalog,
    reviews: &[Review],
    g: &str,
    v: &str,
) -> Option<Value> {
    if let Some(r) = reviews.iter().find(|r| r.group == g && v == "v1") {
        return Some(json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": format!("{g}/{v}"),
            "resources": [{
                "name": r.resource, "singularName": r.singular, "namespaced": false,
                "kind": r.kind, "verbs": ["create"],
            }],
        }));
    }
    let resources = catalog.resources_in(g, v);
    if resources.is_empty() {
        return None;
    }
    let entries: Vec<Value> = resources
        .iter()
        .flat_map(|rt| resource_entries(rt, v))
        .collect();
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": format!("{g}/{v}"),
        "resources": entries,
    }))
}

fn aggregated_resource(rt: &ResourceType, version: &str) -> Value {
    let mut r = json!({
        "resource": rt.plural,
        "responseKind": {"group": rt.group, "version": version, "kind": rt.kind},
        "scope": if rt.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": rt.singular,
        "verbs": MAIN_VERBS,
    });
    let mut subs = Vec::new();
    if let Some(v) = rt.version(version) {
        if v.status_subresource {
            subs.push(json!({
                "subresource": "status",
                "responseKind": {"group": rt.group, "version": version, "kind": rt.kind},
                "verbs": SUB_VERBS,
            }));
        }
        if v.scale.is_some() {
            subs.push(json!({
                "subresource": "scale",
                "responseKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
                "verbs": SUB_VERBS,
            }));
        }
    }
    if let Some(o) = r.as_object_mut() {
        if !rt.short_names.is_empty() {
            o.insert("shortNames".into(), json!(rt.short_names));
        }
        if !rt.categories.is_empty() {
            o.insert("categories".into(), json!(rt.categories));
        }
        if !subs.is_empty() {
            o.insert("subresources".into(), Value::Array(subs));
        }
    }
    r
}

/// The aggregated discovery document for `/apis` (`legacy` = `/api`: empty).
pub fn aggregated(catalog: &Catalog, reviews: &[Review], version: &str, legacy: bool) -> Value {
    let items: Vec<Value> = if legacy {
        Vec::new()
    } else {
        // Built-in kinds name no group or version in their responseKind.
        let reviews = reviews.iter().map(|r| {
            json!({
                "metadata": {"name": r.group},
                "versions": [{
                    "version": "v1",
                    "resources": [{
                        "resource": r.resource,
                        "responseKind": {"group": "", "version": "", "kind": r.kind},
                        "scope": "Cluster",
                        "singularResource": r.singular,
                        "verbs": ["create"],
                    }],
                    "freshness": "Current",
                }],
            })
        });
        reviews
            .chain(
                catalog
                    .groups()
                    .iter()
                    .filter(|g| !g.versions.is_empty())
                    .map(|g| {
                        let versions: Vec<Value> = g
                    .versions
                    .iter()
                    .map(|v| {
                        let resources: Vec<Value> = catalog
                            .resources_in(&g.name, v)
                            .iter()
                            .map(|rt| aggregated_resource(rt, v))
                            .collect();
                        json!({"version": v, "resources": resources, "freshness": "Current"})
                    })
                    .collect();
                        json!({"metadata": {"name": g.name}, "versions": versions})
                    }),
            )
            .collect()
    };
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": format!("apidiscovery.k8s.io/{version}"),
        "metadata": {},
        "items": items,
    })
}

/// Quoted upper-case hex SHA-512 of the body, as kube's discovery ETag.
pub fn etag(body: &[u8]) -> String {
    let digest = Sha512::digest(body);
    let hex: String = digest.iter().map(|b| format!("{b:02X}")).collect();
    format!("\"{hex}\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognizes_aggregated_accept() {
        let kubectl = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert_eq!(wants_aggregated(Some(kubectl)), Some("v2"));
        assert_eq!(wants_aggregated(Some("application/json")), None);
        let v2beta1 = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
        assert_eq!(wants_aggregated(Some(v2beta1)), None);
        assert!(!accepts_legacy(Some(v2beta1)));
        assert!(accepts_legacy(Some(&format!("{v2beta1},application/json"))));
        assert!(accepts_legacy(None));
        assert!(accepts_legacy(Some("*/*;q=0.8")));
    }

    #[test]
    fn etag_is_quoted_upper_hex() {
        let e = etag(b"{}");
        assert_eq!(e.len(), 128 + 2);
        assert!(e
            .trim_matches('"')
            .chars()
            .all(|c| c.is_ascii_digit() || c.is_ascii_uppercase()));
    }
}
