//! kube's strip-meta manager: the fields no manager owns (apiVersion, kind
//! and the metadata the server sets) are taken out of every entry written.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use super::entries::VersionedSet;
use crate::apply::fieldpath::{PathElement, Set};

/// Fields kube never tracks (`stripmeta`).
pub(super) struct StripMeta(Set);

pub(super) static STRIP_META: LazyLock<StripMeta> = LazyLock::new(StripMeta::new);

impl StripMeta {
    fn new() -> Self {
        let f = |s: &str| PathElement::Field(s.into());
        let mut s = Set::new();
        s.insert(&[f("apiVersion")]);
        s.insert(&[f("kind")]);
        s.insert(&[f("metadata")]);
        for name in [
            "name",
            "namespace",
            "creationTimestamp",
            "selfLink",
            "uid",
            "clusterName",
            "generation",
            "managedFields",
            "resourceVersion",
        ] {
            s.insert(&[f("metadata"), f(name)]);
        }
        Self(s)
    }

    /// Takes the untracked fields out of `set`.
    pub(super) fn strip_set(&self, set: &mut Set) {
        set.subtract(&self.0);
    }

    /// Takes them out of `id`'s entry, dropping the entry if that empties it.
    pub(super) fn strip(&self, fields: &mut BTreeMap<String, VersionedSet>, id: &str) {
        if let Some(vs) = fields.get_mut(id) {
            self.strip_set(&mut vs.set);
            if vs.set.is_empty() {
                fields.remove(id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_set_metadata_is_stripped_and_empty_entries_dropped() {
        let f = |s: &str| PathElement::Field(s.into());
        let entry = |paths: &[&[PathElement]]| {
            let mut set = Set::new();
            for p in paths {
                set.insert(p);
            }
            VersionedSet {
                set,
                api_version: "v1".into(),
                applied: false,
            }
        };
        let mut fields = BTreeMap::new();
        fields.insert(
            "a".to_string(),
            entry(&[
                &[f("kind")],
                &[f("metadata"), f("uid")],
                &[f("metadata"), f("labels")],
                &[f("spec")],
            ]),
        );
        fields.insert(
            "b".to_string(),
            entry(&[&[f("apiVersion")], &[f("metadata"), f("resourceVersion")]]),
        );
        STRIP_META.strip(&mut fields, "a");
        STRIP_META.strip(&mut fields, "b");
        let a = &fields["a"].set;
        assert!(a.has(&[f("spec")]) && a.has(&[f("metadata"), f("labels")]));
        assert!(!a.has(&[f("kind")]) && !a.has(&[f("metadata"), f("uid")]));
        assert!(!fields.contains_key("b"), "an entry left empty is dropped");
    }
}
