//! kube's defaulting, and accessors that read values as defaulted.

use super::*;

impl FlowSchema {
    /// kube's `SetDefaults_FlowSchemaSpec`.
    pub fn apply_defaults(&mut self) {
        if self.spec.matching_precedence == 0 {
            self.spec.matching_precedence = DEFAULT_MATCHING_PRECEDENCE;
        }
    }

    /// The condition `Dangling`, if the status carries one.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
    }
}

impl PriorityLevelConfiguration {
    /// kube's v1 defaulting: Limited shares 30, Exempt shares 0, lendable 0,
    /// queuing 64/8/50 for zero-valued fields.
    pub fn apply_defaults(&mut self) {
        let spec = &mut self.spec;
        if spec.type_ == TYPE_EXEMPT && spec.exempt.is_none() {
            spec.exempt = Some(ExemptPriorityLevelConfiguration::default());
        }
        if let Some(exempt) = spec.exempt.as_mut() {
            exempt.nominal_concurrency_shares.get_or_insert(0);
            exempt.lendable_percent.get_or_insert(0);
        }
        if let Some(limited) = spec.limited.as_mut() {
            limited
                .nominal_concurrency_shares
                .get_or_insert(DEFAULT_NOMINAL_CONCURRENCY_SHARES);
            limited.lendable_percent.get_or_insert(0);
            if let Some(q) = limited.limit_response.queuing.as_mut() {
                if q.queues == 0 {
                    q.queues = DEFAULT_QUEUES;
                }
                if q.hand_size == 0 {
                    q.hand_size = DEFAULT_HAND_SIZE;
                }
                if q.queue_length_limit == 0 {
                    q.queue_length_limit = DEFAULT_QUEUE_LENGTH_LIMIT;
                }
            }
        }
    }

    pub fn is_exempt(&self) -> bool {
        self.spec.type_ == TYPE_EXEMPT
    }

    /// Shares after defaulting (0 for exempt without shares).
    pub fn nominal_concurrency_shares(&self) -> i32 {
        match (&self.spec.limited, &self.spec.exempt) {
            (Some(l), _) => l
                .nominal_concurrency_shares
                .unwrap_or(DEFAULT_NOMINAL_CONCURRENCY_SHARES),
            (None, Some(e)) => e.nominal_concurrency_shares.unwrap_or(0),
            (None, None) => 0,
        }
    }

    pub fn lendable_percent(&self) -> i32 {
        match (&self.spec.limited, &self.spec.exempt) {
            (Some(l), _) => l.lendable_percent.unwrap_or(0),
            (None, Some(e)) => e.lendable_percent.unwrap_or(0),
            (None, None) => 0,
        }
    }

    pub fn borrowing_limit_percent(&self) -> Option<i32> {
        self.spec
            .limited
            .as_ref()
            .and_then(|l| l.borrowing_limit_percent)
    }

    /// Queuing parameters, `None` for Reject and Exempt levels.
    pub fn queuing(&self) -> Option<&QueuingConfiguration> {
        self.spec.limited.as_ref().and_then(|l| {
            if l.limit_response.type_ == LIMIT_RESPONSE_QUEUE {
                l.limit_response.queuing.as_ref()
            } else {
                None
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{limited, queuing};
    use super::*;

    #[test]
    fn defaults_limited_and_queuing() {
        let mut pl = limited(None, Some(queuing(0, 0, 0)));
        pl.apply_defaults();
        let l = pl.spec.limited.as_ref().unwrap();
        assert_eq!(l.nominal_concurrency_shares, Some(30));
        assert_eq!(l.lendable_percent, Some(0));
        assert_eq!(l.borrowing_limit_percent, None);
        assert_eq!(l.limit_response.queuing, Some(queuing(64, 8, 50)));
        assert!(validate_priority_level(&pl).is_empty());
    }

    #[test]
    fn zero_shares_are_kept_and_valid() {
        let mut pl = limited(Some(0), None);
        pl.apply_defaults();
        assert_eq!(pl.nominal_concurrency_shares(), 0);
        assert!(validate_priority_level(&pl).is_empty());
    }

    #[test]
    fn defaults_exempt() {
        let mut pl = PriorityLevelConfiguration {
            metadata: ObjectMeta {
                name: EXEMPT.into(),
                ..Default::default()
            },
            spec: PriorityLevelConfigurationSpec {
                type_: TYPE_EXEMPT.into(),
                ..Default::default()
            },
            status: None,
        };
        pl.apply_defaults();
        let e = pl.spec.exempt.as_ref().unwrap();
        assert_eq!(e.nominal_concurrency_shares, Some(0));
        assert_eq!(e.lendable_percent, Some(0));
        assert!(validate_priority_level(&pl).is_empty());
    }

    #[test]
    fn defaults_flow_schema_precedence() {
        let mut fs = FlowSchema::default();
        fs.apply_defaults();
        assert_eq!(fs.spec.matching_precedence, 1000);
        fs.spec.matching_precedence = 7;
        fs.apply_defaults();
        assert_eq!(fs.spec.matching_precedence, 7);
    }
}
