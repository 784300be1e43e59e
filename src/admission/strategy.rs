//! The strategies of the admissionregistration kinds kshard stores
//! standalone (stand-ins for kube's built-in types): kube's own validation
//! of the webhook configurations, policies and bindings, the fields its
//! types always carry, and empty lists dropped as its Go types drop them.
//! The registry's write pipeline reaches them through the resource type's
//! strategy; the server registers them with the catalog at start, as this
//! module sits above the registry.

use serde_json::Value;

use super::hooks::{BINDINGS, GROUP, MUTATING, POLICIES, VALIDATING};
use crate::apiextensions::catalog::PrinterColumn;
use crate::apiextensions::strategy::{BuiltinValidation, ComputedCell, Strategies, Strategy};

/// One admissionregistration kind, by its resource name.
#[derive(Debug)]
struct Kind(&'static str);

impl Strategy for Kind {
    fn prepare(&self, obj: &mut Value) {
        super::builtin_crds::omit_empty_lists(obj);
    }

    fn builtin_validation(&self, obj: &Value) -> Option<BuiltinValidation> {
        let (errors, ratcheted) = super::builtin_crds::builtin_validation(GROUP, self.0, obj)?;
        Some(BuiltinValidation { errors, ratcheted })
    }

    fn always_present(&self) -> &'static [&'static str] {
        super::builtin_crds::always_present(GROUP, self.0)
    }

    fn table_columns(&self) -> Option<Vec<(PrinterColumn, ComputedCell)>> {
        super::columns::table_columns(self.0)
    }
}

static KINDS: [Kind; 4] = [
    Kind(MUTATING),
    Kind(VALIDATING),
    Kind(POLICIES),
    Kind(BINDINGS),
];

/// The four kinds' strategies, for the catalog.
pub fn strategies() -> Strategies {
    let mut s = Strategies::default();
    for k in &KINDS {
        s.insert(GROUP, k.0, k);
    }
    s
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::apiextensions::Catalog;

    #[test]
    fn the_catalog_gives_each_kind_its_strategy_before_and_after_loading() {
        let load = |c: &mut Catalog| {
            c.add_builtin_manifests(
                std::path::Path::new("<admission>"),
                &super::super::builtin_crds::manifests_yaml(),
            )
            .expect("the CRDs load");
        };
        // Registered first, then loaded; and loaded first, then registered.
        let mut before = Catalog::default();
        before.register_strategies(strategies());
        load(&mut before);
        let mut after = Catalog::default();
        load(&mut after);
        after.register_strategies(strategies());
        let bad = json!({"webhooks": [{"name": "a.b.c", "sideEffects": "Some"}]});
        for c in [&before, &after] {
            let rt = |plural| c.find(GROUP, "v1", plural).expect("served");
            let found = rt(VALIDATING)
                .strategy()
                .builtin_validation(&bad)
                .expect("kube's validation");
            assert!(found.ratcheted);
            assert!(
                found
                    .errors
                    .iter()
                    .any(|e| e.field == "webhooks[0].sideEffects"),
                "{:?}",
                found.errors.iter().map(|e| &e.field).collect::<Vec<_>>()
            );
            assert!(rt(MUTATING).strategy().builtin_validation(&bad).is_some());
            // kube checks a policy whole on every update: no ratcheting.
            let policy = rt(POLICIES)
                .strategy()
                .builtin_validation(&json!({"spec": {}}))
                .expect("kube's validation");
            assert!(!policy.ratcheted);
            assert!(policy.errors.iter().any(|e| e.field.starts_with("spec.")));
            assert_eq!(rt(POLICIES).strategy().always_present(), ["spec", "status"]);
            assert_eq!(rt(BINDINGS).strategy().always_present(), ["spec"]);
        }
        // Without the registration: the generic strategy.
        let mut none = Catalog::default();
        load(&mut none);
        let rt = none.find(GROUP, "v1", VALIDATING).expect("served");
        assert!(rt.strategy().builtin_validation(&bad).is_none());
    }
}
