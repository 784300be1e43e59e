//! Who is asking. Standalone (dev) mode: every request is `system:admin` in
//! `system:masters`, which may impersonate others with kube's `Impersonate-*`
//! headers (as a cluster admin can). Front-proxy, client certificates,
//! TokenReview and SubjectAccessReview come with the aggregation work.

use http::HeaderMap;

pub const GROUP_MASTERS: &str = "system:masters";
pub const GROUP_AUTHENTICATED: &str = "system:authenticated";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
    pub uid: String,
}

impl Identity {
    pub fn dev_admin() -> Self {
        Self {
            user: "system:admin".into(),
            groups: vec![GROUP_MASTERS.into(), GROUP_AUTHENTICATED.into()],
            uid: String::new(),
        }
    }

    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == GROUP_MASTERS)
    }
}

/// The dev authenticator: the admin identity, or whom the admin impersonates.
pub fn authenticate_dev(headers: &HeaderMap) -> Identity {
    let admin = Identity::dev_admin();
    let Some(user) = headers
        .get("impersonate-user")
        .and_then(|v| v.to_str().ok())
        .filter(|u| !u.is_empty())
    else {
        return admin;
    };
    let mut groups: Vec<String> = headers
        .get_all("impersonate-group")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_string)
        .collect();
    // kube adds system:authenticated to impersonated users (not to system:anonymous).
    if user != "system:anonymous" && !groups.iter().any(|g| g == GROUP_AUTHENTICATED) {
        groups.push(GROUP_AUTHENTICATED.into());
    }
    Identity {
        user: user.to_string(),
        groups,
        uid: headers
            .get("impersonate-uid")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impersonation_in_dev_mode() {
        let mut h = HeaderMap::new();
        assert!(authenticate_dev(&h).is_master());
        h.insert("impersonate-user", "alice".parse().expect("hv"));
        h.append("impersonate-group", "tenants".parse().expect("hv"));
        let id = authenticate_dev(&h);
        assert_eq!(id.user, "alice");
        assert_eq!(id.groups, ["tenants", GROUP_AUTHENTICATED]);
        assert!(!id.is_master());
    }
}
