//! Request info: what a path and method address, as a pure function of them
//! (kube's RequestInfoFactory).

use http::Method;

use crate::object::meta::path_segment_errors;
use crate::registry::selector::FieldSelector;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `/api`
    LegacyRoot,
    /// `/api/v1`: kshard serves no core resources.
    LegacyV1,
    /// `/apis`
    Apis,
    /// `/apis/G`
    Group(String),
    /// `/apis/G/V`
    GroupVersion(String, String),
    Resource(ResourceRequest),
    Version,
    Health(Health),
    OpenApiV2,
    OpenApiV3Root,
    OpenApiV3GroupVersion(String, String),
    /// [`SNAPSHOT_PATH`]: kshard's own, a consistent snapshot of the whole
    /// store streamed to an administrator (`crate::snapshot`).
    Snapshot,
    NotFound,
}

/// Where `kshard snapshot save` takes a snapshot: a non-resource path, so
/// a host's RBAC grants it as `nonResourceURLs` with the verb `get`.
pub const SNAPSHOT_PATH: &str = "/kshard/snapshot";

impl Route {
    /// A watch: long-running, with its own `timeoutSeconds`.
    pub fn is_watch(&self) -> bool {
        matches!(self, Route::Resource(r) if r.verb == Some(Verb::Watch))
    }

    /// Long-running but not a watch (kube's exec and proxy; here the
    /// snapshot stream): no request deadline, and flow control only
    /// classifies it, as kube's does.
    pub fn is_long_running_non_watch(&self) -> bool {
        matches!(self, Route::Snapshot)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Livez,
    Readyz,
    Healthz,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceRequest {
    pub group: String,
    pub version: String,
    /// `None` for cluster-scoped paths and all-namespace lists.
    pub namespace: Option<String>,
    pub resource: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
    /// Reached through the legacy `/watch/` prefix.
    pub legacy_watch: bool,
    pub verb: Option<Verb>,
    /// The name a list or watch selects with `fieldSelector=metadata.name=`,
    /// for authorization only.
    pub selected_name: Option<String>,
}

/// A request's path, percent-decoded once, and what it addresses. The filters
/// put it in the request's extensions before anything reads the path, and
/// authentication, authorization, flow control, audit and the handler all use
/// this one value, so no stage can see a different resource, subresource or
/// namespace than another (e.g. `w1%2Fstatus` is the status subresource for
/// every stage, as in kube-apiserver, which routes on the decoded path too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfo {
    /// The decoded path (`%2F` is `/`).
    pub path: String,
    pub route: Route,
}

/// A request as kube's authorizer, flow control and audit name it
/// (k8s.io/apiserver's `RequestInfo` fields): for a resource request its
/// kube verb, group, version, resource, subresource, namespace and name;
/// otherwise the lowercase HTTP method and the path.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KubeAttributes {
    pub is_resource: bool,
    pub verb: String,
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    pub path: String,
}

impl RequestInfo {
    /// The request's kube attributes.
    pub fn attributes(&self, method: &Method) -> KubeAttributes {
        let mut a = KubeAttributes {
            verb: method.as_str().to_ascii_lowercase(),
            path: self.path.clone(),
            ..Default::default()
        };
        if let Route::Resource(r) = &self.route {
            a.is_resource = true;
            if let Some(v) = r.verb {
                a.verb = v.as_str().to_string();
            }
            a.group = r.group.clone();
            a.version = r.version.clone();
            a.resource = r.resource.clone();
            a.subresource = r.subresource.clone().unwrap_or_default();
            a.namespace = r.namespace.clone().unwrap_or_default();
            a.name = r
                .name
                .clone()
                .or_else(|| r.selected_name.clone())
                .unwrap_or_default();
        }
        a
    }

    pub fn parse(method: &Method, uri: &http::Uri) -> Self {
        let path = percent_encoding::percent_decode_str(uri.path())
            .decode_utf8_lossy()
            .into_owned();
        let route = route(method, &path, uri.query().unwrap_or(""));
        RequestInfo { path, route }
    }

    /// The request's info: the one the filters stored (shared, not copied
    /// per layer), else parsed now.
    pub fn of(
        method: &Method,
        uri: &http::Uri,
        extensions: &http::Extensions,
    ) -> std::sync::Arc<Self> {
        extensions
            .get::<std::sync::Arc<RequestInfo>>()
            .cloned()
            .unwrap_or_else(|| std::sync::Arc::new(Self::parse(method, uri)))
    }

    /// The info, owned, for the handler: taken from the extensions (copied
    /// only while a layer still holds it), else parsed now.
    pub fn take(method: &Method, uri: &http::Uri, extensions: &mut http::Extensions) -> Self {
        match extensions.remove::<std::sync::Arc<RequestInfo>>() {
            Some(info) => std::sync::Arc::unwrap_or_clone(info),
            None => Self::parse(method, uri),
        }
    }
}

/// kube's conversion of a query parameter to a bool: only `0` and `false`
/// (any case) are false; any other value, even an empty one, is true.
pub fn query_bool(v: &str) -> bool {
    !(v == "0" || v.eq_ignore_ascii_case("false"))
}

/// The first value of query parameter `key` (kube reads the first).
fn first_query_value(query: &str, key: &str) -> Option<String> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.into_owned())
}

/// Parses a decoded request path into a route, segment for segment as kube's
/// RequestInfoFactory does: only leading and trailing `/` are trimmed, an
/// empty inner segment stays an (empty) segment, `.` and `..` are ordinary
/// segments, and segments after the subresource are ignored.
pub fn route(method: &Method, path: &str, query: &str) -> Route {
    let trimmed = path.trim_matches('/');
    let segs: Vec<&str> = if trimmed.is_empty() {
        Vec::new()
    } else {
        trimmed.split('/').collect()
    };
    match segs.as_slice() {
        ["api"] => Route::LegacyRoot,
        ["api", "v1", ..] => Route::LegacyV1,
        ["apis"] => Route::Apis,
        ["apis", g] => Route::Group((*g).to_string()),
        ["apis", g, v] => Route::GroupVersion((*g).to_string(), (*v).to_string()),
        ["apis", g, v, rest @ ..] => resource_route(method, g, v, rest, query),
        ["version"] => Route::Version,
        ["livez", ..] => Route::Health(Health::Livez),
        ["readyz", ..] => Route::Health(Health::Readyz),
        ["healthz", ..] => Route::Health(Health::Healthz),
        ["kshard", "snapshot"] => Route::Snapshot,
        ["openapi", "v2"] => Route::OpenApiV2,
        ["openapi", "v3"] => Route::OpenApiV3Root,
        ["openapi", "v3", "apis", g, v] => {
            Route::OpenApiV3GroupVersion((*g).to_string(), (*v).to_string())
        }
        _ => Route::NotFound,
    }
}

/// Subresources of a namespace itself (`namespaces/{ns}/status`), which kube
/// does not read as a resource inside the namespace.
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

fn resource_route(method: &Method, g: &str, v: &str, rest: &[&str], query: &str) -> Route {
    let (legacy_watch, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        _ => (false, rest),
    };
    let (namespace, parts) = match rest {
        ["namespaces", ns, inner @ ..] => {
            let inside = !inner.is_empty() && !NAMESPACE_SUBRESOURCES.contains(&inner[0]);
            // `namespaces//widgets`: an empty namespace is no namespace.
            let ns = (!ns.is_empty()).then(|| (*ns).to_string());
            (ns, if inside { inner } else { rest })
        }
        _ => (None, rest),
    };
    let Some(resource) = parts.first() else {
        return Route::NotFound;
    };
    let part = |i: usize| {
        parts
            .get(i)
            .filter(|s| !s.is_empty())
            .map(|s| (*s).to_string())
    };
    let (name, subresource) = (part(1), part(2));
    let watch = legacy_watch || first_query_value(query, "watch").is_some_and(|v| query_bool(&v));
    let verb = match *method {
        Method::GET | Method::HEAD => Some(match (&name, watch) {
            (_, true) => Verb::Watch,
            (Some(_), false) => Verb::Get,
            (None, false) => Verb::List,
        }),
        Method::POST if name.is_none() => Some(Verb::Create),
        Method::PUT if name.is_some() => Some(Verb::Update),
        Method::PATCH if name.is_some() => Some(Verb::Patch),
        Method::DELETE => Some(if name.is_some() {
            Verb::Delete
        } else {
            Verb::DeleteCollection
        }),
        _ => None,
    };
    // A list or watch of one name by field selector is authorized as that
    // name (kube's RequestInfo does the same), so per-object grants work.
    let selected_name = match (&name, verb) {
        (None, Some(Verb::List | Verb::Watch)) => first_query_value(query, "fieldSelector")
            .and_then(|s| FieldSelector::parse(&s).ok())
            .and_then(|f| f.required_value("metadata.name").map(str::to_string))
            .filter(|n| path_segment_errors(n).is_empty()),
        _ => None,
    };
    Route::Resource(ResourceRequest {
        group: g.to_string(),
        version: v.to_string(),
        namespace,
        resource: resource.to_string(),
        name,
        subresource,
        legacy_watch,
        verb,
        selected_name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What authorization, flow control and audit see: kube's verb and
    /// names for resource requests (a list selecting one name by field is
    /// that name, as kube's RequestInfo has it), the method and path
    /// otherwise.
    #[test]
    fn kube_attributes_name_the_request_as_kube_does() {
        let uri: http::Uri = "/apis/demo.kshard.dev/v1/namespaces/ns/widgets/w1/status"
            .parse()
            .expect("uri");
        let a = RequestInfo::parse(&Method::PATCH, &uri).attributes(&Method::PATCH);
        assert_eq!(
            a,
            KubeAttributes {
                is_resource: true,
                verb: "patch".into(),
                group: "demo.kshard.dev".into(),
                version: "v1".into(),
                resource: "widgets".into(),
                subresource: "status".into(),
                namespace: "ns".into(),
                name: "w1".into(),
                path: "/apis/demo.kshard.dev/v1/namespaces/ns/widgets/w1/status".into(),
            }
        );
        let uri: http::Uri =
            "/apis/demo.kshard.dev/v1/widgets?watch=1&fieldSelector=metadata.name%3Dw2"
                .parse()
                .expect("uri");
        let a = RequestInfo::parse(&Method::GET, &uri).attributes(&Method::GET);
        assert_eq!(
            (a.verb.as_str(), a.name.as_str(), a.namespace.as_str()),
            ("watch", "w2", "")
        );
        let uri: http::Uri = "/healthz/etcd".parse().expect("uri");
        let a = RequestInfo::parse(&Method::GET, &uri).attributes(&Method::GET);
        assert_eq!(
            (a.is_resource, a.verb.as_str(), a.path.as_str()),
            (false, "get", "/healthz/etcd")
        );
    }

    fn res(method: Method, path: &str, query: &str) -> ResourceRequest {
        match route(&method, path, query) {
            Route::Resource(r) => r,
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn parses_resource_paths_and_verbs() {
        let table = [
            (
                Method::GET,
                "/apis/g/v1/widgets",
                "",
                None,
                None,
                None,
                Verb::List,
            ),
            (
                Method::GET,
                "/apis/g/v1/namespaces/ns/widgets",
                "",
                Some("ns"),
                None,
                None,
                Verb::List,
            ),
            (
                Method::GET,
                "/apis/g/v1/namespaces/ns/widgets/a",
                "",
                Some("ns"),
                Some("a"),
                None,
                Verb::Get,
            ),
            (
                Method::PUT,
                "/apis/g/v1/namespaces/ns/widgets/a/status",
                "",
                Some("ns"),
                Some("a"),
                Some("status"),
                Verb::Update,
            ),
            (
                Method::GET,
                "/apis/g/v1/namespaces/ns/widgets",
                "watch=true",
                Some("ns"),
                None,
                None,
                Verb::Watch,
            ),
            (
                Method::GET,
                "/apis/g/v1/watch/namespaces/ns/widgets",
                "",
                Some("ns"),
                None,
                None,
                Verb::Watch,
            ),
            (
                Method::POST,
                "/apis/g/v1/namespaces/ns/widgets",
                "",
                Some("ns"),
                None,
                None,
                Verb::Create,
            ),
            (
                Method::DELETE,
                "/apis/g/v1/namespaces/ns/widgets",
                "",
                Some("ns"),
                None,
                None,
                Verb::DeleteCollection,
            ),
            (
                Method::DELETE,
                "/apis/g/v1/gadgets/x",
                "",
                None,
                Some("x"),
                None,
                Verb::Delete,
            ),
            (
                Method::PATCH,
                "/apis/g/v1/gadgets/x",
                "",
                None,
                Some("x"),
                None,
                Verb::Patch,
            ),
        ];
        for (m, path, q, ns, name, sub, verb) in table {
            let r = res(m, path, q);
            assert_eq!(r.namespace.as_deref(), ns, "{path}");
            assert_eq!(r.name.as_deref(), name, "{path}");
            assert_eq!(r.subresource.as_deref(), sub, "{path}");
            assert_eq!(r.verb, Some(verb), "{path}");
        }
        assert!(res(Method::GET, "/apis/g/v1/watch/widgets", "").legacy_watch);
    }

    #[test]
    fn parses_non_resource_paths() {
        assert_eq!(route(&Method::GET, "/apis", ""), Route::Apis);
        assert_eq!(route(&Method::GET, "/apis/g", ""), Route::Group("g".into()));
        assert_eq!(
            route(&Method::GET, "/readyz", ""),
            Route::Health(Health::Readyz)
        );
        assert_eq!(
            route(&Method::GET, "/openapi/v3/apis/g/v1", ""),
            Route::OpenApiV3GroupVersion("g".into(), "v1".into())
        );
        assert_eq!(route(&Method::GET, "/nope", ""), Route::NotFound);
    }

    /// kube's RequestInfo for odd paths (decoded, as the server sees them).
    #[test]
    fn odd_paths_parse_as_kube_parses_them() {
        let p = "/apis/g/v1/namespaces/ns1/widgets";
        // `w1%2Fstatus` decodes to `w1/status`: the status subresource.
        let r = res(Method::PUT, &format!("{p}/w1/status"), "");
        assert_eq!(
            (r.name.as_deref(), r.subresource.as_deref()),
            (Some("w1"), Some("status"))
        );
        // Segments after the subresource are ignored.
        for extra in ["/w1/status/..", "/w1/status/extra", "/w1/status/"] {
            let r = res(Method::PUT, &format!("{p}{extra}"), "");
            assert_eq!(r.subresource.as_deref(), Some("status"), "{extra}");
            assert_eq!(r.verb, Some(Verb::Update), "{extra}");
        }
        // `..` is an ordinary name segment.
        let r = res(Method::GET, &format!("{p}/../x"), "");
        assert_eq!(
            (r.name.as_deref(), r.subresource.as_deref()),
            (Some(".."), Some("x"))
        );
        // Trailing slash: the same list.
        let r = res(Method::GET, &format!("{p}/"), "");
        assert_eq!(
            (r.verb, r.namespace.as_deref()),
            (Some(Verb::List), Some("ns1"))
        );
        // An empty namespace is no namespace: a list across all of them.
        let r = res(Method::GET, "/apis/g/v1/namespaces//widgets", "");
        assert_eq!(
            (r.verb, r.namespace, r.resource.as_str()),
            (Some(Verb::List), None, "widgets")
        );
        // An empty segment after the version is an empty resource.
        let r = res(Method::GET, "/apis/g/v1//namespaces/ns1/widgets", "");
        assert_eq!(r.resource, "");
        assert_eq!(
            (r.name.as_deref(), r.subresource.as_deref()),
            (Some("namespaces"), Some("ns1"))
        );
        // An empty name segment is no name.
        let r = res(Method::GET, &format!("{p}//status"), "");
        assert_eq!((r.verb, r.name), (Some(Verb::List), None));
        // A namespace's own status is not a resource inside it.
        let r = res(Method::GET, "/apis/g/v1/namespaces/ns1/status", "");
        assert_eq!(
            (r.resource.as_str(), r.name.as_deref()),
            ("namespaces", Some("ns1"))
        );
        assert_eq!(r.subresource.as_deref(), Some("status"));
    }

    #[test]
    fn watch_parameter_and_selected_name_follow_kube() {
        let p = "/apis/g/v1/namespaces/ns1/widgets";
        for (q, verb) in [
            ("watch=true", Verb::Watch),
            ("watch=", Verb::Watch),
            ("watch=yes", Verb::Watch),
            ("watch=0", Verb::List),
            ("watch=FaLsE", Verb::List),
            ("watch=false&watch=true", Verb::List),
        ] {
            assert_eq!(res(Method::GET, p, q).verb, Some(verb), "{q}");
        }
        let one = res(Method::GET, p, "watch=1&fieldSelector=metadata.name%3Dw1");
        assert_eq!((one.name, one.selected_name.as_deref()), (None, Some("w1")));
        let bad = res(Method::GET, p, "fieldSelector=metadata.name%3D..");
        assert_eq!(bad.selected_name, None, "an invalid name selects nothing");
        let not_eq = res(Method::GET, p, "fieldSelector=metadata.name!%3Dw1");
        assert_eq!(not_eq.selected_name, None);
    }

    const SEGMENTS: &[&str] = &[
        "",
        "api",
        "apis",
        "v1",
        "g",
        "demo.kshard.dev",
        "namespaces",
        "ns",
        "watch",
        "widgets",
        "w1",
        "status",
        "scale",
        "finalize",
        "..",
        ".",
        "%2F",
        "%",
        "%C3%A9",
        "é",
        "livez",
        "readyz",
        "healthz",
        "version",
        "openapi",
        "v2",
        "v3",
    ];

    fn path() -> impl Strategy<Value = String> {
        let seg = || prop::sample::select(SEGMENTS);
        // `/apis/{g}/{v}` then resource-like segments, so most paths reach
        // the resource router (and its fieldSelector parsing).
        let resource = (seg(), seg(), prop::collection::vec(seg(), 0..7))
            .prop_map(|(g, v, rest)| format!("/apis/{g}/{v}/{}", rest.join("/")));
        prop_oneof![
            1 => any::<String>(),
            2 => prop::collection::vec(seg(), 0..10).prop_map(|s| format!("/{}", s.join("/"))),
            4 => resource,
            1 => (1..5000usize).prop_map(|n| "/".repeat(n)),
        ]
    }

    const METHODS: &[&str] = &[
        "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "X",
    ];

    proptest! {
        #![proptest_config(ProptestConfig { cases: 5000, ..ProptestConfig::default() })]

        /// Any method, path and query route somewhere (maybe NotFound).
        #[test]
        fn prop_route_never_panics(
            method in prop::sample::select(METHODS),
            path in path(),
            query in crate::fuzz::query(),
        ) {
            let method = Method::from_bytes(method.as_bytes()).unwrap_or(Method::GET);
            let _ = route(&method, &path, &query).is_watch();
            if let Ok(uri) = format!("{path}?{query}").parse::<http::Uri>() {
                let info = RequestInfo::parse(&method, &uri);
                let _ = info.route.is_watch();
            }
        }
    }
}
