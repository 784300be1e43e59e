//! Admission checks the write pipeline runs on every create (including
//! create-on-apply and dry runs), for policies that live outside the registry,
//! such as namespace lifecycle against a host cluster.

use futures::future::BoxFuture;

use super::Target;
use crate::status::ApiError;

pub trait CreateAdmission: Send + Sync {
    /// `name` is the object's name, or its generateName when it has none yet.
    fn admit_create<'a>(
        &'a self,
        t: &'a Target,
        name: &'a str,
    ) -> BoxFuture<'a, Result<(), ApiError>>;
}
