//! kube's cap-managers manager: past a number of Update managers, the
//! oldest are folded into one "ancient-changes" entry per version.

use std::collections::BTreeMap;

use super::entries::{manager_id, Managed, VersionedSet};

const ANCIENT_CHANGES: &str = "ancient-changes";

/// The most Update managers an object keeps.
pub(super) struct CapManagers {
    max: usize,
}

/// kube's `DefaultMaxUpdateManagers`.
pub(super) const CAP_MANAGERS: CapManagers = CapManagers { max: 10 };

impl CapManagers {
    /// Folds the oldest Update managers into one "ancient-changes" entry per
    /// version once there are more than `max` (kube's capManagers).
    pub(super) fn cap(&self, managed: &mut Managed) {
        let mut updaters: Vec<String> = managed
            .fields
            .iter()
            .filter(|(_, vs)| !vs.applied)
            .map(|(id, _)| id.clone())
            .collect();
        if updaters.len() <= self.max {
            return;
        }
        let time = |id: &String| managed.times.get(id).copied().unwrap_or(0);
        updaters.sort_by(|a, b| time(a).cmp(&time(b)).then_with(|| a.cmp(b)));
        let mut first_by_version: BTreeMap<String, String> = BTreeMap::new();
        let mut length = updaters.len();
        for id in updaters {
            if length <= self.max {
                break;
            }
            let Some(vs) = managed.fields.get(&id).cloned() else {
                continue;
            };
            let t = managed.times.get(&id).copied();
            let bucket = manager_id(ANCIENT_CHANGES, "Update", &vs.api_version, "");
            match first_by_version.get(&vs.api_version) {
                Some(first) => {
                    if !managed.fields.contains_key(&bucket) {
                        if let Some(s) = managed.fields.remove(first) {
                            managed.fields.insert(bucket.clone(), s);
                        }
                    }
                    let prev = managed
                        .fields
                        .get(&bucket)
                        .map(|b| b.set.clone())
                        .unwrap_or_default();
                    let merged = VersionedSet {
                        set: vs.set.union(&prev),
                        api_version: vs.api_version,
                        applied: vs.applied,
                    };
                    managed.fields.insert(bucket.clone(), merged);
                    managed.fields.remove(&id);
                    length -= 1;
                    match t {
                        Some(t) => managed.times.insert(bucket, t),
                        None => managed.times.remove(&bucket),
                    };
                }
                None => {
                    first_by_version.insert(vs.api_version, id);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::fieldpath::{PathElement, Set};

    #[test]
    fn caps_update_managers_into_ancient_changes() {
        let mut m = Managed::default();
        for i in 0..12 {
            let id = manager_id(&format!("m{i:02}"), "Update", "v1", "");
            let mut set = Set::new();
            set.insert(&[PathElement::Field(format!("f{i}"))]);
            m.fields.insert(
                id.clone(),
                VersionedSet {
                    set,
                    api_version: "v1".into(),
                    applied: false,
                },
            );
            m.times.insert(id, i);
        }
        CAP_MANAGERS.cap(&mut m);
        assert_eq!(m.fields.len(), 10);
        let bucket = manager_id(ANCIENT_CHANGES, "Update", "v1", "");
        let b = &m.fields[&bucket];
        for i in 0..3 {
            assert!(b.set.has(&[PathElement::Field(format!("f{i}"))]));
        }
        assert_eq!(m.times[&bucket], 2);
    }
}
