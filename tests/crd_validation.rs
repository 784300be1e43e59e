//! kube-apiserver's validation of CustomResourceDefinitions: a bad
//! definition sent to kshard's CRD API gets the 422 Status kube 1.35 would
//! send (same message, causes, reasons and field paths), on create, update
//! and through `kubectl apply`; and every real definition kube accepts
//! passes. Each expected string names the kube function that produces it
//! (apiextensions-apiserver `pkg/apis/apiextensions/validation` unless
//! noted; `schema.*` is `pkg/apiserver/schema`).

mod common;

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";

/// A valid definition; tests break one thing in it.
fn crd(plural: &str) -> Value {
    common::crd(
        "example.com",
        plural,
        "Widget",
        json!({"size": {"type": "integer"}}),
    )
}

/// Asserts kube's 422 for a definition named `name`: the message joins the
/// causes, each cause is (reason, field, message).
fn assert_invalid(reply: &common::Reply, name: &str, causes: &[(&str, &str, &str)]) {
    assert_eq!(reply.status, 422, "{}", reply.text());
    let body = reply.json();
    let texts: Vec<String> = causes.iter().map(|(_, f, m)| format!("{f}: {m}")).collect();
    let joined = if texts.len() == 1 {
        texts[0].clone()
    } else {
        format!("[{}]", texts.join(", "))
    };
    assert_eq!(body["reason"], "Invalid");
    assert_eq!(body["code"], 422);
    assert_eq!(
        body["message"],
        format!("CustomResourceDefinition.apiextensions.k8s.io {name:?} is invalid: {joined}"),
    );
    assert_eq!(body["details"]["name"], name);
    assert_eq!(body["details"]["group"], "apiextensions.k8s.io");
    assert_eq!(body["details"]["kind"], "CustomResourceDefinition");
    let want: Vec<Value> = causes
        .iter()
        .map(|(r, f, m)| json!({"reason": r, "message": m, "field": f}))
        .collect();
    assert_eq!(body["details"]["causes"], json!(want));
}

const DNS1035: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

#[tokio::test(flavor = "multi_thread")]
async fn bad_definitions_get_kubes_causes_on_create() {
    let s = common::start().await;

    // ValidateCustomResourceDefinition's name function and
    // validateCustomResourceDefinitionSpec's group check.
    let mut v = crd("widgets");
    v["metadata"]["name"] = json!("gizmos.example.com");
    let r = s.post_json(CRDS, &v).await;
    assert_invalid(
        &r,
        "gizmos.example.com",
        &[(
            "FieldValueInvalid",
            "metadata.name",
            r#"Invalid value: "gizmos.example.com": must be spec.names.plural+"."+spec.group"#,
        )],
    );
    let mut v = crd("widgets");
    v["metadata"]["name"] = json!("widgets.example");
    v["spec"]["group"] = json!("example");
    assert_invalid(
        &s.post_json(CRDS, &v).await,
        "widgets.example",
        &[(
            "FieldValueInvalid",
            "spec.group",
            r#"Invalid value: "example": should be a domain with at least one dot"#,
        )],
    );

    // validateEnumStrings on scope.
    let mut v = crd("widgets");
    v["spec"]["scope"] = json!("Global");
    assert_invalid(
        &s.post_json(CRDS, &v).await,
        "widgets.example.com",
        &[(
            "FieldValueNotSupported",
            "spec.scope",
            r#"Unsupported value: "Global": supported values: "Cluster", "Namespaced""#,
        )],
    );

    // The storage-version count (the value is the internal versions list,
    // JSON-encoded by field.Error) and ValidateCustomResourceDefinitionStoredVersions.
    let mut v = crd("widgets");
    v["spec"]["versions"][0]["storage"] = json!(false);
    assert_invalid(
        &s.post_json(CRDS, &v).await,
        "widgets.example.com",
        &[
            (
                "FieldValueInvalid",
                "spec.versions",
                r#"Invalid value: [{"Name":"v1","Served":true,"Storage":false,"Deprecated":false,"DeprecationWarning":null,"Schema":null,"Subresources":null,"AdditionalPrinterColumns":null,"SelectableFields":null}]: must have exactly one version marked as storage version"#,
            ),
            (
                "FieldValueInvalid",
                "status.storedVersions",
                "Invalid value: null: must have at least one stored version",
            ),
        ],
    );

    // IsDNS1035Label on the version name, reported again for the internal
    // spec.version (the first version's name).
    let mut v = crd("widgets");
    v["spec"]["versions"][0]["name"] = json!("V1");
    let bad = format!(r#"Invalid value: "V1": {DNS1035}"#);
    assert_invalid(
        &s.post_json(CRDS, &v).await,
        "widgets.example.com",
        &[
            ("FieldValueInvalid", "spec.versions[0].name", &bad),
            ("FieldValueInvalid", "spec.version", &bad),
        ],
    );

    // ValidateCustomResourceDefinitionNames.
    let mut v = crd("widgets");
    v["spec"]["names"]["shortNames"] = json!(["W"]);
    let bad = format!(r#"Invalid value: "W": {DNS1035}"#);
    assert_invalid(
        &s.post_json(CRDS, &v).await,
        "widgets.example.com",
        &[("FieldValueInvalid", "spec.names.shortNames[0]", &bad)],
    );

    // requireOpenAPISchema.
    let mut v = crd("widgets");
    v["spec"]["versions"][0]
        .as_object_mut()
        .expect("version")
        .remove("schema");
    assert_invalid(
        &s.post_json(CRDS, &v).await,
        "widgets.example.com",
        &[(
            "FieldValueRequired",
            "spec.versions[0].schema.openAPIV3Schema",
            "Required value",
        )],
    );

    // validateCustomResourceConversion (internal field names).
    let mut v = crd("widgets");
    v["spec"]["conversion"] =
        json!({"strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v2"]}});
    assert_invalid(
        &s.post_json(CRDS, &v).await,
        "widgets.example.com",
        &[
            (
                "FieldValueRequired",
                "spec.conversion.webhookClientConfig",
                "Required value: required when strategy is set to Webhook",
            ),
            (
                "FieldValueInvalid",
                "spec.conversion.conversionReviewVersions",
                r#"Invalid value: ["v2"]: must include at least one of v1, v1beta1"#,
            ),
        ],
    );

    // validatePreserveUnknownFields.
    let mut v = crd("widgets");
    v["spec"]["preserveUnknownFields"] = json!(true);
    assert_invalid(
        &s.post_json(CRDS, &v).await,
        "widgets.example.com",
        &[(
            "FieldValueInvalid",
            "spec.preserveUnknownFields",
            "Invalid value: true: cannot set to true, set x-kubernetes-preserve-unknown-fields to true in spec.versions[*].schema instead",
        )],
    );

    // Nothing was stored.
    assert_eq!(
        s.get(&format!("{CRDS}/widgets.example.com")).await.status,
        404
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn schema_errors_have_kubes_paths() {
    let s = common::start().await;
    let schema = |v: &mut Value, to: Value| {
        v["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = to;
    };

    // schema.validateStructuralInvariants (sorted by text), reported under
    // spec.validation: a single version's schema is the internal top-level one.
    let mut v = crd("widgets");
    schema(
        &mut v,
        json!({"type": "object", "properties": {
            "metadata": {"type": "object", "properties": {"labels": {"type": "object"}}},
            "spec": {"properties": {"size": {"type": "integer"}}}}}),
    );
    assert_invalid(
        &s.post_json(CRDS, &v).await,
        "widgets.example.com",
        &[
            (
                "FieldValueForbidden",
                "spec.validation.openAPIV3Schema.properties[metadata]",
                "Forbidden: must not specify anything other than name and generateName, but metadata is implicitly specified",
            ),
            (
                "FieldValueRequired",
                "spec.validation.openAPIV3Schema.properties[spec].type",
                "Required value: must not be empty for specified object fields",
            ),
        ],
    );

    // schema.validateNestedValueValidation.
    let mut v = crd("widgets");
    schema(
        &mut v,
        json!({"type": "object", "properties": {"spec": {"type": "object",
            "properties": {"size": {"type": "integer"}},
            "anyOf": [{"properties": {"size": {"type": "integer", "minimum": 1}}}]}}}),
    );
    assert_invalid(
        &s.post_json(CRDS, &v).await,
        "widgets.example.com",
        &[(
            "FieldValueForbidden",
            "spec.validation.openAPIV3Schema.properties[spec].anyOf[0].properties[size].type",
            "Forbidden: must be empty to be structural",
        )],
    );

    // ValidateCustomResourceDefinitionOpenAPISchema: property types and the
    // list-type extensions; versions with different schemas keep their own paths.
    let mut v = crd("widgets");
    let mut v2 = v["spec"]["versions"][0].clone();
    v2["name"] = json!("v2");
    v2["storage"] = json!(false);
    v2["schema"]["openAPIV3Schema"]["properties"]["tags"] =
        json!({"type": "string", "x-kubernetes-list-type": "set"});
    v["spec"]["versions"]
        .as_array_mut()
        .expect("versions")
        .push(v2);
    schema(
        &mut v,
        json!({"type": "object", "properties": {"spec": {"type": "strin"}}}),
    );
    assert_invalid(
        &s.post_json(CRDS, &v).await,
        "widgets.example.com",
        &[
            (
                "FieldValueNotSupported",
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].type",
                r#"Unsupported value: "strin": supported values: "array", "boolean", "integer", "number", "object", "string""#,
            ),
            (
                "FieldValueInvalid",
                "spec.versions[1].schema.openAPIV3Schema.properties[tags].type",
                r#"Invalid value: "string": must be array if x-kubernetes-list-type is specified"#,
            ),
        ],
    );

    // ValidateCustomResourceColumnDefinition and
    // ValidateCustomResourceDefinitionSubresources (internal names: JSONPath).
    let mut v = crd("widgets");
    v["spec"]["versions"][0]["additionalPrinterColumns"] =
        json!([{"name": "Size", "type": "int", "jsonPath": ".spec.size"}]);
    v["spec"]["versions"][0]["subresources"] = json!({"scale": {"specReplicasPath": ".status.size", "statusReplicasPath": ".status.size"}});
    assert_invalid(
        &s.post_json(CRDS, &v).await,
        "widgets.example.com",
        &[
            (
                "FieldValueInvalid",
                "spec.subresources.scale.specReplicasPath",
                r#"Invalid value: ".status.size": should be a json path under .spec"#,
            ),
            (
                "FieldValueInvalid",
                "spec.additionalPrinterColumns[0].type",
                r#"Invalid value: "int": must be one of boolean,date,integer,number,string"#,
            ),
        ],
    );
}

/// Polls until kshard's controller marks the definition Established.
async fn established(s: &common::TestServer, name: &str) -> Value {
    for _ in 0..100 {
        let r = s.get(&format!("{CRDS}/{name}")).await;
        let v = r.json();
        let ok = v["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Established" && c["status"] == "True")
        });
        if ok {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{name} never became Established");
}

#[tokio::test(flavor = "multi_thread")]
async fn updates_keep_kubes_immutable_fields_and_stored_versions() {
    let s = common::start().await;
    let r = s.post_json(CRDS, &crd("widgets")).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let live = established(&s, "widgets.example.com").await;
    let uri = format!("{CRDS}/widgets.example.com");

    // ValidateCustomResourceDefinitionSpecUpdate: once established, scope
    // and kind are kept; group and plural always.
    let mut v = live.clone();
    v["spec"]["scope"] = json!("Cluster");
    v["spec"]["names"]["kind"] = json!("Gadget");
    assert_invalid(
        &s.put_json(&uri, &v).await,
        "widgets.example.com",
        &[
            (
                "FieldValueInvalid",
                "spec.scope",
                r#"Invalid value: "Cluster": field is immutable"#,
            ),
            (
                "FieldValueInvalid",
                "spec.names.kind",
                r#"Invalid value: "Gadget": field is immutable"#,
            ),
        ],
    );

    // ValidateCustomResourceDefinitionStoredVersions: v1 was stored, so it
    // stays in spec.versions until migrated away.
    let mut v = live.clone();
    v["spec"]["versions"][0]["name"] = json!("v2");
    assert_invalid(
        &s.put_json(&uri, &v).await,
        "widgets.example.com",
        &[(
            "FieldValueInvalid",
            "status.storedVersions[0]",
            r#"Invalid value: "v1": missing from spec.versions; v1 was previously a storage version, and must remain in spec.versions until a storage migration ensures no data remains persisted in v1 and removes v1 from status.storedVersions"#,
        )],
    );

    // Adding v2 as the storage version next to v1 is fine.
    let mut v = live;
    let mut v2 = v["spec"]["versions"][0].clone();
    v2["name"] = json!("v2");
    v["spec"]["versions"][0]["storage"] = json!(false);
    v["spec"]["versions"]
        .as_array_mut()
        .expect("versions")
        .push(v2);
    let r = s.put_json(&uri, &v).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_apply_prints_kubes_error() {
    let s = common::start().await;
    let yaml = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  scope: Global
  names: {plural: widgets, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            properties:
              size: {type: integer}
"#;
    let out = s.kubectl_stdin(&["apply", "-f", "-"], yaml);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim_end(),
        r#"The CustomResourceDefinition "widgets.example.com" is invalid: 
* spec.scope: Unsupported value: "Global": supported values: "Cluster", "Namespaced"
* spec.validation.openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields"#
    );
}

/// The definitions files of a directory (or one file), each document that is
/// a v1 CustomResourceDefinition.
fn definitions_in(path: &Path, out: &mut Vec<(String, Value)>) {
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .expect("dir")
            .flatten()
            .map(|e| e.path())
            .collect();
        entries.sort();
        for p in entries {
            definitions_in(&p, out);
        }
        return;
    }
    if !matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    ) {
        return;
    }
    let text = std::fs::read_to_string(path).expect("read");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("yaml");
    for d in docs {
        if d["kind"] == "CustomResourceDefinition" && d["apiVersion"] == "apiextensions.k8s.io/v1" {
            out.push((path.display().to_string(), d));
        }
    }
}

/// Real definitions kube accepts (public projects', kshard's own) pass.
#[test]
fn real_world_definitions_pass() {
    let mut defs = Vec::new();
    let shared = common::repo_path("../shared/realworld-crds");
    assert!(
        shared.is_dir(),
        "the real-world CRDs are missing at {}",
        shared.display()
    );
    definitions_in(&shared, &mut defs);
    definitions_in(&common::repo_path("crds"), &mut defs);
    definitions_in(&common::repo_path("tests/fixtures/crds"), &mut defs);
    let own: Value =
        serde_saphyr::from_str(&kshard::apiextensions::crd_resource::api_manifest()).expect("yaml");
    defs.push(("crds::api_manifest".into(), own));
    assert!(defs.len() >= 14, "{} definitions", defs.len());
    for (file, mut d) in defs {
        kshard::apiextensions::crd_resource::set_defaults(&mut d);
        let errs = kshard::apiextensions::validation::validate_create(&d);
        assert!(errs.is_empty(), "{file}: {errs:?}");
    }
}
