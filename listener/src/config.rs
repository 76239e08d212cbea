//! `[listener]` of the agent's and the repairer's configs: the deadlines of each phase of a
//! connection and the cap on open connections.
//!
//! Both processes read the same section with defaults of their own (an agent serves a scrape or
//! two; a repairer holds a kept-alive connection per agent): a field left out takes the process's
//! default, not the other's.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// `[listener]`: what a client may take of a listener's time and descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerConfig {
    /// How long a client has to send a request's head (request line and headers): from the
    /// connection's accept for its first request (the TLS handshake included, on a TLS listener),
    /// from the first byte of the next request on a kept-alive connection. Past it the connection
    /// is closed (`phase="header"`, or `"handshake"` when the handshake had not finished).
    pub header_timeout: Duration,
    /// How long a client has to send a request's whole body once its head is in; past it the
    /// connection is closed (`phase="body"`).
    pub body_timeout: Duration,
    /// How long a connection may stay open with nothing moving on it: between requests on a
    /// kept-alive connection, or while the client does not read a response. Past it the
    /// connection is closed (`phase="idle"`).
    pub idle_timeout: Duration,
    /// Most connections open at once, TLS handshakes included. A connection beyond it is closed
    /// as soon as it is accepted and counted (`fleetmend_http_connections_shed_total`). The
    /// process raises its descriptor limit to fit it, or lowers it to fit the limit (and says so).
    pub max_connections: u32,
}

impl ListenerConfig {
    /// The repairer's defaults, for a fleet of 10,000 agents reporting every 10 s: an agent keeps
    /// one connection open between its reports (idle longer than the report interval), so the cap
    /// leaves room for the fleet, Prometheus, the CLI and a reconnect storm after a restart.
    pub const REPAIRER: ListenerConfig = ListenerConfig {
        header_timeout: Duration::from_secs(10),
        body_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(30),
        max_connections: 16_384,
    };

    /// The agent's defaults: Prometheus (a pair of them) and health probes. Idle longer than a
    /// 60 s scrape interval, so a scraper keeps its connection; few connections, so an agent
    /// under attack holds little memory and few descriptors.
    pub const AGENT: ListenerConfig = ListenerConfig {
        header_timeout: Duration::from_secs(10),
        body_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(90),
        max_connections: 128,
    };

    /// Every problem of this section, each naming its field under `section` (`listener`).
    pub fn problems(&self, section: &str) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        for (field, value) in [
            ("header_timeout", self.header_timeout),
            ("body_timeout", self.body_timeout),
            ("idle_timeout", self.idle_timeout),
        ] {
            if value.is_zero() {
                problems.push((format!("{section}.{field}"), "must be greater than zero".into()));
            }
        }
        if self.max_connections == 0 {
            problems.push((format!("{section}.max_connections"), "must be at least 1".into()));
        }
        problems
    }

    /// Reads `[listener]` over the repairer's defaults (`deserialize_with`).
    pub fn repairer<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<ListenerConfig, D::Error> {
        Fields::deserialize(deserializer).map(|fields| fields.over(ListenerConfig::REPAIRER))
    }

    /// Reads `[listener]` over the agent's defaults (`deserialize_with`).
    pub fn agent<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ListenerConfig, D::Error> {
        Fields::deserialize(deserializer).map(|fields| fields.over(ListenerConfig::AGENT))
    }
}

/// The fields as written; those left out take the process's default.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Fields {
    #[serde(default, with = "humantime_serde::option")]
    header_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde::option")]
    body_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde::option")]
    idle_timeout: Option<Duration>,
    #[serde(default)]
    max_connections: Option<u32>,
}

impl Fields {
    fn over(self, defaults: ListenerConfig) -> ListenerConfig {
        ListenerConfig {
            header_timeout: self.header_timeout.unwrap_or(defaults.header_timeout),
            body_timeout: self.body_timeout.unwrap_or(defaults.body_timeout),
            idle_timeout: self.idle_timeout.unwrap_or(defaults.idle_timeout),
            max_connections: self.max_connections.unwrap_or(defaults.max_connections),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[derive(Debug, Deserialize)]
    struct Repairer {
        #[serde(deserialize_with = "ListenerConfig::repairer", default = "repairer")]
        listener: ListenerConfig,
    }

    fn repairer() -> ListenerConfig {
        ListenerConfig::REPAIRER
    }

    #[derive(Debug, Deserialize)]
    struct Agent {
        #[serde(deserialize_with = "ListenerConfig::agent")]
        listener: ListenerConfig,
    }

    #[test]
    fn a_field_left_out_takes_the_process_default() {
        let absent: Repairer = toml::from_str("").unwrap();
        assert_eq!(absent.listener, ListenerConfig::REPAIRER);
        let repairer: Repairer = toml::from_str("[listener]\nheader_timeout = \"2s\"\n").unwrap();
        assert_eq!(repairer.listener.header_timeout, Duration::from_secs(2));
        assert_eq!(repairer.listener.max_connections, 16_384);
        assert_eq!(repairer.listener.idle_timeout, Duration::from_secs(30));
        let agent: Agent = toml::from_str("[listener]\nbody_timeout = \"1m\"\n").unwrap();
        assert_eq!(agent.listener.body_timeout, Duration::from_secs(60));
        assert_eq!(agent.listener.max_connections, 128);
        assert_eq!(agent.listener.idle_timeout, Duration::from_secs(90));
        assert_eq!(agent.listener.header_timeout, Duration::from_secs(10));
    }

    #[test]
    fn defaults_are_valid_and_bad_fields_are_named() {
        assert!(ListenerConfig::REPAIRER.problems("listener").is_empty());
        assert!(ListenerConfig::AGENT.problems("listener").is_empty());
        let agent: Agent = toml::from_str(
            "[listener]\nheader_timeout = \"0s\"\nbody_timeout = \"0s\"\nidle_timeout = \"0s\"\n\
             max_connections = 0\n",
        )
        .unwrap();
        let fields: Vec<String> =
            agent.listener.problems("listener").into_iter().map(|p| p.0).collect();
        assert_eq!(
            fields,
            [
                "listener.header_timeout",
                "listener.body_timeout",
                "listener.idle_timeout",
                "listener.max_connections"
            ]
        );
    }

    #[test]
    fn unknown_fields_and_untyped_durations_are_refused() {
        let err = toml::from_str::<Agent>("[listener]\nheader_timout = \"1s\"\n").unwrap_err();
        assert!(err.to_string().contains("header_timout"), "{err}");
        let err = toml::from_str::<Agent>("[listener]\nidle_timeout = 5\n").unwrap_err();
        assert!(err.to_string().contains("idle_timeout"), "{err}");
    }
}
