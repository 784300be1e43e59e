//! kube's structured-merge manager (structured-merge-diff's `Updater`):
//! what a write changed is taken from the managers that owned it (or
//! reported as conflicts), removed fields leave every manager, and an apply
//! merges its configuration and prunes what its manager stopped applying.

use std::collections::BTreeMap;

use serde_json::Value;

use super::entries::VersionedSet;
use super::Failure;
use crate::apply::fieldpath::{values_equal, Set};
use crate::apply::merge::{
    compare, ensure_named_fields_are_members, field_set, merge, remove_items, Comparison,
};
use crate::apply::schema::TypeRef;
use crate::apply::FieldManager;

impl FieldManager<'_> {
    pub(super) fn root(&self) -> &TypeRef {
        &self.schema.root
    }

    /// Shared core of Update and Apply (`Updater.update`): fields whose value
    /// changed are taken from every other manager (or reported as conflicts
    /// when not forced), removed fields are dropped from everyone. Each
    /// manager is judged at its own version: old and new are converted there
    /// once per version, and conflicts name fields as that manager owns them.
    fn update_owners(
        &self,
        old: &Value,
        new: &Value,
        fields: &mut BTreeMap<String, VersionedSet>,
        workflow: &str,
        force: bool,
    ) -> Result<Comparison, Failure> {
        let cmp = compare(self.root(), old, new).filter(&self.reset);
        let mut others: Vec<&str> = fields
            .iter()
            .filter(|(id, vs)| *id != workflow && vs.api_version != self.api_version)
            .map(|(_, vs)| vs.api_version.as_str())
            .collect();
        others.sort_unstable();
        others.dedup();
        let mut at: BTreeMap<String, Comparison> = BTreeMap::new();
        let mut missing: Vec<String> = Vec::new();
        for v in others {
            match self.compare_at(old, new, v, &cmp)? {
                Some(c) => at.insert(v.to_string(), c),
                None => {
                    missing.push(v.to_string());
                    None
                }
            };
        }
        // Managers at a missing version are dropped (`IsMissingVersionError`).
        fields.retain(|id, vs| id == workflow || !missing.contains(&vs.api_version));
        let changed_here = cmp.modified.union(&cmp.added);
        let changed_at: BTreeMap<&str, Set> = at
            .iter()
            .map(|(v, c)| (v.as_str(), c.modified.union(&c.added)))
            .collect();
        let mut conflicts: Vec<(String, Set)> = Vec::new();
        let mut removed: Vec<(String, &Set)> = Vec::new();
        for (id, vs) in fields.iter() {
            if id == workflow {
                continue;
            }
            let (changed, c) = match at.get(&vs.api_version) {
                Some(c) => (
                    changed_at
                        .get(vs.api_version.as_str())
                        .unwrap_or(&changed_here),
                    c,
                ),
                None => (&changed_here, &cmp),
            };
            let conflict = vs.set.intersection(changed);
            if !conflict.is_empty() {
                conflicts.push((id.clone(), conflict));
            }
            if !c.removed.is_empty() {
                removed.push((id.clone(), &c.removed));
            }
        }
        if !force && !conflicts.is_empty() {
            let mut out = Vec::new();
            for (id, set) in conflicts {
                for p in set.paths() {
                    out.push((id.clone(), p));
                }
            }
            return Err(Failure::Conflicts(out));
        }
        for (id, c) in &conflicts {
            if let Some(vs) = fields.get_mut(id) {
                vs.set = vs.set.difference(c);
            }
        }
        for (id, r) in removed {
            if let Some(vs) = fields.get_mut(&id) {
                vs.set = vs.set.difference(r);
            }
        }
        fields.retain(|_, vs| !vs.set.is_empty());
        Ok(cmp)
    }

    /// `Updater.Update`: the writer owns what it added or changed.
    pub(super) fn structured_update(
        &self,
        live: &Value,
        new: &Value,
        fields: &mut BTreeMap<String, VersionedSet>,
        id: &str,
    ) -> Result<(), Failure> {
        self.drop_missing_versions(fields);
        let cmp = self.update_owners(live, new, fields, id, true)?;
        let mut set = fields.remove(id).map(|vs| vs.set).unwrap_or_default();
        set.subtract(&cmp.removed);
        set.union_with(cmp.modified);
        set.union_with(cmp.added);
        set.subtract_recursive(&self.reset);
        if !set.is_empty() {
            fields.insert(
                id.into(),
                VersionedSet {
                    set,
                    api_version: self.api_version.clone(),
                    applied: false,
                },
            );
        }
        Ok(())
    }

    /// `Updater.Apply`: merge, take ownership of the configuration's fields,
    /// prune what this manager stopped applying, then settle ownership.
    /// Returns `None` for the object when nothing changed.
    pub(super) fn structured_apply(
        &self,
        live: &Value,
        config: &Value,
        fields: &mut BTreeMap<String, VersionedSet>,
        id: &str,
        force: bool,
    ) -> Result<Option<Value>, Failure> {
        self.drop_missing_versions(fields);
        let merged = merge(self.root(), Some(live), Some(config)).unwrap_or(Value::Null);
        let last = fields.get(id).cloned();
        let set = field_set(self.root(), config).recursive_difference(&self.reset);
        fields.insert(
            id.into(),
            VersionedSet {
                set,
                api_version: self.api_version.clone(),
                applied: true,
            },
        );
        let merged = self.prune(merged, fields, last.as_ref())?;
        self.update_owners(live, &merged, fields, id, force)?;
        Ok((!values_equal(live, &merged)).then_some(merged))
    }

    /// Removes fields the applier owned last time and no longer applies,
    /// unless another manager (or the new configuration) still owns them
    /// (`Updater.prune`). It works at the version of the last applied set:
    /// the merged object is converted there, owned items are added back at
    /// each owner's version (the last applied version first), and the result
    /// is converted back to the request's version.
    fn prune(
        &self,
        merged: Value,
        fields: &BTreeMap<String, VersionedSet>,
        last: Option<&VersionedSet>,
    ) -> Result<Value, Failure> {
        let Some(last) = last.filter(|l| !l.set.is_empty()) else {
            return Ok(merged);
        };
        let lv = last.api_version.as_str();
        let Some(last_schema) = self.schema_at(lv) else {
            return Ok(merged);
        };
        let merged_l = match self.converter.convert(vec![merged], lv)? {
            Some(mut v) if v.len() == 1 => v.remove(0),
            _ => return Err(Failure::Convert(format!("no version {lv}"))),
        };
        let lroot = &last_schema.root;
        let ensure_l = |s: &Set| ensure_named_fields_are_members(lroot, s);
        let mut pruned = remove_items(lroot, &merged_l, &ensure_l(&last.set));
        // Add back what anybody owns, each version's owners at that version.
        let mut owned: BTreeMap<&str, Set> = BTreeMap::new();
        for vs in fields.values() {
            let acc = owned.entry(vs.api_version.as_str()).or_default();
            *acc = acc.union(&vs.set);
        }
        let mut order: Vec<&str> = owned.keys().copied().filter(|v| *v != lv).collect();
        if owned.contains_key(lv) {
            order.insert(0, lv);
        }
        // The merged object at the version `pruned` is at (`None`: merged_l).
        let mut moved: Option<Value> = None;
        let mut at = lv.to_string();
        for v in order {
            let Some(schema) = self.schema_at(v) else {
                continue;
            };
            if v != at && !self.rewrites() {
                let m = moved.take().unwrap_or_else(|| merged_l.clone());
                match self.converter.convert(vec![m, pruned.clone()], v)? {
                    Some(objs) if objs.len() == 2 => {
                        let mut it = objs.into_iter();
                        moved = it.next();
                        pruned = it.next().unwrap_or_default();
                        at = v.to_string();
                    }
                    // A missing version adds nothing back.
                    _ => continue,
                }
            }
            let m = moved.as_ref().unwrap_or(&merged_l);
            let root = &schema.root;
            let ensure = |s: &Set| ensure_named_fields_are_members(root, s);
            let keep = ensure(&field_set(root, &pruned)).union(&ensure(&owned[v]));
            pruned = remove_items(root, m, &ensure(&field_set(root, m)).difference(&keep));
        }
        // Only drop what the applier itself had owned; parents emptied as a
        // side effect come back.
        let pruned_l = if at == lv {
            pruned
        } else {
            match self.converter.convert(vec![pruned], lv)? {
                Some(mut v) if v.len() == 1 => v.remove(0),
                _ => return self.back_to_request_version(merged_l),
            }
        };
        let merged_set = ensure_l(&field_set(lroot, &merged_l));
        let pruned_set = ensure_l(&field_set(lroot, &pruned_l));
        let dangling = merged_set
            .difference(&pruned_set)
            .intersection(&ensure_l(&last.set));
        self.back_to_request_version(remove_items(lroot, &merged_l, &dangling))
    }

    fn back_to_request_version(&self, obj: Value) -> Result<Value, Failure> {
        let v = self.api_version.clone();
        match self.converter.convert(vec![obj], &v)? {
            Some(mut objs) if objs.len() == 1 => Ok(objs.remove(0)),
            _ => Err(Failure::Convert(format!("no version {v}"))),
        }
    }
}
