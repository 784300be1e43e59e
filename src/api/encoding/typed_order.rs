//! JSON in the field order of kube's Go structs. kube encodes custom
//! resources from maps (keys sorted, as a `serde_json::Value` writes them)
//! but its own kinds (Scale, Status, Table) from structs, fields in
//! declaration order. [`TypedOrder`] writes a `Value` that way for the
//! fields those kinds have; any other key follows, sorted.

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::Value;

use crate::object::meta::OBJECT_META_FIELDS;

/// Keys by their place in kube's structs: `TypeMeta`, `ObjectMeta`'s
/// fields, then the kinds' own (`spec` before `status`, a Scale's
/// `replicas` before its `selector`).
const TYPE_META: [&str; 3] = ["kind", "apiVersion", "metadata"];
const OWN_FIELDS: [&str; 4] = ["spec", "status", "replicas", "selector"];

fn rank(key: &str) -> usize {
    TYPE_META
        .iter()
        .chain(OBJECT_META_FIELDS.iter())
        .chain(OWN_FIELDS.iter())
        .position(|k| *k == key)
        .unwrap_or(usize::MAX)
}

/// A `Value` serialized with its object keys in kube's struct order.
pub struct TypedOrder<'a>(pub &'a Value);

impl Serialize for TypedOrder<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                // Stable: keys of equal rank (the unranked) stay sorted.
                keys.sort_by_key(|k| rank(k));
                let mut map = serializer.serialize_map(Some(keys.len()))?;
                for k in keys {
                    map.serialize_entry(k, &TypedOrder(&m[k.as_str()]))?;
                }
                map.end()
            }
            Value::Array(a) => {
                let mut seq = serializer.serialize_seq(Some(a.len()))?;
                for x in a {
                    seq.serialize_element(&TypedOrder(x))?;
                }
                seq.end()
            }
            other => other.serialize(serializer),
        }
    }
}

/// [`TypedOrder`]'s bytes.
pub fn to_vec(v: &Value) -> Vec<u8> {
    serde_json::to_vec(&TypedOrder(v)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_scale_is_written_as_kube_writes_it() {
        let scale = json!({
            "status": {"selector": "app=a", "replicas": 2},
            "spec": {"replicas": 3},
            "metadata": {"uid": "u", "creationTimestamp": "t", "name": "a", "namespace": "n", "resourceVersion": "7"},
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
        });
        // kube-apiserver 1.36's answer for a CR's /scale, byte for byte.
        assert_eq!(
            String::from_utf8(to_vec(&scale)).expect("utf8"),
            r#"{"kind":"Scale","apiVersion":"autoscaling/v1","metadata":{"name":"a","namespace":"n","uid":"u","resourceVersion":"7","creationTimestamp":"t"},"spec":{"replicas":3},"status":{"replicas":2,"selector":"app=a"}}"#
        );
        // Keys kube's structs do not have follow, sorted.
        assert_eq!(
            String::from_utf8(to_vec(
                &json!({"z": 1, "b": [{"y": 0, "kind": "K"}], "kind": "X"})
            ))
            .expect("utf8"),
            r#"{"kind":"X","b":[{"kind":"K","y":0}],"z":1}"#
        );
    }
}
