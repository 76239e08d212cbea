//! What a person does through the API: close the breaker, approve a held action, ask for a repair
//! or a drain, put a node back.

use std::sync::Arc;

use super::{BreakerState, Engine, EngineError};
use crate::model::{Actor, Event, EventKind, NodeState, RuleAction, Severity};
use crate::nodes::transition;
use crate::policy::Verdict;
use crate::scheduler::UndrainOutcome;

impl Engine {
    /// A person closes the breaker.
    pub fn close_breaker(self: &Arc<Self>, who: &str) -> Result<BreakerState, EngineError> {
        let now = self.clock.now_ms();
        if self.breaker.close(who, now)? {
            // Nodes that turned unhealthy during the storm must not trip it again at once.
            self.nodes.lock().forget_unhealthy_since();
            self.progress.ring_all();
            // Actions the breaker held are decided again.
            self.wake();
        }
        Ok(self.breaker())
    }

    /// A person approves the action waiting on `node` (approve mode), or any action up to `action`.
    pub fn approve(
        self: &Arc<Self>,
        name: &str,
        action: RuleAction,
        who: &str,
    ) -> Result<(), EngineError> {
        let now = self.clock.now_ms();
        self.nodes.with_node(name, |node, events| {
            events.record(&Event {
                action: Some(action),
                ..Event::new(
                    EventKind::Approved,
                    Severity::Info,
                    Some(name),
                    Actor::person(who),
                    format!("{action} approved"),
                    now,
                )
            })?;
            node.approved = Some(action);
            node.last_noted = None;
            Ok(())
        })?;
        self.evaluate(name, now)
    }

    /// A person asks for `action` (drain, reboot, replace) on `name` now: recorded with the person
    /// as the actor; guard rails other than the breaker and the mode do not apply.
    pub fn request_repair(
        self: &Arc<Self>,
        name: &str,
        action: RuleAction,
        who: &str,
    ) -> Result<i64, EngineError> {
        if !action.is_disruptive() {
            return Err(EngineError::Refused(format!("{action} is not a repair")));
        }
        let now = self.clock.now_ms();
        let mut nodes = self.nodes.lock();
        let node = nodes.get(name).ok_or_else(|| EngineError::UnknownNode(name.to_owned()))?;
        if node.unknown {
            return Err(EngineError::Refused(format!(
                "{name} is not in the inventory: fleetmend does not drain, reboot or replace it"
            )));
        }
        if let Some(id) = node.workflow {
            return Err(EngineError::Refused(format!("{name} is in workflow {id} already")));
        }
        let verdict = Verdict {
            action,
            rule: format!("person:{who}"),
            reason: format!("{who} asked for {action}"),
            findings: node.findings.iter().map(|t| t.finding.clone()).collect(),
            drain_window: None,
            stop_at: None,
        };
        let workflow = self.begin_workflow(&mut nodes, name, &verdict, Actor::person(who), now)?;
        nodes.update(name, |node, _| {
            node.drained_by_person = action == RuleAction::Drain;
            Ok(())
        })?;
        nodes.save(name)?;
        let id = workflow.id;
        drop(nodes);
        self.spawn_workflow(workflow);
        Ok(id)
    }

    /// A person drains `name` through fleetmend (reason prefixed so fleetmend may undrain it).
    pub fn drain(self: &Arc<Self>, name: &str, who: &str) -> Result<i64, EngineError> {
        self.request_repair(name, RuleAction::Drain, who)
    }

    /// A person puts a drained or quarantined node back.
    pub async fn undrain(
        self: &Arc<Self>,
        name: &str,
        who: &str,
    ) -> Result<UndrainOutcome, EngineError> {
        let state = self.node(name).ok_or_else(|| EngineError::UnknownNode(name.to_owned()))?.state;
        if matches!(state, NodeState::Draining | NodeState::Repairing | NodeState::Validating) {
            return Err(EngineError::Refused(format!("{name} is {state}: wait for its workflow")));
        }
        let outcome =
            self.scheduler.undrain(name).await.map_err(|e| EngineError::Refused(e.to_string()))?;
        let now = self.clock.now_ms();
        let cooldown = self.policy.guard_rails.cooldown.as_millis() as u64;
        self.nodes.with_node(name, |node, events| {
            let reason = format!("{who} undrained it ({outcome:?})");
            transition(events, node, NodeState::Healthy, &reason, Actor::person(who), now)?;
            node.cooldown_until_ms = now + cooldown;
            node.last_noted = None;
            node.drained_by_person = false;
            Ok(())
        })?;
        Ok(outcome)
    }
}
