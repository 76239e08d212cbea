//! Slurm's own node list as the inventory: `scontrol -o show nodes` (every node slurmctld knows,
//! also those in no partition, which `sinfo` leaves out), read with the `[slurm]` settings and the
//! inventory's own timeout, not retried: a failed read keeps the list read before.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::scheduler::slurm::{SlurmConfig, SlurmScheduler, listing_error};

/// What `scontrol show nodes` prints when slurmctld knows no node.
const NO_NODES: &str = "No nodes in the system";

/// The node names of `scontrol show nodes` output (one line per node with `-o`, or the
/// multi-line form), and the names skipped because they cannot be node names here.
pub fn parse_show_nodes(text: &str) -> Result<(BTreeSet<String>, Vec<String>), String> {
    let mut names = BTreeSet::new();
    let mut skipped = Vec::new();
    for line in text.lines() {
        // The multi-line form continues a node's record on indented lines.
        if line.is_empty() || line.starts_with(char::is_whitespace) {
            continue;
        }
        if line.trim() == NO_NODES {
            continue;
        }
        let Some(name) = line.split_whitespace().next().and_then(|t| t.strip_prefix("NodeName="))
        else {
            let shown: String = line.chars().take(80).collect();
            return Err(format!("a line that names no node: {shown:?}"));
        };
        if crate::identity::is_node_name(name) {
            names.insert(name.to_owned());
        } else {
            skipped.push(name.to_owned());
        }
    }
    Ok((names, skipped))
}

/// Reads Slurm's node list, each name as fleetmend calls it (`[slurm] node_names`).
#[derive(Debug)]
pub struct SlurmNodeList {
    scheduler: SlurmScheduler,
}

impl SlurmNodeList {
    /// With `[slurm]`'s binaries and `SLURM_CONF`, each read limited to `timeout` and never
    /// retried (the next refresh is the retry).
    pub fn new(config: &SlurmConfig, timeout: Duration) -> SlurmNodeList {
        let config = SlurmConfig {
            command_timeout: timeout,
            controller_retry_for: Duration::ZERO,
            ..config.clone()
        };
        SlurmNodeList { scheduler: SlurmScheduler::new(config) }
    }

    /// Every node Slurm knows, by fleetmend's names.
    pub async fn read(&self) -> Result<BTreeSet<String>, String> {
        let operation = "inventory";
        let text = (self.scheduler.commands().show_nodes(operation).await)
            .map_err(|err| listing_error(operation)(err).to_string())?;
        let (names, skipped) = parse_show_nodes(&text)?;
        if !skipped.is_empty() {
            tracing::warn!(
                ?skipped,
                "Slurm nodes whose names cannot be node names here were left out of the inventory"
            );
        }
        Ok(names.iter().map(|n| self.scheduler.fleetmend_name(n).to_owned()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `scontrol -o show nodes` of the dev cluster (deploy/slurm/dev-cluster.sh), Slurm 22.05.
    const ONE_LINE_EACH: &str = "NodeName=node1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=5.92 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:8 NodeAddr=127.0.0.1 NodeHostName=localhost Port=27001 Version=22.05.8 OS=Linux 6.18.44-fc-v1147 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=512 AllocMem=0 FreeMem=20348 Sockets=2 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=dev  BootTime=2026-12-04T14:47:53 SlurmdStartTime=2026-12-04T15:51:31 LastBusyTime=2026-12-04T15:51:32 CfgTRES=cpu=2,mem=512M,billing=2 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
NodeName=node2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=5.92 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:8 NodeAddr=127.0.0.1 NodeHostName=localhost Port=27002 Version=22.05.8 OS=Linux 6.18.44-fc-v1147 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=512 AllocMem=0 FreeMem=20347 Sockets=2 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=dev  BootTime=2026-12-04T14:47:52 SlurmdStartTime=2026-12-04T15:51:31 LastBusyTime=2026-12-04T15:51:31 CfgTRES=cpu=2,mem=512M,billing=2 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
NodeName=node3 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 State=DOWN+DRAIN+NOT_RESPONDING ThreadsPerCore=1 Reason=fleetmend: xid 79 [root@2026-12-04T15:52:00]
";

    /// `scontrol show nodes` without `-o`: each node's record over indented lines.
    const MULTI_LINE: &str = "NodeName=node1 Arch=x86_64 CoresPerSocket=1 
   CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=5.92
   AvailableFeatures=(null)
   State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A

NodeName=gpu-a17 CoresPerSocket=1 
   State=IDLE+DRAIN ThreadsPerCore=1
   Reason=maintenance [root@2026-12-04T15:52:00]

";

    #[test]
    fn scontrol_listings_give_every_node_name() {
        let names = |text| parse_show_nodes(text).unwrap().0.into_iter().collect::<Vec<_>>();
        assert_eq!(names(ONE_LINE_EACH), ["node1", "node2", "node3"]);
        assert_eq!(names(MULTI_LINE), ["gpu-a17", "node1"]);
        assert!(names("No nodes in the system\n").is_empty());
        assert!(names("").is_empty());
    }

    #[test]
    fn unexpected_scontrol_output_is_an_error_and_odd_names_are_skipped() {
        let err = parse_show_nodes("slurm_load_node error: Unable to contact slurm controller")
            .unwrap_err();
        assert!(err.contains("names no node"), "{err}");
        let (names, skipped) =
            parse_show_nodes("NodeName=ok1 State=IDLE\nNodeName=b@d State=IDLE\n").unwrap();
        assert_eq!(names.into_iter().collect::<Vec<_>>(), ["ok1"]);
        assert_eq!(skipped, ["b@d"]);
    }
}
