//! kube's PriorityLevelConfiguration validation: type, shares, percentages,
//! limit response and queuing (including the shuffle-sharding entropy bound).

use super::validation::{err, validate_name, FieldError};
use super::*;

/// Bits of the flow hash one hand consumes: ceil(log2(queues)·handSize).
pub fn required_entropy_bits(queues: i32, hand_size: i32) -> u32 {
    let bits = (f64::from(queues.max(1))).log2() * f64::from(hand_size.max(0));
    bits.ceil() as u32
}

/// Validates a (defaulted) PriorityLevelConfiguration.
pub fn validate_priority_level(pl: &PriorityLevelConfiguration) -> Vec<FieldError> {
    let mut errs = Vec::new();
    validate_name(&mut errs, &pl.metadata.name);
    let spec = &pl.spec;
    let is_exempt_name = pl.metadata.name == EXEMPT;
    match spec.type_.as_str() {
        TYPE_EXEMPT | TYPE_LIMITED => {
            if (spec.type_ == TYPE_EXEMPT) != is_exempt_name {
                err(
                    &mut errs,
                    "spec.type",
                    format!("Invalid value: {:?}: type must be 'Exempt' if and only if name is 'exempt'", spec.type_),
                );
            }
        }
        "" => err(
            &mut errs,
            "spec.type",
            "Required value: must specify a type",
        ),
        other => err(
            &mut errs,
            "spec.type",
            format!("Unsupported value: {other:?}: supported values: \"Exempt\", \"Limited\""),
        ),
    }
    if let Some(e) = &spec.exempt {
        if spec.type_ != TYPE_EXEMPT {
            err(
                &mut errs,
                "spec.exempt",
                "Forbidden: must be nil if the type is not Exempt",
            );
        }
        check_shares(&mut errs, "spec.exempt", e.nominal_concurrency_shares);
        check_percent(&mut errs, "spec.exempt.lendablePercent", e.lendable_percent);
    }
    match &spec.limited {
        None if spec.type_ == TYPE_LIMITED => err(
            &mut errs,
            "spec.limited",
            "Required value: must not be empty when type is Limited",
        ),
        None => {}
        Some(l) => {
            if spec.type_ != TYPE_LIMITED {
                err(
                    &mut errs,
                    "spec.limited",
                    "Forbidden: must be nil if the type is not Limited",
                );
            }
            check_shares(&mut errs, "spec.limited", l.nominal_concurrency_shares);
            check_percent(
                &mut errs,
                "spec.limited.lendablePercent",
                l.lendable_percent,
            );
            if let Some(b) = l.borrowing_limit_percent {
                if b < 0 {
                    err(
                        &mut errs,
                        "spec.limited.borrowingLimitPercent",
                        format!("Invalid value: {b}: if specified, must be a non-negative integer"),
                    );
                }
            }
            validate_limit_response(&mut errs, &l.limit_response);
        }
    }
    errs
}

fn check_shares(errs: &mut Vec<FieldError>, path: &str, shares: Option<i32>) {
    if let Some(s) = shares {
        if s < 0 {
            err(
                errs,
                format!("{path}.nominalConcurrencyShares"),
                format!("Invalid value: {s}: must be a non-negative integer"),
            );
        }
    }
}

fn check_percent(errs: &mut Vec<FieldError>, path: &str, pct: Option<i32>) {
    if let Some(v) = pct {
        if !(0..=100).contains(&v) {
            err(
                errs,
                path,
                format!("Invalid value: {v}: must be between 0 and 100, inclusive"),
            );
        }
    }
}

fn validate_limit_response(errs: &mut Vec<FieldError>, lr: &LimitResponse) {
    let path = "spec.limited.limitResponse";
    match lr.type_.as_str() {
        LIMIT_RESPONSE_REJECT => {
            if lr.queuing.is_some() {
                err(
                    errs,
                    format!("{path}.queuing"),
                    "Forbidden: must be nil if limited.limitResponse.type is not Queue",
                );
            }
        }
        LIMIT_RESPONSE_QUEUE => match &lr.queuing {
            None => err(
                errs,
                format!("{path}.queuing"),
                "Required value: must not be empty if limited.limitResponse.type is Queue",
            ),
            Some(q) => validate_queuing(errs, &format!("{path}.queuing"), q),
        },
        "" => err(
            errs,
            format!("{path}.type"),
            "Required value: must specify a type",
        ),
        other => err(
            errs,
            format!("{path}.type"),
            format!("Unsupported value: {other:?}: supported values: \"Queue\", \"Reject\""),
        ),
    }
}

fn validate_queuing(errs: &mut Vec<FieldError>, path: &str, q: &QueuingConfiguration) {
    if q.queue_length_limit <= 0 {
        err(
            errs,
            format!("{path}.queueLengthLimit"),
            format!("Invalid value: {}: must be positive", q.queue_length_limit),
        );
    }
    if q.queues <= 0 {
        err(
            errs,
            format!("{path}.queues"),
            format!("Invalid value: {}: must be positive", q.queues),
        );
    } else if q.queues > MAX_QUEUES {
        err(
            errs,
            format!("{path}.queues"),
            format!(
                "Invalid value: {}: must not be greater than {MAX_QUEUES}",
                q.queues
            ),
        );
    }
    if q.hand_size <= 0 {
        err(
            errs,
            format!("{path}.handSize"),
            format!("Invalid value: {}: must be positive", q.hand_size),
        );
    } else if q.queues > 0 && q.hand_size > q.queues {
        err(
            errs,
            format!("{path}.handSize"),
            format!(
                "Invalid value: {}: should not be greater than queues ({})",
                q.hand_size, q.queues
            ),
        );
    } else if q.queues > 0
        && f64::from(required_entropy_bits(q.queues, q.hand_size)) > MAX_HASH_BITS
    {
        err(
            errs,
            format!("{path}.handSize"),
            format!(
                "Invalid value: {}: required entropy bits of deckSize {} and handSize {} should not be greater than {}",
                q.hand_size, q.queues, q.hand_size, MAX_HASH_BITS
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{limited, paths, queuing};
    use super::*;

    #[test]
    fn queuing_limits() {
        let cases = [
            (queuing(64, 8, 50), None),
            (queuing(10_000_000, 1, 1), None),
            (queuing(10_000_001, 1, 1), Some("queues")),
            (queuing(4, 5, 1), Some("handSize")),
            (queuing(64, 8, 0), Some("queueLengthLimit")),
            (queuing(0, 1, 1), Some("queues")),
            // ceil(log2(128)·8) = 56 is fine, ceil(log2(128)·9) = 63 is not.
            (queuing(128, 8, 1), None),
            (queuing(128, 9, 1), Some("handSize")),
            // 2^20 queues, hand 3: exactly 60 bits.
            (queuing(1 << 20, 3, 1), None),
            (queuing(1 << 20, 4, 1), Some("handSize")),
        ];
        for (q, want) in cases {
            let errs = validate_priority_level(&limited(Some(1), Some(q.clone())));
            match want {
                None => assert!(errs.is_empty(), "{q:?}: {errs:?}"),
                Some(field) => {
                    assert_eq!(errs.len(), 1, "{q:?}: {errs:?}");
                    assert_eq!(
                        errs[0].path,
                        format!("spec.limited.limitResponse.queuing.{field}")
                    );
                }
            }
        }
    }

    #[test]
    fn shares_and_percent_limits() {
        let mut pl = limited(Some(-1), None);
        let l = pl.spec.limited.as_mut().unwrap();
        l.lendable_percent = Some(101);
        l.borrowing_limit_percent = Some(-1);
        let errs = validate_priority_level(&pl);
        assert_eq!(
            paths(&errs),
            vec![
                "spec.limited.nominalConcurrencyShares",
                "spec.limited.lendablePercent",
                "spec.limited.borrowingLimitPercent"
            ]
        );
        let mut ok = limited(Some(0), None);
        let l = ok.spec.limited.as_mut().unwrap();
        l.lendable_percent = Some(100);
        l.borrowing_limit_percent = Some(0);
        assert!(validate_priority_level(&ok).is_empty());
    }

    #[test]
    fn exempt_type_iff_exempt_name() {
        let mut pl = limited(Some(1), None);
        pl.metadata.name = EXEMPT.into();
        assert_eq!(paths(&validate_priority_level(&pl)), vec!["spec.type"]);
        let mut pl = PriorityLevelConfiguration::default();
        pl.metadata.name = "other".into();
        pl.spec.type_ = TYPE_EXEMPT.into();
        pl.apply_defaults();
        assert_eq!(paths(&validate_priority_level(&pl)), vec!["spec.type"]);
    }

    #[test]
    fn reject_with_queuing_and_queue_without() {
        let mut pl = limited(Some(1), Some(queuing(1, 1, 1)));
        pl.spec.limited.as_mut().unwrap().limit_response.type_ = LIMIT_RESPONSE_REJECT.into();
        assert_eq!(
            paths(&validate_priority_level(&pl)),
            vec!["spec.limited.limitResponse.queuing"]
        );
        let mut pl = limited(Some(1), None);
        pl.spec.limited.as_mut().unwrap().limit_response.type_ = LIMIT_RESPONSE_QUEUE.into();
        assert_eq!(
            paths(&validate_priority_level(&pl)),
            vec!["spec.limited.limitResponse.queuing"]
        );
    }
}
