//! The merge-relevant view of a CRD version's `openAPIV3Schema`.
//!
//! kube converts the structural schema into a structured-merge-diff schema
//! (kube-openapi `schemaconv`); only what changes merging and ownership is
//! kept here: struct fields vs map keys, atomic vs granular maps, list types
//! (atomic, set, map with keys) and the "deduced" type used for
//! `x-kubernetes-preserve-unknown-fields` subtrees and schema-less objects.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use serde_json::Value;

/// What a scalar may hold; used to validate applied configurations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ScalarKind {
    Numeric,
    String,
    Boolean,
    Untyped,
}

/// A reference to a type: kube's two built-in untyped types, an inline type,
/// or the empty reference (unknown fields of a struct are not allowed).
#[derive(Clone, Debug)]
pub(crate) enum TypeRef {
    /// `__untyped_deduced_`: maps granular (children deduced), lists atomic.
    Deduced,
    /// `__untyped_atomic_`: everything atomic.
    UntypedAtomic,
    Inline(Box<Atom>),
    /// No type: a field not declared in the schema.
    Undeclared,
}

/// One type; a value picks the branch that matches its JSON kind.
#[derive(Clone, Debug, Default)]
pub(crate) struct Atom {
    pub scalar: Option<ScalarKind>,
    pub list: Option<ListType>,
    pub map: Option<MapType>,
}

#[derive(Clone, Debug)]
pub(crate) struct ListType {
    /// Atomic lists are owned and replaced whole; others are associative.
    pub atomic: bool,
    /// `x-kubernetes-list-map-keys`; empty for a set.
    pub keys: Vec<String>,
    pub elem: TypeRef,
}

#[derive(Clone, Debug)]
pub(crate) struct MapType {
    pub fields: BTreeMap<String, StructField>,
    /// Type of keys not listed in `fields`.
    pub elem: TypeRef,
    pub atomic: bool,
}

#[derive(Clone, Debug)]
pub(crate) struct StructField {
    pub ty: TypeRef,
    /// Used when a list-map item omits a key field that has a default.
    pub default: Option<Value>,
}

impl MapType {
    /// The type of a key: its struct field type, else the element type.
    pub fn field_type(&self, key: &str) -> &TypeRef {
        self.fields.get(key).map_or(&self.elem, |f| &f.ty)
    }
}

static DEDUCED: LazyLock<Atom> = LazyLock::new(|| Atom {
    scalar: Some(ScalarKind::Untyped),
    list: Some(ListType {
        atomic: true,
        keys: Vec::new(),
        elem: TypeRef::UntypedAtomic,
    }),
    map: Some(MapType {
        fields: BTreeMap::new(),
        elem: TypeRef::Deduced,
        atomic: false,
    }),
});

static UNTYPED_ATOMIC: LazyLock<Atom> = LazyLock::new(|| Atom {
    scalar: Some(ScalarKind::Untyped),
    list: Some(ListType {
        atomic: true,
        keys: Vec::new(),
        elem: TypeRef::UntypedAtomic,
    }),
    map: Some(MapType {
        fields: BTreeMap::new(),
        elem: TypeRef::UntypedAtomic,
        atomic: true,
    }),
});

static EMPTY: LazyLock<Atom> = LazyLock::new(Atom::default);

impl TypeRef {
    pub fn atom(&self) -> &Atom {
        match self {
            TypeRef::Deduced => &DEDUCED,
            TypeRef::UntypedAtomic => &UNTYPED_ATOMIC,
            TypeRef::Inline(a) => a,
            TypeRef::Undeclared => &EMPTY,
        }
    }

    pub fn is_undeclared(&self) -> bool {
        matches!(self, TypeRef::Undeclared)
    }
}

/// Which branch of an atom a value takes (kube's `deduceAtom` + `handleAtom`).
pub(crate) enum Shape<'a> {
    Scalar(ScalarKind),
    List(&'a ListType),
    Map(&'a MapType),
    /// The type has no branch at all (an undeclared field).
    Invalid,
}

impl Atom {
    /// Picks the branch matching the value's kind; a null or mismatching
    /// value falls back to map, then scalar, then list, as kube does.
    pub fn shape_for(&self, v: Option<&Value>) -> Shape<'_> {
        match v {
            Some(Value::Number(_) | Value::String(_) | Value::Bool(_)) => {
                if let Some(s) = self.scalar {
                    return Shape::Scalar(s);
                }
            }
            Some(Value::Array(_)) => {
                if let Some(l) = &self.list {
                    return Shape::List(l);
                }
            }
            Some(Value::Object(_)) => {
                if let Some(m) = &self.map {
                    return Shape::Map(m);
                }
            }
            _ => {}
        }
        if let Some(m) = &self.map {
            Shape::Map(m)
        } else if let Some(s) = self.scalar {
            Shape::Scalar(s)
        } else if let Some(l) = &self.list {
            Shape::List(l)
        } else {
            Shape::Invalid
        }
    }
}

/// The merge view of one CRD version's schema.
#[derive(Clone, Debug)]
pub struct MergeSchema {
    pub(crate) root: TypeRef,
}

impl MergeSchema {
    /// Builds the view from a CRD version's `openAPIV3Schema`. `None` (no
    /// schema) gives kube's deduced type converter: every map granular, every
    /// list atomic, metadata included.
    pub fn from_openapi(schema: Option<&Value>) -> MergeSchema {
        let Some(schema) = schema else {
            return MergeSchema {
                root: TypeRef::Deduced,
            };
        };
        let mut root = parse(schema, false);
        // kube's CRD OpenAPI builder adds TypeMeta and replaces metadata with ObjectMeta.
        let map = root.map.get_or_insert_with(|| MapType {
            fields: BTreeMap::new(),
            elem: TypeRef::Undeclared,
            atomic: false,
        });
        map.atomic = false;
        for name in ["apiVersion", "kind"] {
            map.fields
                .insert(name.into(), field(scalar(ScalarKind::String)));
        }
        map.fields.insert("metadata".into(), field(object_meta()));
        root.scalar = None;
        root.list = None;
        MergeSchema {
            root: TypeRef::Inline(Box::new(root)),
        }
    }

    /// A schema where every field is deduced (what kube uses without a schema).
    pub fn deduced() -> MergeSchema {
        MergeSchema::from_openapi(None)
    }
}

fn field(ty: TypeRef) -> StructField {
    StructField { ty, default: None }
}

fn scalar(kind: ScalarKind) -> TypeRef {
    TypeRef::Inline(Box::new(Atom {
        scalar: Some(kind),
        ..Atom::default()
    }))
}

fn struct_of(fields: &[(&str, TypeRef)]) -> TypeRef {
    TypeRef::Inline(Box::new(Atom {
        map: Some(MapType {
            fields: fields
                .iter()
                .map(|(n, t)| (n.to_string(), field(t.clone())))
                .collect(),
            elem: TypeRef::Undeclared,
            atomic: false,
        }),
        ..Atom::default()
    }))
}

fn string_map() -> TypeRef {
    TypeRef::Inline(Box::new(Atom {
        map: Some(MapType {
            fields: BTreeMap::new(),
            elem: scalar(ScalarKind::String),
            atomic: false,
        }),
        ..Atom::default()
    }))
}

fn list_of(atomic: bool, keys: &[&str], elem: TypeRef) -> TypeRef {
    TypeRef::Inline(Box::new(Atom {
        list: Some(ListType {
            atomic,
            keys: keys.iter().map(|k| k.to_string()).collect(),
            elem,
        }),
        ..Atom::default()
    }))
}

/// ObjectMeta as kube's built-in schema types it: labels/annotations granular
/// maps, ownerReferences a map list keyed by uid of atomic entries,
/// finalizers a set.
fn object_meta() -> TypeRef {
    let s = || scalar(ScalarKind::String);
    let n = || scalar(ScalarKind::Numeric);
    let b = || scalar(ScalarKind::Boolean);
    // OwnerReference is `+structType=atomic`: an entry is owned whole, so
    // managedFields name only its key (`k:{"uid":"…"}: {}`).
    let mut owner_ref = struct_of(&[
        ("apiVersion", s()),
        ("kind", s()),
        ("name", s()),
        ("uid", s()),
        ("controller", b()),
        ("blockOwnerDeletion", b()),
    ]);
    if let TypeRef::Inline(atom) = &mut owner_ref {
        if let Some(m) = atom.map.as_mut() {
            m.atomic = true;
        }
    }
    struct_of(&[
        ("name", s()),
        ("generateName", s()),
        ("namespace", s()),
        ("selfLink", s()),
        ("uid", s()),
        ("resourceVersion", s()),
        ("generation", n()),
        ("creationTimestamp", s()),
        ("deletionTimestamp", s()),
        ("deletionGracePeriodSeconds", n()),
        ("labels", string_map()),
        ("annotations", string_map()),
        ("ownerReferences", list_of(false, &["uid"], owner_ref)),
        ("finalizers", list_of(false, &[], s())),
        ("managedFields", list_of(true, &[], TypeRef::UntypedAtomic)),
    ])
}

fn is_true(schema: &Value, ext: &str) -> bool {
    schema.get(ext).and_then(Value::as_bool).unwrap_or(false)
}

/// kube-openapi's `parseSchema`; `preserve` is inherited by descendants once
/// any ancestor sets `x-kubernetes-preserve-unknown-fields`.
fn parse(schema: &Value, preserve: bool) -> Atom {
    let preserve = preserve || is_true(schema, "x-kubernetes-preserve-unknown-fields");
    match schema.get("type").and_then(Value::as_str).unwrap_or("") {
        // No type (int-or-string, preserve-unknown without type): anything.
        "" => Atom {
            scalar: Some(ScalarKind::Untyped),
            list: Some(parse_list(schema, preserve)),
            map: Some(parse_object(schema, preserve)),
        },
        "object" => Atom {
            map: Some(parse_object(schema, preserve)),
            ..Atom::default()
        },
        "array" => Atom {
            list: Some(parse_list(schema, preserve)),
            ..Atom::default()
        },
        "integer" | "number" => Atom {
            scalar: Some(ScalarKind::Numeric),
            ..Atom::default()
        },
        "string" => Atom {
            scalar: Some(ScalarKind::String),
            ..Atom::default()
        },
        "boolean" => Atom {
            scalar: Some(ScalarKind::Boolean),
            ..Atom::default()
        },
        _ => Atom {
            scalar: Some(ScalarKind::Untyped),
            ..Atom::default()
        },
    }
}

fn parse_object(schema: &Value, preserve: bool) -> MapType {
    let props = schema.get("properties").and_then(Value::as_object);
    let fields: BTreeMap<String, StructField> = props
        .map(|p| {
            p.iter()
                .map(|(name, sub)| {
                    let f = StructField {
                        ty: TypeRef::Inline(Box::new(parse(sub, preserve))),
                        default: sub.get("default").cloned(),
                    };
                    (name.clone(), f)
                })
                .collect()
        })
        .unwrap_or_default();
    let elem = match schema.get("additionalProperties") {
        None | Some(Value::Null) => {
            // Without properties an object is free-form; with them, unknown keys
            // are only allowed under preserve-unknown-fields.
            if preserve || fields.is_empty() {
                TypeRef::Deduced
            } else {
                TypeRef::Undeclared
            }
        }
        Some(Value::Bool(true)) => TypeRef::Deduced,
        Some(Value::Bool(false)) => TypeRef::Undeclared,
        Some(sub) => TypeRef::Inline(Box::new(parse(sub, preserve))),
    };
    let atomic = schema.get("x-kubernetes-map-type").and_then(Value::as_str) == Some("atomic");
    MapType {
        fields,
        elem,
        atomic,
    }
}

fn parse_list(schema: &Value, preserve: bool) -> ListType {
    let (atomic, keys) = match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("set") => (false, Vec::new()),
        Some("map") => {
            let keys = schema
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|ks| {
                    ks.iter()
                        .filter_map(Value::as_str)
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default();
            (false, keys)
        }
        // CRD lists without a list type are atomic.
        _ => (true, Vec::new()),
    };
    let elem = match schema.get("items") {
        Some(items @ Value::Object(_)) => TypeRef::Inline(Box::new(parse(items, preserve))),
        _ => TypeRef::UntypedAtomic,
    };
    ListType { atomic, keys, elem }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn builds_lists_maps_and_metadata() {
        let s = MergeSchema::from_openapi(Some(&json!({
            "type": "object",
            "properties": {
                "spec": {"type": "object", "properties": {
                    "ports": {"type": "array", "x-kubernetes-list-type": "map",
                              "x-kubernetes-list-map-keys": ["port", "protocol"],
                              "items": {"type": "object", "properties": {
                                  "port": {"type": "integer"},
                                  "protocol": {"type": "string", "default": "TCP"}}}},
                    "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                    "args": {"type": "array", "items": {"type": "string"}},
                    "sel": {"type": "object", "x-kubernetes-map-type": "atomic",
                            "additionalProperties": {"type": "string"}},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                }}
            }
        })));
        let root = s.root.atom().map.as_ref().expect("root map");
        assert!(root.fields.contains_key("metadata") && root.fields.contains_key("kind"));
        let spec = root.fields["spec"].ty.atom().map.as_ref().expect("spec");
        let ports = spec.fields["ports"].ty.atom().list.as_ref().expect("ports");
        assert!(!ports.atomic);
        assert_eq!(ports.keys, vec!["port", "protocol"]);
        let item = ports.elem.atom().map.as_ref().expect("item");
        assert_eq!(item.fields["protocol"].default, Some(json!("TCP")));
        assert!(
            spec.fields["args"]
                .ty
                .atom()
                .list
                .as_ref()
                .expect("args")
                .atomic
        );
        assert!(
            spec.fields["sel"]
                .ty
                .atom()
                .map
                .as_ref()
                .expect("sel")
                .atomic
        );
        let free = spec.fields["free"].ty.atom().map.as_ref().expect("free");
        assert!(matches!(free.elem, TypeRef::Deduced));
        assert!(spec.elem.is_undeclared());
    }
}
