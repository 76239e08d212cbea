//! Who may do what through the API: named credentials with a role each.
//!
//! - `read`: nodes, events, jobs, evidence, the breaker's state, service discovery;
//! - `operator`: what `read` may, and drain, undrain, repair, approve, close the breaker, submit
//!   and cancel jobs;
//! - `admin`: everything, and the SNS subscription URLs (each confirms a subscription).
//!
//! Agents (the agent token or a node's own token) and alert sources (the alerts token) are not
//! people: their credentials open their own routes only. A credential the repairer knows but whose
//! role falls short is a 403 naming the credential and the role it would need; an unknown one a
//! 401. The repairer keeps only the SHA-256 of a credential given as `sha256`.

use std::path::PathBuf;

use serde::Deserialize;

/// What a person's credential may do; each role may do all that the ones before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    Read,
    Operator,
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One `[[credentials]]` entry of the repairer's config.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialConfig {
    /// Who it is: the name the audit trail gives every action taken with it.
    pub name: String,
    pub role: Role,
    /// The SHA-256 (hex) of the token (`fleetmend token new` prints it).
    #[serde(default)]
    pub sha256: Option<String>,
    /// Or a file holding the token itself.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
}

impl CredentialConfig {
    /// Every problem of entry `index`, naming its field.
    pub fn problems(&self, index: usize) -> Vec<(String, String)> {
        let field = |f: &str| format!("credentials[{index}].{f}");
        let mut problems = Vec::new();
        if !crate::identity::is_credential_name(&self.name) {
            problems.push((
                field("name"),
                format!("{:?} is not a name: 1 to 64 of A-Z a-z 0-9 . _ - @", self.name),
            ));
        }
        match (&self.sha256, &self.token_file) {
            (Some(_), Some(_)) => {
                problems.push((field("token_file"), "set either sha256 or token_file".to_owned()))
            }
            (None, None) => {
                problems.push((field("sha256"), "sha256 or token_file is required".to_owned()))
            }
            (Some(digest), None) if !is_sha256_hex(digest) => problems.push((
                field("sha256"),
                "must be 64 hex digits (the SHA-256 of the token)".to_owned(),
            )),
            _ => {}
        }
        problems
    }
}

/// A person's credential, ready to check tokens against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub name: String,
    pub role: Role,
    /// SHA-256 of the token, lower-case hex.
    pub sha256: String,
}

impl Credential {
    pub fn from_token(name: &str, role: Role, token: &str) -> Credential {
        Credential { name: name.to_owned(), role, sha256: crate::identity::hash(token) }
    }
}

/// The credential among `credentials` whose token `token` is (its hash compared in constant time).
pub fn find<'a>(credentials: &'a [Credential], token: &str) -> Option<&'a Credential> {
    let digest = crate::identity::hash(token);
    credentials.iter().find(|c| constant_time_eq(c.sha256.as_bytes(), digest.as_bytes()))
}

pub fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64 && text.chars().all(|c| c.is_ascii_hexdigit())
}

pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_ordered_and_a_token_finds_its_credential_only() {
        assert!(Role::Read < Role::Operator && Role::Operator < Role::Admin);
        let credentials = [
            Credential::from_token("grafana", Role::Read, "t-read"),
            Credential::from_token("alice", Role::Operator, "t-op"),
        ];
        assert_eq!(find(&credentials, "t-op").map(|c| c.name.as_str()), Some("alice"));
        assert_eq!(find(&credentials, "t-read").map(|c| c.role), Some(Role::Read));
        assert_eq!(find(&credentials, "t-op2"), None);
        assert_eq!(find(&credentials, ""), None);
    }

    #[test]
    fn bad_entries_are_named_by_field() {
        let entry = |name: &str, sha256: Option<&str>, file: Option<&str>| CredentialConfig {
            name: name.to_owned(),
            role: Role::Read,
            sha256: sha256.map(str::to_owned),
            token_file: file.map(PathBuf::from),
        };
        let good = "a".repeat(64);
        assert!(entry("grafana", Some(&good), None).problems(0).is_empty());
        assert!(entry("ci-bot@ops", None, Some("/etc/t")).problems(0).is_empty());
        let fields = |e: CredentialConfig| -> Vec<String> {
            e.problems(3).into_iter().map(|(f, _)| f).collect()
        };
        assert_eq!(fields(entry("bad name", Some(&good), None)), ["credentials[3].name"]);
        assert_eq!(fields(entry("x", Some("abc"), None)), ["credentials[3].sha256"]);
        assert_eq!(fields(entry("x", None, None)), ["credentials[3].sha256"]);
        assert_eq!(fields(entry("x", Some(&good), Some("/t"))), ["credentials[3].token_file"]);
    }
}
