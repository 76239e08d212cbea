//! The `alertmanager` sink: alerts POSTed to Alertmanager's API v2 (`/api/v2/alerts`), so
//! fleetmend's alarms are routed, grouped, silenced and inhibited with everything else.
//!
//! Alertmanager identifies an alert by its labels: `alertname` (by event kind:
//! `FleetmendNodeUnhealthy`, `FleetmendRepairFailed`, `FleetmendActionHeld`,
//! `FleetmendBreakerOpen`, `FleetmendNodeUnknown`), `node` (when the event has one), `severity`
//! and the sink's extra labels. The node's state is an annotation, not a label: a node walks
//! through several states while one problem lasts, and a label per state would raise a new alert
//! at every step and resolve only the last one.
//!
//! Alertmanager expects firing alerts to be re-sent or they expire after its `resolve_timeout`;
//! fleetmend sends each event once, so a firing alert carries `endsAt` = raised + `firing_ttl`
//! and the clearing event ends it (`endsAt` = the event's time). Sending one alert name at one
//! severity also resolves it at the other severities, so a problem that grows from `warning` to
//! `critical` stays one alert. A node healthy again (its state) resolves every alert of that node
//! but `FleetmendNodeUnknown` (resolved when the node comes into the inventory); a repair that
//! finished well resolves `FleetmendRepairFailed`, an approval `FleetmendActionHeld`, a closed
//! breaker `FleetmendBreakerOpen`. Re-sending is harmless: Alertmanager merges by labels.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::alerts::{Condition, Delivery, description, iso8601, problem_name, summary};
use crate::model::{Event, EventKind, Severity};

const SEVERITIES: [Severity; 3] = [Severity::Info, Severity::Warning, Severity::Critical];

/// Labels fleetmend sets itself; extra labels may not replace them.
const RESERVED_LABELS: [&str; 3] = ["alertname", "node", "severity"];

/// An alert as `POST /api/v2/alerts` takes it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct PostableAlert {
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    starts_at: Option<String>,
    ends_at: String,
}

/// Whether `name = value` may be an extra label of an alertmanager sink.
pub fn check_extra_label(name: &str, value: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid || name.starts_with("__") {
        return Err(format!("{name:?} is not a label name ([a-zA-Z_][a-zA-Z0-9_]*, not __*)"));
    }
    if RESERVED_LABELS.contains(&name) {
        return Err(format!("{name:?} is set by fleetmend"));
    }
    if value.is_empty() {
        return Err("must not be empty".to_owned());
    }
    Ok(())
}

/// The `alertname` of the problem an event kind raises.
pub fn alertname(kind: EventKind) -> String {
    format!("Fleetmend{}", problem_name(kind))
}

/// Renders events for one alertmanager sink.
#[derive(Debug)]
pub(crate) struct AlertmanagerFormat {
    url: String,
    labels: BTreeMap<String, String>,
    firing_ttl: Duration,
    /// The alert names a node can have at this sink: those a node healthy again resolves.
    node_alertnames: Vec<String>,
}

impl AlertmanagerFormat {
    pub(crate) fn new(
        base_url: &str,
        labels: BTreeMap<String, String>,
        firing_ttl: Duration,
        kinds: &[EventKind],
    ) -> AlertmanagerFormat {
        let base = base_url.trim_end_matches('/');
        let url = if base.ends_with("/api/v2/alerts") {
            base.to_owned()
        } else {
            format!("{base}/api/v2/alerts")
        };
        // A node outside the inventory stays unknown whatever its state: its own event clears it.
        let mut node_alertnames: Vec<String> = kinds
            .iter()
            .filter(|kind| {
                !matches!(
                    kind,
                    EventKind::Breaker | EventKind::NodeUnknown | EventKind::LeaderChanged
                )
            })
            .map(|kind| alertname(*kind))
            .collect();
        node_alertnames.sort();
        node_alertnames.dedup();
        AlertmanagerFormat { url, labels, firing_ttl, node_alertnames }
    }

    pub(crate) fn render(&self, event: &Event) -> Result<Option<Delivery>, serde_json::Error> {
        let alerts = self.alerts(event);
        if alerts.is_empty() {
            return Ok(None);
        }
        Ok(Some(Delivery {
            url: self.url.clone(),
            content_type: "application/json",
            headers: Vec::new(),
            body: serde_json::to_vec(&alerts)?,
        }))
    }

    fn alerts(&self, event: &Event) -> Vec<PostableAlert> {
        let mut annotations = BTreeMap::new();
        annotations.insert("summary".to_owned(), summary(event));
        annotations.insert("description".to_owned(), description(event));
        annotations.insert("event_kind".to_owned(), event.kind.as_str().to_owned());
        annotations.insert("event_id".to_owned(), event.id.to_string());
        annotations.insert("actor".to_owned(), event.actor.to_string());
        if let Some(state) = event.to_state {
            annotations.insert("state".to_owned(), state.to_string());
        }
        if let Some(state) = event.from_state {
            annotations.insert("previous_state".to_owned(), state.to_string());
        }
        if let Some(action) = event.action {
            annotations.insert("action".to_owned(), action.to_string());
        }
        let at = iso8601(event.at_ms);
        let alert = |name: &str, severity: Severity, firing: bool| {
            let mut labels = self.labels.clone();
            labels.insert("alertname".to_owned(), name.to_owned());
            if let Some(node) = &event.node {
                labels.insert("node".to_owned(), node.clone());
            }
            labels.insert("severity".to_owned(), severity_label(severity).to_owned());
            if firing {
                let ends = event.at_ms.saturating_add(self.firing_ttl.as_millis() as u64);
                PostableAlert {
                    labels,
                    annotations: annotations.clone(),
                    starts_at: Some(at.clone()),
                    ends_at: iso8601(ends),
                }
            } else {
                // No startsAt: Alertmanager takes endsAt, and merges this into the firing alert.
                PostableAlert {
                    labels,
                    annotations: annotations.clone(),
                    starts_at: None,
                    ends_at: at.clone(),
                }
            }
        };
        match Condition::of(event) {
            Condition::Alarm => {
                let name = alertname(event.kind);
                SEVERITIES
                    .into_iter()
                    .map(|severity| alert(&name, severity, severity == event.severity))
                    .collect()
            }
            Condition::Clear => {
                let names = match event.kind {
                    EventKind::Breaker => vec![alertname(EventKind::Breaker)],
                    EventKind::Approved => vec![alertname(EventKind::ActionHeld)],
                    // Only the node's state says it is healthy again: a repair that "worked" may
                    // leave it drained.
                    EventKind::StateChanged if event.node.is_some() => self.node_alertnames.clone(),
                    kind => vec![alertname(kind)],
                };
                names
                    .iter()
                    .flat_map(|name| {
                        SEVERITIES.into_iter().map(|severity| alert(name, severity, false))
                    })
                    .collect()
            }
        }
    }
}

fn severity_label(severity: Severity) -> &'static str {
    match severity {
        Severity::Info => "info",
        Severity::Warning => "warning",
        Severity::Critical => "critical",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alerts::DEFAULT_KINDS;
    use crate::model::{Actor, NodeState};

    fn format() -> AlertmanagerFormat {
        let labels = BTreeMap::from([("cluster".to_owned(), "a".to_owned())]);
        AlertmanagerFormat::new(
            "http://am:9093/",
            labels,
            Duration::from_secs(3600),
            &DEFAULT_KINDS,
        )
    }

    #[test]
    fn url_gets_the_api_path_once() {
        assert_eq!(format().url, "http://am:9093/api/v2/alerts");
        let direct = AlertmanagerFormat::new(
            "http://am/api/v2/alerts",
            BTreeMap::new(),
            Duration::from_secs(1),
            &[],
        );
        assert_eq!(direct.url, "http://am/api/v2/alerts");
    }

    #[test]
    fn an_alarm_fires_at_its_severity_and_resolves_the_others() {
        let mut event = Event::new(
            EventKind::StateChanged,
            Severity::Critical,
            Some("n1"),
            Actor::repairer(),
            "Xid 79",
            1_000,
        );
        event.from_state = Some(NodeState::Suspect);
        event.to_state = Some(NodeState::Draining);
        let alerts = format().alerts(&event);
        assert_eq!(alerts.len(), 3);
        let firing: Vec<_> = alerts.iter().filter(|alert| alert.starts_at.is_some()).collect();
        assert_eq!(firing.len(), 1);
        let labels = &firing[0].labels;
        assert_eq!(labels["alertname"], "FleetmendNodeUnhealthy");
        assert_eq!(labels["node"], "n1");
        assert_eq!(labels["severity"], "critical");
        assert_eq!(labels["cluster"], "a");
        assert!(!labels.contains_key("state"));
        assert_eq!(firing[0].annotations["state"], "draining");
        assert_eq!(firing[0].ends_at, iso8601(1_000 + 3_600_000));
        for resolved in alerts.iter().filter(|alert| alert.starts_at.is_none()) {
            assert_eq!(resolved.ends_at, iso8601(1_000));
            assert_ne!(resolved.labels["severity"], "critical");
        }
    }

    #[test]
    fn healthy_again_resolves_every_alert_of_the_node() {
        let mut event = Event::new(
            EventKind::StateChanged,
            Severity::Info,
            Some("n1"),
            Actor::repairer(),
            "validated",
            2_000,
        );
        event.to_state = Some(NodeState::Healthy);
        let alerts = format().alerts(&event);
        assert!(alerts.iter().all(|alert| alert.starts_at.is_none()));
        let mut names: Vec<_> =
            alerts.iter().map(|alert| alert.labels["alertname"].as_str()).collect();
        names.dedup();
        assert_eq!(
            names,
            vec!["FleetmendActionHeld", "FleetmendNodeUnhealthy", "FleetmendRepairFailed"]
        );
        assert_eq!(alerts.len(), 9);
    }

    #[test]
    fn a_repair_that_worked_resolves_only_the_repair_alert() {
        let event = Event::new(
            EventKind::RepairFinished,
            Severity::Info,
            Some("n1"),
            Actor::repairer(),
            "drained until its findings clear",
            3_000,
        );
        let alerts = format().alerts(&event);
        assert_eq!(alerts.len(), 3);
        assert!(alerts.iter().all(|alert| alert.starts_at.is_none()
            && alert.labels["alertname"] == "FleetmendRepairFailed"));
        let approved = Event { kind: EventKind::Approved, ..event };
        assert!(
            format()
                .alerts(&approved)
                .iter()
                .all(|alert| alert.labels["alertname"] == "FleetmendActionHeld")
        );
    }

    #[test]
    fn extra_labels_are_checked() {
        assert!(check_extra_label("cluster", "a").is_ok());
        assert!(check_extra_label("9x", "a").is_err());
        assert!(check_extra_label("__x", "a").is_err());
        assert!(check_extra_label("node", "a").is_err());
        assert!(check_extra_label("cluster", "").is_err());
    }
}
