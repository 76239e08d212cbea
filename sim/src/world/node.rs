//! One simulated node: its state, what its agent sees of the fault it carries, and the report
//! the agent sends.

use std::collections::BTreeMap;

use fleetmend_agent::xid;
use fleetmend_local::faults::Fault;
use fleetmend_proto::{
    CommandResult, Finding, RankKey, RankStatus, RecommendedAction, Report, ReportTrigger, Status,
    Verdict, WIRE_VERSION,
};

use crate::catalog::FaultCatalog;
use crate::noise::NodeNoise;

/// A fault on a node.
#[derive(Debug, Clone, PartialEq)]
pub struct ActiveFault {
    pub category: usize,
    pub since_ms: u64,
    /// A repair reported success without fixing it.
    pub latent: bool,
}

/// One simulated node and its agent.
#[derive(Debug)]
pub struct SimNode {
    pub slot: u32,
    pub up: bool,
    pub boot: u32,
    pub seq: u64,
    pub fault: Option<ActiveFault>,
    pub retired: bool,
    /// Where its heartbeats fall within the report interval.
    pub phase_ms: u64,
    pub ranks: BTreeMap<RankKey, RankStatus>,
    /// Command results to carry in the next report.
    pub results: Vec<CommandResult>,
    /// Heartbeats still to send in full while a fault is new.
    pub echoes_left: u32,
    /// Its benign noise, in a noise run.
    pub noise: Option<NodeNoise>,
}

impl SimNode {
    pub(super) fn new(slot: u32, phase_ms: u64) -> SimNode {
        SimNode {
            slot,
            up: true,
            boot: 0,
            seq: 0,
            fault: None,
            retired: false,
            phase_ms,
            ranks: BTreeMap::new(),
            results: Vec::new(),
            echoes_left: 0,
            noise: None,
        }
    }

    /// Whether a fault of `category` asks the repairer for an action: a finding that fails with
    /// a repair or a drain recommended, or a node that falls silent.
    pub fn fault_asks_for_action(catalog: &FaultCatalog, category: usize) -> bool {
        if catalog.categories.get(category).is_some_and(|r| r.fault == Some(Fault::AgentKill)) {
            return true;
        }
        let mut node = SimNode::new(0, 0);
        node.fault = Some(ActiveFault { category, since_ms: 0, latent: false });
        node.findings(catalog).iter().any(|f| {
            f.status == Status::Fail
                && !matches!(f.action, RecommendedAction::None | RecommendedAction::RestartApp)
        })
    }

    /// What the node's agent sees.
    pub(super) fn findings(&self, catalog: &FaultCatalog) -> Vec<Finding> {
        let Some(fault) = &self.fault else { return Vec::new() };
        let row = &catalog.categories[fault.category];
        let finding = |check: &str, id: &str, subject: &str, status, action, message: String| {
            Finding::new(check, id, subject, status, action, message)
        };
        let (status, action, message) = match row.fault {
            Some(Fault::GpuXid(code)) => {
                let advice = xid::advice(code);
                (advice.status, advice.action, format!("Xid {code} ({}) on GPU 0", advice.meaning))
            }
            Some(Fault::GpuMissing) => {
                (Status::Fail, RecommendedAction::Reboot, "7 of 8 GPUs".to_owned())
            }
            Some(Fault::RowRemapFailure) => {
                (Status::Fail, RecommendedAction::Replace, "row remapping failed".to_owned())
            }
            Some(Fault::NvlinkDown) => {
                (Status::Fail, RecommendedAction::ResetGpu, "NVLink down".to_owned())
            }
            Some(Fault::NicDown) => {
                (Status::Fail, RecommendedAction::Drain, "ib0 is down".to_owned())
            }
            Some(Fault::IbPortDown) => {
                (Status::Fail, RecommendedAction::Drain, "InfiniBand mlx5_0/1 is down".to_owned())
            }
            Some(Fault::DiskReadonly) => {
                (Status::Fail, RecommendedAction::Drain, "/scratch is read-only".to_owned())
            }
            Some(Fault::DiskFull) => {
                (Status::Warn, RecommendedAction::None, "/scratch is full".to_owned())
            }
            Some(Fault::KernelMce) => {
                (Status::Warn, RecommendedAction::None, "machine check".to_owned())
            }
            Some(Fault::PcieDowntrained) => {
                (Status::Fail, RecommendedAction::Reboot, "PCIe link x8 of x16".to_owned())
            }
            Some(Fault::GpuThrottle) => (
                Status::Fail,
                RecommendedAction::Drain,
                "clocks slowed down (sustained)".to_owned(),
            ),
            Some(Fault::NicPcieDowntrained) => {
                (Status::Fail, RecommendedAction::Reboot, "NIC PCIe link Gen3 of Gen5".to_owned())
            }
            Some(Fault::GpuLost) => {
                (Status::Fail, RecommendedAction::Reboot, "GPU fell off the bus".to_owned())
            }
            Some(Fault::XidBurst) => (
                Status::Fail,
                RecommendedAction::Reboot,
                "Xid 13 repeated on GPC 1, TPC 2".to_owned(),
            ),
            Some(Fault::GspTimeout) => (
                Status::Fail,
                RecommendedAction::ResetGpu,
                "the GPU likely needs to be reset".to_owned(),
            ),
            Some(Fault::NvswitchFatal) => {
                (Status::Fail, RecommendedAction::Reboot, "fatal NVSwitch SXid".to_owned())
            }
            Some(Fault::Mlx5Health) => {
                (Status::Fail, RecommendedAction::Reboot, "NIC health compromised".to_owned())
            }
            // A silent agent reports nothing; job faults are refused by the catalog.
            Some(Fault::AgentKill | Fault::Hang | Fault::Nan | Fault::Slow(_)) => {
                return Vec::new();
            }
            None => {
                (Status::Warn, RecommendedAction::None, format!("{} ({})", row.finding, row.name))
            }
        };
        vec![finding(row.check.as_str(), &row.finding, "0", status, action, message)]
    }

    /// The report its agent sends now (named `node`), with what it sees and the command results
    /// waiting to go; none while it is down or retired.
    pub(super) fn report(
        &mut self,
        node: &str,
        catalog: &FaultCatalog,
        trigger: ReportTrigger,
        now: u64,
    ) -> Option<Report> {
        let mut findings = self.findings(catalog);
        if !self.up || self.retired {
            return None;
        }
        let mut checks = Vec::new();
        if let Some(noise) = self.noise.as_mut() {
            let seen = noise.findings(now);
            noise.changed(&seen);
            findings.extend(seen);
            checks = noise.runs(now);
        }
        self.seq += 1;
        let verdict = if findings.iter().any(|f| f.status == Status::Fail) {
            Verdict::Unhealthy
        } else if findings.iter().all(|f| f.status == Status::Ok) {
            Verdict::Healthy
        } else {
            Verdict::Degraded
        };
        Some(Report {
            wire_version: WIRE_VERSION,
            node: node.to_owned(),
            boot_id: format!("{node}-boot-{}", self.boot),
            agent_version: "sim".to_owned(),
            seq: self.seq,
            sent_at_ms: now,
            trigger,
            verdict,
            checks,
            findings,
            command_results: std::mem::take(&mut self.results),
            address: None,
            ranks: self.ranks.values().cloned().collect(),
            metrics_port: None,
        })
    }
}
