//! Objects shared by the configuration unit tests.

use super::*;

pub(crate) fn limited(
    shares: Option<i32>,
    queuing: Option<QueuingConfiguration>,
) -> PriorityLevelConfiguration {
    PriorityLevelConfiguration {
        metadata: ObjectMeta {
            name: "pl".into(),
            ..Default::default()
        },
        spec: PriorityLevelConfigurationSpec {
            type_: TYPE_LIMITED.into(),
            limited: Some(LimitedPriorityLevelConfiguration {
                nominal_concurrency_shares: shares,
                limit_response: LimitResponse {
                    type_: if queuing.is_some() {
                        LIMIT_RESPONSE_QUEUE
                    } else {
                        LIMIT_RESPONSE_REJECT
                    }
                    .into(),
                    queuing,
                },
                ..Default::default()
            }),
            exempt: None,
        },
        status: None,
    }
}

pub(crate) fn queuing(queues: i32, hand_size: i32, limit: i32) -> QueuingConfiguration {
    QueuingConfiguration {
        queues,
        hand_size,
        queue_length_limit: limit,
    }
}

pub(crate) fn paths(errs: &[FieldError]) -> Vec<&str> {
    errs.iter().map(|e| e.path.as_str()).collect()
}
