//! Request info: what a path and method address, as a pure function of them
//! (kube's RequestInfoFactory).

use http::Method;

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
    NotFound,
}

impl Route {
    /// A watch: long-running, with its own `timeoutSeconds`.
    pub fn is_watch(&self) -> bool {
        matches!(self, Route::Resource(r) if r.verb == Some(Verb::Watch))
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

impl RequestInfo {
    pub fn parse(method: &Method, uri: &http::Uri) -> Self {
        let path = percent_encoding::percent_decode_str(uri.path())
            .decode_utf8_lossy()
            .into_owned();
        let route = route(method, &path, uri.query().unwrap_or(""));
        RequestInfo { path, route }
    }

    /// The request's info: the one the filters stored, else parsed now.
    pub fn of(method: &Method, uri: &http::Uri, extensions: &http::Extensions) -> Self {
        extensions
            .get::<RequestInfo>()
            .cloned()
            .unwrap_or_else(|| Self::parse(method, uri))
    }
}

fn is_truthy(v: &str) -> bool {
    matches!(v, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

/// Parses a request path (already percent-decoded segments) into a route.
pub fn route(method: &Method, path: &str, query: &str) -> Route {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
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
        ["openapi", "v2"] => Route::OpenApiV2,
        ["openapi", "v3"] => Route::OpenApiV3Root,
        ["openapi", "v3", "apis", g, v] => {
            Route::OpenApiV3GroupVersion((*g).to_string(), (*v).to_string())
        }
        _ => Route::NotFound,
    }
}

fn resource_route(method: &Method, g: &str, v: &str, rest: &[&str], query: &str) -> Route {
    let (legacy_watch, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        _ => (false, rest),
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_string()), rest),
        _ => (None, rest),
    };
    let (resource, name, subresource) = match rest {
        [r] => (*r, None, None),
        [r, n] => (*r, Some((*n).to_string()), None),
        [r, n, s] => (*r, Some((*n).to_string()), Some((*s).to_string())),
        _ => return Route::NotFound,
    };
    let watch_param =
        form_urlencoded::parse(query.as_bytes()).any(|(k, v)| k == "watch" && is_truthy(&v));
    let watch = legacy_watch || watch_param;
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
    Route::Resource(ResourceRequest {
        group: g.to_string(),
        version: v.to_string(),
        namespace,
        resource: resource.to_string(),
        name,
        subresource,
        legacy_watch,
        verb,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
