//! What the stored object must still be for a write to go ahead: a client's
//! uid and resourceVersion preconditions (k8s.io/apiserver's
//! `storage.Preconditions`), compared in one place. kube words a mismatch two
//! ways and kshard answers as it does: the storage layer's `Check(key, obj)`
//! (an update whose `metadata.uid` is not the stored one) and the early check
//! of `rest.BeforeDelete` (a delete's `preconditions`). The resourceVersion an
//! updated object carries is kube's optimistic lock, [`check_resource_version`].

use serde_json::Value;

use super::guaranteed::Current;
use super::Target;
use crate::object::meta_str;
use crate::status::ApiError;
use crate::storage::Revision;

/// kube's `storage.Preconditions`: unset fields are not checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Preconditions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

/// The first precondition the stored object does not meet.
enum Mismatch<'a> {
    Uid { want: &'a str, actual: &'a str },
    ResourceVersion { want: &'a str, actual: &'a str },
}

impl Preconditions {
    /// Only the uid (kube's update takes its preconditions from the object
    /// sent, the uid alone; an empty uid is none).
    pub fn uid_of(obj: &Value) -> Self {
        let uid = meta_str(obj, "uid");
        Self {
            uid: (!uid.is_empty()).then(|| uid.to_string()),
            resource_version: None,
        }
    }

    /// The uid first, then the resourceVersion, as kube compares them.
    fn mismatch<'a>(&'a self, obj: &'a Value) -> Option<Mismatch<'a>> {
        if let Some(want) = self.uid.as_deref() {
            let actual = meta_str(obj, "uid");
            if want != actual {
                return Some(Mismatch::Uid { want, actual });
            }
        }
        if let Some(want) = self.resource_version.as_deref() {
            let actual = meta_str(obj, "resourceVersion");
            if want != actual {
                return Some(Mismatch::ResourceVersion { want, actual });
            }
        }
        None
    }

    /// kube's `Preconditions.Check(key, obj)`: a 409 carrying the storage
    /// layer's invalid-object error, with kube's etcd key for the object.
    pub fn check(&self, t: &Target, name: &str, obj: &Value) -> Result<(), ApiError> {
        let why = match self.mismatch(obj) {
            None => return Ok(()),
            Some(Mismatch::Uid { want, actual }) => {
                format!("UID in precondition: {want}, UID in object meta: {actual}")
            }
            Some(Mismatch::ResourceVersion { want, actual }) => format!(
                "ResourceVersion in precondition: {want}, ResourceVersion in object meta: {actual}"
            ),
        };
        let key = if t.namespace.is_empty() {
            format!("/registry/{}/{}/{name}", t.rt.group, t.rt.plural)
        } else {
            format!(
                "/registry/{}/{}/{}/{name}",
                t.rt.group, t.rt.plural, t.namespace
            )
        };
        Err(ApiError::conflict(
            &t.rt.group,
            &t.rt.plural,
            name,
            &format!(
                "StorageError: invalid object, Code: 4, Key: {key}, ResourceVersion: 0, \
                 AdditionalErrorMsg: Precondition failed: {why}"
            ),
        ))
    }

    /// The same comparison as `rest.BeforeDelete` words it: a 409 naming the
    /// kind (kube builds its GroupResource from the kind) and saying why.
    pub fn check_before_delete(&self, t: &Target, name: &str, obj: &Value) -> Result<(), ApiError> {
        let why = match self.mismatch(obj) {
            None => return Ok(()),
            Some(Mismatch::Uid { want, actual }) => format!(
                "the UID in the precondition ({want}) does not match the UID in record ({actual}). \
                 The object might have been deleted and then recreated"
            ),
            Some(Mismatch::ResourceVersion { want, actual }) => format!(
                "the ResourceVersion in the precondition ({want}) does not match the \
                 ResourceVersion in record ({actual}). The object might have been modified"
            ),
        };
        let gk = format!("{}.{}", t.rt.kind, t.rt.group);
        let mut e = ApiError::conflict("", &gk, name, &why);
        if let Some(d) = e.details.as_mut() {
            d.group = t.rt.group.clone();
            d.kind = t.rt.kind.clone();
        }
        Err(e)
    }
}

/// kube's optimistic lock on update: the resourceVersion the updated object
/// carries must be the one read, else the 409 that says to re-read. Not
/// retried: the client named the revision it decided from.
pub fn check_resource_version(
    t: &Target,
    name: &str,
    sent: Revision,
    current: &Current,
) -> Result<(), ApiError> {
    if sent == current.rev {
        Ok(())
    } else {
        Err(ApiError::modified(&t.rt.group, &t.rt.plural, name))
    }
}
