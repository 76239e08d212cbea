//! The `redfish` provider: each node's BMC over Redfish (DMTF DSP0266).
//!
//! Reboot reads the node's `ComputerSystem`, posts its `#ComputerSystem.Reset` action (the target
//! the resource advertises, so BMCs with odd action paths work) and polls `PowerState` until the
//! node reads On again. A BMC cannot provision a new machine, so replace is unsupported.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use fleetmend_proto::http_client::{CaFileError, Roots};
use reqwest::{StatusCode, Url};
use serde::Deserialize;
use tokio::time::Instant;

use super::config::ConfigProblem;
use super::{PowerState, Provider, ProviderError, check_substitutable_node_name};
use crate::scheduler::BoxFuture;

const PROVIDER: &str = "redfish";

/// The placeholder in `system_url` replaced by the node's name.
pub const NODE_PLACEHOLDER: &str = "{node}";

/// Redirects followed per request: names redirect to UUID paths on some BMCs (one hop); more is a
/// misconfiguration.
const MAX_REDIRECTS: usize = 5;

/// The most of a response body read (a `ComputerSystem` is a few KiB).
const MAX_BODY_BYTES: usize = 1024 * 1024;

/// A password: kept out of `Debug` output and logs.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(secret: impl Into<String>) -> Secret {
        Secret(secret.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The `ResetType` a reboot posts (Redfish's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum RedfishResetType {
    /// Restart at once, no OS shutdown: a sick node may not shut down cleanly.
    #[default]
    ForceRestart,
    /// Ask the OS to restart.
    GracefulRestart,
    /// Power off, then on.
    PowerCycle,
}

impl RedfishResetType {
    pub fn as_str(self) -> &'static str {
        match self {
            RedfishResetType::ForceRestart => "ForceRestart",
            RedfishResetType::GracefulRestart => "GracefulRestart",
            RedfishResetType::PowerCycle => "PowerCycle",
        }
    }
}

/// `[provider]` with `kind = "redfish"`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedfishProviderConfig {
    /// The URL of each node's `ComputerSystem` resource, `{node}` replaced by the node's name:
    /// `https://{node}-bmc/redfish/v1/Systems/1`.
    #[serde(default)]
    pub system_url: Option<String>,
    /// Node → the URL of its `ComputerSystem`, for nodes the template does not fit (wins over
    /// `system_url`).
    #[serde(default)]
    pub systems: BTreeMap<String, String>,
    /// The BMC user for HTTP Basic auth; empty: no auth.
    #[serde(default)]
    pub user: String,
    /// The BMC password (prefer `password_file`).
    #[serde(default)]
    pub password: Option<Secret>,
    /// A file holding the BMC password (trailing whitespace ignored).
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// A PEM file of CA certificates trusted in addition to the system's (a BMC fleet's own CA).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Skips TLS certificate verification (self-signed BMC certificates). Off by default.
    #[serde(default)]
    pub insecure_tls: bool,
    /// The limit for one HTTP request to a BMC.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// The `ResetType` a reboot posts (`ForceRestart`, `GracefulRestart`, `PowerCycle`); a node
    /// that reads Off is sent `On` instead.
    #[serde(default)]
    pub reset_type: RedfishResetType,
    /// How long a reboot may take, from the reset request until `PowerState` reads On.
    #[serde(default = "default_reboot_timeout", with = "humantime_serde")]
    pub reboot_timeout: Duration,
    /// How often `PowerState` is read while waiting for the node to come back.
    #[serde(default = "default_poll_interval", with = "humantime_serde")]
    pub poll_interval: Duration,
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_reboot_timeout() -> Duration {
    Duration::from_secs(10 * 60)
}

fn default_poll_interval() -> Duration {
    Duration::from_secs(5)
}

impl RedfishProviderConfig {
    /// A config for BMCs at `system_url` (a template with `{node}`), no auth, default timings.
    pub fn new(system_url: impl Into<String>) -> RedfishProviderConfig {
        RedfishProviderConfig {
            system_url: Some(system_url.into()),
            systems: BTreeMap::new(),
            user: String::new(),
            password: None,
            password_file: None,
            ca_file: None,
            insecure_tls: false,
            timeout: default_timeout(),
            reset_type: RedfishResetType::default(),
            reboot_timeout: default_reboot_timeout(),
            poll_interval: default_poll_interval(),
        }
    }

    /// Adds every problem, naming fields under `section` (e.g. `provider`).
    pub fn validate(&self, section: &str, problems: &mut Vec<ConfigProblem>) {
        let field = |name: &str| format!("{section}.{name}");
        match &self.system_url {
            None if self.systems.is_empty() => problems.push(ConfigProblem::new(
                field("system_url"),
                "set system_url (a URL template with {node}) or systems (node = URL)",
            )),
            None => {}
            Some(template) => {
                if !template.contains(NODE_PLACEHOLDER) {
                    problems.push(ConfigProblem::new(
                        field("system_url"),
                        format!("{template:?} has no {{node}}: every node would reach one BMC"),
                    ));
                }
                if let Err(why) = parse_http_url(&template.replace(NODE_PLACEHOLDER, "node")) {
                    problems.push(ConfigProblem::new(field("system_url"), why));
                }
            }
        }
        for (node, url) in &self.systems {
            if let Err(why) = parse_http_url(url) {
                problems.push(ConfigProblem::new(field(&format!("systems.{node}")), why));
            }
        }
        match (&self.password, &self.password_file) {
            (Some(_), Some(_)) => problems.push(ConfigProblem::new(
                field("password_file"),
                "set either password or password_file, not both",
            )),
            (None, None) if !self.user.is_empty() => problems.push(ConfigProblem::new(
                field("password"),
                format!("user {:?} is set: set password or password_file", self.user),
            )),
            (Some(_), None) | (None, Some(_)) if self.user.is_empty() => {
                problems.push(ConfigProblem::new(field("user"), "is empty but a password is set"))
            }
            _ => {}
        }
        for (name, value) in [
            ("timeout", self.timeout),
            ("reboot_timeout", self.reboot_timeout),
            ("poll_interval", self.poll_interval),
        ] {
            if value.is_zero() {
                problems.push(ConfigProblem::new(field(name), "must be greater than zero"));
            }
        }
        if self.poll_interval > self.reboot_timeout {
            problems.push(ConfigProblem::new(
                field("poll_interval"),
                "is longer than reboot_timeout: the node would never be seen back",
            ));
        }
    }
}

fn parse_http_url(text: &str) -> Result<Url, String> {
    let url = Url::parse(text).map_err(|error| format!("{text:?} is not a URL: {error}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("{text:?} is not an http:// or https:// URL"));
    }
    Ok(url)
}

/// Setting up the Redfish client failed.
#[derive(Debug, thiserror::Error)]
pub enum RedfishSetupError {
    #[error("reading the Redfish password from {path}: {source}")]
    PasswordFile { path: PathBuf, source: std::io::Error },
    #[error("trusting the BMCs' CA: {0}")]
    Ca(#[from] CaFileError),
    #[error("building the Redfish HTTP client: {0}")]
    Client(#[source] reqwest::Error),
}

/// What one read of a node's `ComputerSystem` said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemView {
    /// Where the resource was found after redirects (names often redirect to UUID paths).
    pub url: Url,
    pub power_state: PowerState,
    /// Where `#ComputerSystem.Reset` is posted.
    pub reset_target: Url,
    /// The reset types the BMC offers, when it says.
    pub allowed_reset_types: Option<Vec<String>>,
}

/// Maps Redfish's `PowerState`.
pub fn power_state_from_redfish(value: Option<&str>) -> PowerState {
    match value {
        Some("On") => PowerState::On,
        Some("Off") => PowerState::Off,
        Some("PoweringOn") => PowerState::PoweringOn,
        Some("PoweringOff") => PowerState::PoweringOff,
        // `Paused` (Redfish 2020.4) and anything newer: the provider cannot tell.
        _ => PowerState::Unknown,
    }
}

/// The message of a Redfish error body (`error.message` and the extended messages), if any.
pub fn redfish_error_message(body: &[u8]) -> Option<String> {
    let body: serde_json::Value = serde_json::from_slice(body).ok()?;
    let error = body.get("error")?;
    let mut parts: Vec<String> = Vec::new();
    if let Some(message) = error.get("message").and_then(|m| m.as_str()) {
        parts.push(message.to_owned());
    }
    if let Some(extended) = error.get("@Message.ExtendedInfo").and_then(|e| e.as_array()) {
        for info in extended {
            if let Some(message) = info.get("Message").and_then(|m| m.as_str())
                && !parts.iter().any(|p| p == message)
            {
                parts.push(message.to_owned());
            }
        }
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// A request to a BMC failed.
#[derive(Debug)]
enum RequestFailure {
    /// No answer within the request timeout.
    Timeout,
    /// No answer at all (connect, TLS, reset), or an unreadable one.
    Transport(String),
    /// An answer that is not a success.
    Status { status: StatusCode, message: String },
}

impl RequestFailure {
    /// Waiting does not help: credentials or the URL are wrong.
    fn is_permanent(&self) -> bool {
        matches!(
            self,
            RequestFailure::Status { status, .. }
                if matches!(*status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::NOT_FOUND)
        )
    }
}

/// `error` and its sources: reqwest's own message rarely says what went wrong.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Reboots nodes through their BMCs.
#[derive(Debug, Clone)]
pub struct RedfishProvider {
    client: reqwest::Client,
    config: RedfishProviderConfig,
    password: Option<Secret>,
}

impl RedfishProvider {
    /// A provider for `config` (validated by the caller): reads the password file and the CA file.
    pub fn new(config: RedfishProviderConfig) -> Result<RedfishProvider, RedfishSetupError> {
        let password = match (&config.password, &config.password_file) {
            (Some(password), _) => Some(password.clone()),
            (None, Some(path)) => Some(Secret::new(
                std::fs::read_to_string(path)
                    .map_err(|source| RedfishSetupError::PasswordFile {
                        path: path.clone(),
                        source,
                    })?
                    .trim_end(),
            )),
            (None, None) => None,
        };
        let roots = config.ca_file.as_deref().map_or(Roots::System, Roots::SystemAnd);
        let client = fleetmend_proto::http_client::builder(roots)?
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            .redirect(reqwest::redirect::Policy::limited(MAX_REDIRECTS))
            .user_agent(concat!("fleetmend-repairer/", env!("CARGO_PKG_VERSION")))
            .tls_danger_accept_invalid_certs(config.insecure_tls)
            .build()
            .map_err(RedfishSetupError::Client)?;
        Ok(RedfishProvider { client, config, password })
    }

    /// The URL of `node`'s `ComputerSystem`.
    pub fn system_url(&self, node: &str) -> Result<Url, ProviderError> {
        let failed = |message: String| ProviderError::Failed {
            provider: PROVIDER,
            operation: "locate",
            node: node.to_owned(),
            message,
        };
        let text = match (self.config.systems.get(node), &self.config.system_url) {
            (Some(url), _) => url.clone(),
            (None, Some(template)) => {
                check_substitutable_node_name(node).map_err(|e| failed(e.to_string()))?;
                template.replace(NODE_PLACEHOLDER, node)
            }
            (None, None) => {
                return Err(failed("no system URL: the node is not in systems".to_owned()));
            }
        };
        parse_http_url(&text).map_err(failed)
    }

    fn failure_to_error(
        &self,
        operation: &'static str,
        node: &str,
        url: &Url,
        failure: RequestFailure,
    ) -> ProviderError {
        let message = match failure {
            RequestFailure::Timeout => {
                return ProviderError::Timeout {
                    provider: PROVIDER,
                    operation,
                    node: node.to_owned(),
                    seconds: self.config.timeout.as_secs(),
                };
            }
            RequestFailure::Transport(message) => format!("{url}: {message}"),
            RequestFailure::Status { status: StatusCode::UNAUTHORIZED, message } => format!(
                "the BMC at {url} refused the credentials of user {:?} (HTTP 401 Unauthorized: \
                 {message}): check the provider's user and password",
                self.config.user
            ),
            RequestFailure::Status { status, message } => {
                format!("{url}: HTTP {status}: {message}")
            }
        };
        ProviderError::Failed { provider: PROVIDER, operation, node: node.to_owned(), message }
    }

    async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<(Url, Vec<u8>), RequestFailure> {
        let mut request = request
            .header(reqwest::header::ACCEPT, "application/json")
            .header("OData-Version", "4.0");
        if !self.config.user.is_empty() {
            request =
                request.basic_auth(&self.config.user, self.password.as_ref().map(Secret::expose));
        }
        let transport = |error: reqwest::Error| {
            if error.is_timeout() {
                RequestFailure::Timeout
            } else {
                RequestFailure::Transport(error_chain(&error))
            }
        };
        let mut response = request.send().await.map_err(transport)?;
        let status = response.status();
        let url = response.url().clone();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(transport)? {
            let room = MAX_BODY_BYTES - body.len();
            body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if body.len() == MAX_BODY_BYTES {
                break;
            }
        }
        if !status.is_success() {
            let message = redfish_error_message(&body).unwrap_or_else(|| {
                let text = String::from_utf8_lossy(&body);
                let text = text.trim();
                if text.is_empty() {
                    status.canonical_reason().unwrap_or("no message").to_owned()
                } else {
                    text.chars().take(300).collect()
                }
            });
            return Err(RequestFailure::Status { status, message });
        }
        Ok((url, body))
    }

    async fn get_system(&self, url: &Url) -> Result<SystemView, RequestFailure> {
        let (url, body) = self.send(self.client.get(url.clone())).await?;
        let system: serde_json::Value = serde_json::from_slice(&body).map_err(|error| {
            RequestFailure::Transport(format!("the ComputerSystem is not JSON: {error}"))
        })?;
        let power_state =
            power_state_from_redfish(system.get("PowerState").and_then(|p| p.as_str()));
        let reset = system.get("Actions").and_then(|a| a.get("#ComputerSystem.Reset"));
        let advertised_target = reset.and_then(|r| r.get("target")).and_then(|t| t.as_str());
        // The standard path is the fallback for BMCs that do not advertise the action.
        let reset_target = match advertised_target {
            Some(target) => url.join(target),
            None => Url::parse(&format!(
                "{}/Actions/ComputerSystem.Reset",
                url.as_str().trim_end_matches('/')
            )),
        }
        .map_err(|error| {
            RequestFailure::Transport(format!("the reset action's target is not a URL: {error}"))
        })?;
        let allowed_reset_types = reset
            .and_then(|r| r.get("ResetType@Redfish.AllowableValues"))
            .and_then(|v| v.as_array())
            .map(|values| values.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect());
        Ok(SystemView { url, power_state, reset_target, allowed_reset_types })
    }

    /// Reads `node`'s `ComputerSystem`.
    pub async fn read_system(&self, node: &str) -> Result<SystemView, ProviderError> {
        let url = self.system_url(node)?;
        self.get_system(&url)
            .await
            .map_err(|failure| self.failure_to_error("power_state", node, &url, failure))
    }

    /// Posts the reset for `node` and returns the system as read just before it (its `url` is the
    /// resolved one, good for polling).
    pub async fn reset(&self, node: &str) -> Result<SystemView, ProviderError> {
        let url = self.system_url(node)?;
        let system = self
            .get_system(&url)
            .await
            .map_err(|failure| self.failure_to_error("reboot", node, &url, failure))?;
        // ForceRestart of a node that is off does nothing on many BMCs; a repair wants it running.
        let reset_type = if system.power_state == PowerState::Off {
            "On"
        } else {
            self.config.reset_type.as_str()
        };
        if let Some(allowed) = &system.allowed_reset_types
            && !allowed.iter().any(|a| a == reset_type)
        {
            return Err(ProviderError::Failed {
                provider: PROVIDER,
                operation: "reboot",
                node: node.to_owned(),
                message: format!(
                    "the BMC at {} does not offer ResetType {reset_type} (it offers {})",
                    system.url,
                    allowed.join(", ")
                ),
            });
        }
        tracing::info!(node, target = %system.reset_target, reset_type, "posting the Redfish reset");
        // reqwest follows a 307/308 here with the method and body kept, in case the target
        // redirects as well.
        self.send(
            self.client
                .post(system.reset_target.clone())
                .json(&serde_json::json!({ "ResetType": reset_type })),
        )
        .await
        .map_err(|failure| self.failure_to_error("reboot", node, &system.reset_target, failure))?;
        Ok(system)
    }

    /// Polls `url` until the node reads On, or `deadline`.
    async fn wait_for_power_on(
        &self,
        node: &str,
        url: &Url,
        deadline: Instant,
    ) -> Result<(), ProviderError> {
        loop {
            // The first read waits one interval: right after the reset a BMC may still read On.
            let next = (Instant::now() + self.config.poll_interval).min(deadline);
            tokio::time::sleep_until(next).await;
            let last = match self.get_system(url).await {
                Ok(system) if system.power_state == PowerState::On => return Ok(()),
                Ok(system) => format!("power state {:?}", system.power_state),
                Err(failure) if failure.is_permanent() => {
                    return Err(self.failure_to_error("reboot", node, url, failure));
                }
                // A BMC busy with the reset may drop a request; the next poll tries again.
                Err(failure) => format!("{failure:?}"),
            };
            tracing::debug!(node, last = %last, "waiting for the node to read On");
            if Instant::now() >= deadline {
                tracing::warn!(node, last = %last, "the node did not read On before the reboot timeout");
                return Err(ProviderError::Timeout {
                    provider: PROVIDER,
                    operation: "reboot",
                    node: node.to_owned(),
                    seconds: self.config.reboot_timeout.as_secs(),
                });
            }
        }
    }
}

impl Provider for RedfishProvider {
    fn name(&self) -> &'static str {
        PROVIDER
    }

    /// Resets the node and returns once its BMC reads On again (bounded by `reboot_timeout`).
    fn reboot<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let deadline = Instant::now() + self.config.reboot_timeout;
            let system = self.reset(node).await?;
            self.wait_for_power_on(node, &system.url, deadline).await
        })
    }

    fn power_state<'a>(
        &'a self,
        node: &'a str,
    ) -> BoxFuture<'a, Result<PowerState, ProviderError>> {
        Box::pin(async move { Ok(self.read_system(node).await?.power_state) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(config: &RedfishProviderConfig) -> Vec<String> {
        let mut problems = Vec::new();
        config.validate("provider", &mut problems);
        problems.into_iter().map(|p| p.field).collect()
    }

    #[test]
    fn config_reads_from_toml_with_defaults() {
        let config: RedfishProviderConfig = toml::from_str(
            r#"
            system_url = "https://{node}-bmc/redfish/v1/Systems/1"
            user = "admin"
            password_file = "/etc/fleetmend/bmc-password"
            reboot_timeout = "5m"
            "#,
        )
        .unwrap();
        assert_eq!(config.reset_type, RedfishResetType::ForceRestart);
        assert_eq!(config.reboot_timeout, Duration::from_secs(300));
        assert_eq!(config.poll_interval, Duration::from_secs(5));
        assert!(!config.insecure_tls);
        assert!(problems(&config).is_empty(), "{:?}", problems(&config));
        let unknown =
            toml::from_str::<RedfishProviderConfig>("system_url = \"x\"\npasword = \"y\"");
        assert!(unknown.is_err());
    }

    #[test]
    fn validate_names_every_bad_field() {
        let mut config = RedfishProviderConfig::new("ftp://bmc/redfish/v1/Systems/1");
        config.user = "admin".to_owned();
        config.poll_interval = Duration::ZERO;
        config.systems.insert("n9".to_owned(), "not a url".to_owned());
        assert_eq!(
            problems(&config),
            [
                "provider.system_url",
                "provider.system_url",
                "provider.systems.n9",
                "provider.password",
                "provider.poll_interval"
            ]
        );
        let mut config = RedfishProviderConfig::new("https://{node}-bmc/redfish/v1/Systems/1");
        config.password = Some(Secret::new("x"));
        config.password_file = Some(PathBuf::from("/x"));
        assert_eq!(problems(&config), ["provider.password_file"]);
        config.password_file = None;
        assert_eq!(problems(&config), ["provider.user"]);
        config.system_url = None;
        config.user = "admin".to_owned();
        assert_eq!(problems(&config), ["provider.system_url"]);
    }

    #[test]
    fn system_urls_come_from_the_map_or_the_template() {
        let mut config = RedfishProviderConfig::new("https://{node}-bmc/redfish/v1/Systems/1");
        config
            .systems
            .insert("odd".to_owned(), "https://10.0.0.9/redfish/v1/Systems/abc".to_owned());
        let provider = RedfishProvider::new(config).unwrap();
        assert_eq!(
            provider.system_url("n1").unwrap().as_str(),
            "https://n1-bmc/redfish/v1/Systems/1"
        );
        assert_eq!(
            provider.system_url("odd").unwrap().as_str(),
            "https://10.0.0.9/redfish/v1/Systems/abc"
        );
        for unsafe_node in ["a/b", "a?b", "a#b", "a b", ""] {
            assert!(provider.system_url(unsafe_node).is_err(), "{unsafe_node:?}");
        }
    }

    #[test]
    fn power_states_map_from_redfish() {
        assert_eq!(power_state_from_redfish(Some("On")), PowerState::On);
        assert_eq!(power_state_from_redfish(Some("Off")), PowerState::Off);
        assert_eq!(power_state_from_redfish(Some("PoweringOn")), PowerState::PoweringOn);
        assert_eq!(power_state_from_redfish(Some("PoweringOff")), PowerState::PoweringOff);
        assert_eq!(power_state_from_redfish(Some("Paused")), PowerState::Unknown);
        assert_eq!(power_state_from_redfish(None), PowerState::Unknown);
    }

    #[test]
    fn redfish_error_bodies_give_their_messages() {
        let body = br#"{"error":{"code":"Base.1.0.GeneralError","message":"Incorrect username or password","@Message.ExtendedInfo":[{"MessageId":"Base.1.0.GeneralError"},{"Message":"Try again"}]}}"#;
        assert_eq!(
            redfish_error_message(body).as_deref(),
            Some("Incorrect username or password; Try again")
        );
        assert_eq!(redfish_error_message(b"<html>"), None);
    }

    #[test]
    fn passwords_stay_out_of_debug_output() {
        let mut config = RedfishProviderConfig::new("https://{node}-bmc/redfish/v1/Systems/1");
        config.user = "admin".to_owned();
        config.password = Some(Secret::new("hunter2"));
        let provider = RedfishProvider::new(config.clone()).unwrap();
        assert!(!format!("{config:?}").contains("hunter2"));
        assert!(!format!("{provider:?}").contains("hunter2"));
    }

    #[test]
    fn a_missing_password_file_is_named() {
        let mut config = RedfishProviderConfig::new("https://{node}-bmc/redfish/v1/Systems/1");
        config.user = "admin".to_owned();
        config.password_file = Some(PathBuf::from("/nonexistent/bmc-password"));
        let error = RedfishProvider::new(config).unwrap_err();
        assert!(error.to_string().contains("/nonexistent/bmc-password"), "{error}");
    }
}
