//! What both validations share: `FieldError`, names and wildcard lists.

use super::WILDCARD;

/// One validation failure, like kube's `field.Error` (path + detail).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

pub(super) fn err(errs: &mut Vec<FieldError>, path: impl Into<String>, message: impl Into<String>) {
    errs.push(FieldError {
        path: path.into(),
        message: message.into(),
    });
}

/// kube's `ValidatePathSegmentName` plus non-empty.
pub(super) fn validate_name(errs: &mut Vec<FieldError>, name: &str) {
    if name.is_empty() {
        err(errs, "metadata.name", "Required value: name is required");
        return;
    }
    if name == "." || name == ".." {
        err(
            errs,
            "metadata.name",
            format!("Invalid value: {name:?}: may not be '{name}'"),
        );
    }
    for bad in ["/", "%"] {
        if name.contains(bad) {
            err(
                errs,
                "metadata.name",
                format!("Invalid value: {name:?}: may not contain '{bad}'"),
            );
        }
    }
}

pub(super) fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// `*` must stand alone when present; empty lists are required errors.
pub(super) fn validate_wildcard_list(
    errs: &mut Vec<FieldError>,
    path: &str,
    items: &[String],
    what: &str,
) {
    if items.is_empty() {
        err(
            errs,
            path,
            format!("Required value: {what} must contain at least one value"),
        );
    } else if items.len() > 1 && items.iter().any(|v| v == WILDCARD) {
        err(
            errs,
            path,
            format!("Invalid value: if '*' is present, must not specify other {what}"),
        );
    }
}
