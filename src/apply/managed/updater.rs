//! kube's managed-fields updater: the fields a non-apply write touched join
//! its writer's entry, and an entry written is stamped with the time.

use super::entries::{Managed, VersionedSet};
use crate::apply::time::parse_time;
use crate::apply::ApplyError;

/// Temporary name for the fields a non-apply write touches, before they are
/// merged into the writer's entry (kube's managedFieldsUpdater).
pub(super) const CURRENT_OPERATION: &str = "current-operation";

/// The time a write is recorded at.
pub(super) struct Stamp {
    /// Unix seconds.
    now: i64,
    /// Through /scale kube rebuilds the writer's entry from the Scale
    /// object's, which carries no time.
    timeless: bool,
}

impl Stamp {
    /// `now` is RFC 3339.
    pub(super) fn new(now: &str, subresource: Option<&str>) -> Result<Self, ApplyError> {
        let now =
            parse_time(now).ok_or_else(|| ApplyError::Internal(format!("invalid time {now:?}")))?;
        Ok(Self {
            now,
            timeless: subresource == Some("scale"),
        })
    }

    /// Records when `id` last wrote.
    pub(super) fn record(&self, managed: &mut Managed, id: String) {
        if self.timeless {
            managed.times.remove(&id);
        } else {
            managed.times.insert(id, self.now);
        }
    }

    /// Moves what the current operation touched into `id`'s entry (joining
    /// what it owned before) and stamps it; nothing when it touched nothing.
    pub(super) fn record_current_operation(&self, managed: &mut Managed, id: String) {
        if let Some(vs) = managed.fields.remove(CURRENT_OPERATION) {
            let mut set = vs.set;
            if let Some(prev) = managed.fields.remove(&id) {
                set.union_with(prev.set);
            }
            managed.fields.insert(
                id.clone(),
                VersionedSet {
                    set,
                    api_version: vs.api_version,
                    applied: vs.applied,
                },
            );
            self.record(managed, id);
        }
    }
}

#[cfg(test)]
impl Stamp {
    pub(super) fn at(now: i64) -> Self {
        Self {
            now,
            timeless: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::fieldpath::{PathElement, Set};

    fn entry(field: &str, api_version: &str) -> VersionedSet {
        let mut set = Set::new();
        set.insert(&[PathElement::Field(field.into())]);
        VersionedSet {
            set,
            api_version: api_version.into(),
            applied: false,
        }
    }

    #[test]
    fn the_current_operation_joins_the_writers_entry_with_the_time() {
        let stamp = Stamp::new("2024-01-01T00:00:10Z", None).expect("time");
        let mut m = Managed::default();
        m.fields.insert("w".into(), entry("old", "v1"));
        m.times.insert("w".into(), 1);
        m.fields
            .insert(CURRENT_OPERATION.into(), entry("new", "v2"));
        stamp.record_current_operation(&mut m, "w".into());
        assert!(!m.fields.contains_key(CURRENT_OPERATION));
        let w = &m.fields["w"];
        assert!(w.set.has(&[PathElement::Field("old".into())]));
        assert!(w.set.has(&[PathElement::Field("new".into())]));
        assert_eq!(w.api_version, "v2", "the entry is at the version written");
        assert_eq!(m.times["w"], 1_704_067_210);

        // Nothing touched: the entry and its time stay.
        let later = Stamp::new("2024-01-01T00:01:00Z", None).expect("time");
        later.record_current_operation(&mut m, "w".into());
        assert_eq!(m.times["w"], 1_704_067_210);
    }

    #[test]
    fn writes_through_scale_carry_no_time() {
        let stamp = Stamp::new("2024-01-01T00:00:10Z", Some("scale")).expect("time");
        let mut m = Managed::default();
        m.times.insert("w".into(), 1);
        stamp.record(&mut m, "w".into());
        assert!(!m.times.contains_key("w"));
        assert!(Stamp::new("yesterday", None).is_err());
    }
}
