//! `fleetmend inject`: its flags, and finding the node's tree in the state directory.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::{Fault, InjectError};
use crate::tree::{self, DEFAULT_STATE_DIR, NodeTree, STATE_DIR_ENV};

/// The flags of `fleetmend inject`.
#[derive(Debug, Clone, clap::Args)]
pub struct InjectArgs {
    /// The node to break (a node of the fleet `fleetmend up` runs in the state directory).
    pub node: String,
    /// The fault: gpu-xid:N (e.g. gpu-xid:79, gpu-xid:48), gpu-missing, row-remap-failure,
    /// nvlink-down, nic-down, ib-port-down, pcie-downtrained, gpu-throttle, nvswitch-fatal,
    /// mlx5-health, nic-pcie-downtrained, gpu-lost, xid-burst, gsp-timeout, disk-full (needs root), disk-readonly,
    /// kernel-mce, agent-kill, hang (SIGSTOP of the node's job ranks), nan (SIGUSR2 to them: the
    /// bundled trainer's next gradient gets a NaN), slow:PERCENT (they keep PERCENT % of their
    /// CPU, in a cgroup; needs root).
    pub fault: String,
    /// Keep the fault across reboots of the node (a broken part, not a passing event).
    #[arg(long)]
    pub persistent: bool,
    /// The state directory of `fleetmend up`.
    #[arg(long, env = STATE_DIR_ENV, default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
}

/// Runs `fleetmend inject`: 0 when the fault was written (or the agent killed), 2 for a node or
/// fault that does not exist, 1 when it could not be done.
pub fn inject_main(args: InjectArgs) -> ExitCode {
    let fault = match args.fault.parse::<Fault>() {
        Ok(fault) => fault,
        Err(err) => {
            eprintln!("fleetmend inject: {err}");
            return ExitCode::from(2);
        }
    };
    if fault == Fault::AgentKill && args.persistent {
        eprintln!("fleetmend inject: {}", InjectError::PersistentAgentKill);
        return ExitCode::from(2);
    }
    if !fault.can_persist() && args.persistent {
        eprintln!("fleetmend inject: {}", InjectError::NotPersistent { fault });
        return ExitCode::from(2);
    }
    let tree = match open_node(&args.state_dir, &args.node) {
        Ok(tree) => tree,
        Err(message) => {
            eprintln!("fleetmend inject: {message}");
            return ExitCode::from(2);
        }
    };
    if fault == Fault::AgentKill {
        return match tree.kill_agent() {
            Ok(pid) => {
                println!(
                    "{}: agent-kill: killed its agent (pid {pid}) with SIGKILL; the node stops reporting until it is rebooted",
                    tree.node()
                );
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("fleetmend inject: {}: {err}", tree.node());
                ExitCode::from(1)
            }
        };
    }
    if fault.is_job_fault() {
        return match tree.signal_ranks(fault) {
            Ok(ranks) => {
                let ranks: Vec<String> =
                    ranks.iter().map(|(rank, pid)| format!("{rank} (pid {pid})")).collect();
                let what = match fault {
                    Fault::Hang => {
                        "stopped with SIGSTOP; the node stays healthy, its ranks stop stepping"
                    }
                    Fault::Slow(_) => {
                        "throttled in a CPU cgroup; they step slower than their peers"
                    }
                    _ => "sent SIGUSR2; the trainer's next gradient gets a NaN",
                };
                println!("{}: {fault}: {} {what}", tree.node(), ranks.join(", "));
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("fleetmend inject: {}: {err}", tree.node());
                ExitCode::from(1)
            }
        };
    }
    match tree.inject(&fault, args.persistent) {
        Ok(()) => {
            let kind = if args.persistent {
                "persistent: survives reboots"
            } else {
                "cleared by a reboot"
            };
            println!("{}: {fault} ({kind}): {}", tree.node(), fault.description());
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("fleetmend inject: {}: {fault}: {err}", tree.node());
            ExitCode::from(1)
        }
    }
}

/// The tree of `node` in `state_dir`, or a message naming the nodes there are.
fn open_node(state_dir: &Path, node: &str) -> Result<NodeTree, String> {
    let known = tree::list_nodes(state_dir).map_err(|err| err.to_string())?;
    let valid_name = tree::validate_node_name(node).is_ok();
    if !valid_name || !known.iter().any(|known| known == node) {
        let nodes_dir = tree::nodes_dir(state_dir);
        return Err(if known.is_empty() {
            format!(
                "no node {node:?}: {} holds no nodes (start a fleet with `fleetmend up`, or name its state directory with --state-dir or {STATE_DIR_ENV})",
                nodes_dir.display()
            )
        } else {
            format!(
                "no node {node:?} in {} (known nodes: {})",
                nodes_dir.display(),
                known.join(", ")
            )
        });
    }
    NodeTree::open(&tree::node_dir(state_dir, node)).map_err(|err| err.to_string())
}
