//! Content negotiation for responses: JSON, YAML, Table and
//! PartialObjectMetadata, honouring q-values and falling back along the
//! client's list (protobuf is never served for custom resources).

use crate::status::ApiError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Json,
    Yaml,
    Cbor,
    /// `meta.k8s.io/<version>` PartialObjectMetadata(List) in the protobuf envelope.
    ProtoMeta(String),
    /// `meta.k8s.io/<version>` Table.
    Table(String),
    /// `meta.k8s.io/<version>` PartialObjectMetadata(List).
    PartialMeta(String),
}

pub const ACCEPTED: &[&str] = &[
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
    "application/cbor",
];

struct Range {
    media: String,
    as_: String,
    g: String,
    v: String,
    q: f32,
}

fn parse(accept: &str) -> Vec<Range> {
    let mut out: Vec<Range> = accept
        .split(',')
        .filter_map(|part| {
            let mut it = part.split(';').map(str::trim);
            let media = it.next()?.to_ascii_lowercase();
            if media.is_empty() {
                return None;
            }
            let mut r = Range {
                media,
                as_: String::new(),
                g: String::new(),
                v: String::new(),
                q: 1.0,
            };
            for p in it {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                let v = v.trim_matches('"').to_string();
                match k.trim() {
                    "as" => r.as_ = v,
                    "g" => r.g = v,
                    "v" => r.v = v,
                    // `NaN` parses as a float but is no q-value: unacceptable,
                    // like any other value that does not parse.
                    "q" => r.q = v.parse().ok().filter(|q: &f32| !q.is_nan()).unwrap_or(0.0),
                    _ => {}
                }
            }
            Some(r)
        })
        .collect();
    // Stable: equal q keeps the client's order. A total order: sort_by panics
    // on one that is not (as `partial_cmp` with NaN made equal was not).
    out.sort_by(|a, b| b.q.total_cmp(&a.q));
    out
}

/// Picks the response form. `allow_meta` is false where Table/PartialObjectMetadata
/// make no sense (discovery, Status-only endpoints).
pub fn negotiate(accept: Option<&str>, allow_meta: bool) -> Result<Output, ApiError> {
    pick(accept, allow_meta).map(|(out, _)| out)
}

/// Whether a response is one object or a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Object,
    List,
}

/// [`negotiate`] for a get or list: a metadata view of the other shape
/// (`as=PartialObjectMetadata` for a list, `…List` for one object) is kube's
/// 406, not a fallback to the next media type.
pub fn negotiate_for(accept: Option<&str>, shape: Shape) -> Result<Output, ApiError> {
    let (out, kind) = pick(accept, true)?;
    let wrong = match (kind, shape) {
        ("PartialObjectMetadata", Shape::List) => {
            "you requested PartialObjectMetadata, but the requested object is a list (*unstructured.UnstructuredList)"
        }
        ("PartialObjectMetadataList", Shape::Object) => {
            "you requested PartialObjectMetadataList, but the requested object is not a list (*unstructured.Unstructured)"
        }
        _ => return Ok(out),
    };
    Err(ApiError::not_acceptable_because(wrong))
}

/// The response form and the `as=` kind it was chosen for ("" for none).
fn pick(accept: Option<&str>, allow_meta: bool) -> Result<(Output, &'static str), ApiError> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Ok((Output::Json, ""));
    };
    let mut asked_meta_only = true;
    for r in parse(accept) {
        if r.q <= 0.0 {
            continue;
        }
        let json_like = matches!(
            r.media.as_str(),
            "application/json" | "*/*" | "application/*"
        );
        let yaml = r.media == "application/yaml";
        if r.media == "application/vnd.kubernetes.protobuf" {
            // Custom resources have no protobuf form; their metadata views do.
            let meta = matches!(
                r.as_.as_str(),
                "PartialObjectMetadata" | "PartialObjectMetadataList"
            );
            if allow_meta && meta && r.g == "meta.k8s.io" && (r.v == "v1" || r.v == "v1beta1") {
                return Ok((
                    Output::ProtoMeta(format!("meta.k8s.io/{}", r.v)),
                    meta_kind(&r.as_),
                ));
            }
            continue;
        }
        if r.media == "application/cbor" {
            if r.as_.is_empty() {
                return Ok((Output::Cbor, ""));
            }
            continue;
        }
        if !(json_like || yaml) {
            asked_meta_only = false;
            continue;
        }
        if r.as_.is_empty() {
            return Ok((if yaml { Output::Yaml } else { Output::Json }, ""));
        }
        if !allow_meta || r.g != "meta.k8s.io" || !(r.v == "v1" || r.v == "v1beta1") {
            continue;
        }
        let version = format!("meta.k8s.io/{}", r.v);
        match r.as_.as_str() {
            "Table" => return Ok((Output::Table(version), "")),
            "PartialObjectMetadata" | "PartialObjectMetadataList" => {
                return Ok((Output::PartialMeta(version), meta_kind(&r.as_)))
            }
            _ => {}
        }
    }
    let _ = asked_meta_only;
    Err(ApiError::not_acceptable(ACCEPTED))
}

/// The form of a built-in kind's answer (the identity reviews), which,
/// unlike a custom resource, has a protobuf form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuiltinOutput {
    Json,
    Yaml,
    Cbor,
    Protobuf,
}

/// The client's most preferred plain media type kshard writes a built-in
/// kind in; none is kube's 406.
pub fn negotiate_builtin(accept: Option<&str>) -> Result<BuiltinOutput, ApiError> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Ok(BuiltinOutput::Json);
    };
    for r in parse(accept) {
        if r.q <= 0.0 || !r.as_.is_empty() {
            continue;
        }
        match r.media.as_str() {
            "application/json" | "*/*" | "application/*" => return Ok(BuiltinOutput::Json),
            "application/yaml" => return Ok(BuiltinOutput::Yaml),
            "application/cbor" => return Ok(BuiltinOutput::Cbor),
            "application/vnd.kubernetes.protobuf" => return Ok(BuiltinOutput::Protobuf),
            _ => {}
        }
    }
    Err(ApiError::not_acceptable_representations(&[
        "application/json",
        "application/yaml",
        "application/vnd.kubernetes.protobuf",
        "application/cbor",
    ]))
}

/// How a Status error is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorMedia {
    Json,
    Yaml,
    Cbor,
    Protobuf,
}

/// The media type of an error body, as kube's `ErrorNegotiated` picks it:
/// the client's most preferred plain media type (views such as `as=Table`
/// are not offered for a Status), else JSON.
pub fn error_media(accept: Option<&str>) -> ErrorMedia {
    let Some(accept) = accept else {
        return ErrorMedia::Json;
    };
    for r in parse(accept) {
        if r.q <= 0.0 || !r.as_.is_empty() {
            continue;
        }
        match r.media.as_str() {
            "application/json" | "*/*" | "application/*" => return ErrorMedia::Json,
            "application/yaml" => return ErrorMedia::Yaml,
            "application/cbor" => return ErrorMedia::Cbor,
            "application/vnd.kubernetes.protobuf" => return ErrorMedia::Protobuf,
            _ => {}
        }
    }
    ErrorMedia::Json
}

fn meta_kind(as_: &str) -> &'static str {
    if as_ == "PartialObjectMetadataList" {
        "PartialObjectMetadataList"
    } else {
        "PartialObjectMetadata"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn picks_first_servable_type() {
        let kubectl = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(
            negotiate(Some(kubectl), true),
            Ok(Output::Table("meta.k8s.io/v1".into()))
        );
        assert_eq!(negotiate(Some(kubectl), false), Ok(Output::Json));
        assert_eq!(negotiate(None, true), Ok(Output::Json));
        assert_eq!(
            negotiate(
                Some("application/vnd.kubernetes.protobuf, application/json"),
                true
            ),
            Ok(Output::Json)
        );
        assert_eq!(
            negotiate(Some("application/vnd.kubernetes.protobuf"), true).map_err(|e| e.code),
            Err(406)
        );
        assert_eq!(
            negotiate(Some("application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io;q=0.5,application/yaml"), true),
            Ok(Output::Yaml)
        );
        assert_eq!(
            negotiate(
                Some("application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"),
                true
            ),
            Ok(Output::PartialMeta("meta.k8s.io/v1".into()))
        );
        assert_eq!(
            negotiate(Some("application/json;as=Widget;g=x;v=v1"), true).map_err(|e| e.code),
            Err(406)
        );
    }

    const ACCEPT_TOKENS: &[&str] = &[
        "application/json",
        "application/yaml",
        "application/cbor",
        "application/vnd.kubernetes.protobuf",
        "*/*",
        "application/*",
        "text/plain",
        ";",
        ",",
        "as=Table",
        "as=PartialObjectMetadata",
        "as=PartialObjectMetadataList",
        "g=meta.k8s.io",
        "v=v1",
        "v=v1beta1",
        "q=0",
        "q=0.5",
        "q=1",
        "q=NaN",
        "q=nan",
        "q=inf",
        "q=-1",
        "q=1e999",
        "q=",
        " ",
        "\"",
        "=",
        "é",
    ];

    /// Regression (found by `prop_negotiate_never_panics`): a `q=NaN` among
    /// more than 20 media ranges made the sort panic ("user-provided
    /// comparison function does not correctly implement a total order").
    #[test]
    fn nan_q_values_are_unacceptable() {
        let mut ranges = vec!["application/json"; 21];
        ranges[1] = "application/json;q=0";
        ranges[10] = "application/json;q=NaN";
        assert_eq!(negotiate(Some(&ranges.join(",")), false), Ok(Output::Json));
        let e = negotiate(Some("application/json;q=NaN"), true).map_err(|e| e.code);
        assert_eq!(e, Err(406));
    }

    /// An Accept header: a soup of its tokens, or a list of media ranges
    /// with parameters (long lists too: sorting them is where q-values matter).
    fn accept() -> impl Strategy<Value = String> {
        let range = (
            prop::sample::select(&ACCEPT_TOKENS[..7]),
            prop::collection::vec(prop::sample::select(&ACCEPT_TOKENS[9..24]), 0..4),
        )
            .prop_map(|(media, params)| {
                std::iter::once(media)
                    .chain(params)
                    .collect::<Vec<_>>()
                    .join(";")
            });
        prop_oneof![
            1 => crate::fuzz::text(ACCEPT_TOKENS, 80),
            2 => prop::collection::vec(range, 0..64).prop_map(|r| r.join(",")),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 5000, ..ProptestConfig::default() })]

        /// Any Accept header picks an output or is a 406.
        #[test]
        fn prop_negotiate_never_panics(accept in accept(), allow_meta in any::<bool>()) {
            if let Err(e) = negotiate(Some(&accept), allow_meta) {
                prop_assert_eq!(e.code, 406);
            }
        }
    }
}
