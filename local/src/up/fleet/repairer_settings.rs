//! The repairer's settings for a fleet on one machine: its engine, policy and queue at a local
//! fleet's pace, the `[slurm]` section on Slurm, and the job's rendezvous ports.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use fleetmend_repairer::config::{RepairerConfig, SchedulerKind};
use fleetmend_repairer::policy::FleetShare;
use fleetmend_repairer::scheduler::slurm::SlurmConfig;

use super::FleetConfig;

/// The repairer config of `config`'s fleet (a replay of its failure history runs with its
/// policy, engine and queue: tests/tests/replay.rs).
pub fn repairer_config(
    config: &FleetConfig,
    state_dir: &Path,
    admin_token_file: &Path,
    agent_token_file: &Path,
    slurm: Option<&SlurmConfig>,
) -> RepairerConfig {
    let mut repairer = RepairerConfig {
        listen: config.listen.unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0))),
        store: state_dir.join("repairer.db").into(),
        agent_token_file: Some(agent_token_file.to_owned()),
        admin_token_file: Some(admin_token_file.to_owned()),
        scheduler: SchedulerKind::Embedded,
        ..RepairerConfig::default()
    };
    let engine = &mut repairer.engine;
    engine.tick = Duration::from_millis(100);
    engine.report_interval = config.report_interval;
    // A killed agent is noticed within about a second and a half at the default interval.
    engine.unreachable_after = 5;
    let workflow = &mut engine.workflow;
    workflow.call_timeout = Duration::from_secs(10);
    // The queue's own stop sequence (SIGUSR1, a new checkpoint, SIGTERM) does the waiting.
    workflow.checkpoint_grace = Duration::from_secs(1);
    workflow.reboot_timeout = config.boot_delay + config.rank_stop_grace + Duration::from_secs(30);
    workflow.replace_timeout = Duration::from_secs(60);
    workflow.validate_timeout = Duration::from_secs(30);
    workflow.retry_max = Duration::from_secs(5);
    if let Some(slurm) = slurm {
        repairer.scheduler = SchedulerKind::Slurm;
        repairer.slurm = slurm.clone();
        // Slurm delivers SIGUSR1 and the requeue's SIGTERM; the trainer checkpoints on both.
        workflow.checkpoint_grace = Duration::from_secs(3);
    }
    repairer.policy.mode = config.mode;
    repairer.alerts.sinks = config.alert_sinks.clone();
    // A local fleet's alerts go out within a fraction of a second.
    repairer.alerts.poll_interval = Duration::from_millis(200);
    // One machine's fleet: a repaired node may be acted on again within a minute.
    repairer.policy.guard_rails.cooldown = Duration::from_secs(60);
    // The ladder at a local fleet's pace: a node still failing 10 s after its drain is
    // rebooted (a transient fault clears), then replaced by a spare.
    repairer.policy.escalation.drain_window = Duration::from_secs(10);
    // A handful of nodes: a third of them may be out at once (the 10 % of a large fleet
    // would hold a second fault's drain behind the first one's replacement here).
    repairer.policy.guard_rails.max_unavailable_fraction = 0.34;
    // Two repairs at once, as two faults may overlap here: a share of a handful of nodes
    // (the default's 2 %) rounds to one.
    repairer.policy.guard_rails.max_concurrent_repairs = FleetShare::Nodes(2);
    let queue = &mut repairer.queue;
    queue.tick = Duration::from_millis(100);
    queue.start_timeout = Duration::from_secs(60);
    queue.checkpoint_grace = Duration::from_secs(15);
    queue.stop_grace = config.rank_stop_grace + Duration::from_secs(5);
    // A repaired node rejoins the hot spares while fewer than `--spares` are held.
    queue.spare_pool = FleetShare::Nodes(config.spares);
    queue.wait_alert = Duration::from_secs(20);
    let (min, max) = rendezvous_ports(Path::new("/proc"));
    queue.master_port_min = min;
    queue.master_port_max = max;
    repairer
}

/// The repairer's `[slurm]` settings for a fleet on `conf`: snappy timeouts for one machine,
/// slurmctld retried for half a minute before a workflow step fails (and is retried itself).
pub(super) fn slurm_config(
    conf: &Path,
    node_names: BTreeMap<String, String>,
    spares: u32,
) -> SlurmConfig {
    SlurmConfig {
        slurm_conf: Some(conf.to_owned()),
        node_names,
        spare_pool: spares,
        spare_poll: Duration::from_secs(1),
        command_timeout: Duration::from_secs(15),
        controller_retry_for: Duration::from_secs(30),
        controller_retry_max_backoff: Duration::from_secs(2),
        ..SlurmConfig::default()
    }
}

/// Ports rank 0 of the job may listen on: a window of 200 below the kernel's ephemeral range (where
/// outgoing connections take their local ports, so a listener there can find its port taken) and
/// away from torchrun's default 29500, at a random offset so fleets on one machine rarely meet.
pub fn rendezvous_ports(procfs: &Path) -> (u16, u16) {
    const LOWEST: u16 = 10_000;
    const WIDTH: u16 = 200;
    let ephemeral_min = std::fs::read_to_string(procfs.join("sys/net/ipv4/ip_local_port_range"))
        .ok()
        .and_then(|text| text.split_whitespace().next().and_then(|p| p.parse::<u16>().ok()))
        .unwrap_or(32_768);
    let top = ephemeral_min.saturating_sub(WIDTH).max(LOWEST + WIDTH);
    let windows = (top - LOWEST) / WIDTH;
    let mut min = LOWEST + WIDTH * fastrand::u16(0..windows.max(1));
    if (29_300..=29_700).contains(&min) {
        min = LOWEST;
    }
    (min, min + WIDTH - 1)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn the_repairer_config_is_valid_and_fast() {
        let config = FleetConfig::new(PathBuf::from("/tmp/x"), PathBuf::from("/bin/fleetmend"));
        let repairer = repairer_config(
            &config,
            Path::new("/tmp/x"),
            Path::new("/tmp/x/admin.token"),
            Path::new("/tmp/x/agent.token"),
            None,
        );
        assert_eq!(repairer.problems(), Vec::new());
        assert_eq!(repairer.scheduler, SchedulerKind::Embedded);
        assert!(repairer.listen.ip().is_loopback());
        assert_eq!(repairer.engine.tick, Duration::from_millis(100));
        assert_eq!(repairer.queue.tick, Duration::from_millis(100));
        assert!(repairer.engine.workflow.reboot_timeout <= Duration::from_secs(60));
    }

    #[test]
    fn on_slurm_the_repairer_drives_the_cluster_with_the_nodes_mapped() {
        let config = FleetConfig::new(PathBuf::from("/tmp/x"), PathBuf::from("/bin/fleetmend"));
        let names = BTreeMap::from([
            ("node-1".to_owned(), "node1".to_owned()),
            ("node-2".to_owned(), "node2".to_owned()),
        ]);
        let slurm = slurm_config(Path::new("/tmp/x/slurm/slurm.conf"), names.clone(), 1);
        let repairer = repairer_config(
            &config,
            Path::new("/tmp/x"),
            Path::new("/tmp/x/admin.token"),
            Path::new("/tmp/x/agent.token"),
            Some(&slurm),
        );
        assert_eq!(repairer.problems(), Vec::new());
        assert_eq!(repairer.scheduler, SchedulerKind::Slurm);
        assert_eq!(repairer.slurm.node_names, names);
        assert_eq!(
            repairer.slurm.slurm_conf.as_deref(),
            Some(Path::new("/tmp/x/slurm/slurm.conf"))
        );
    }

    #[test]
    fn rendezvous_ports_stay_below_the_ephemeral_range() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sys/net/ipv4/ip_local_port_range");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "32768\t60999\n").unwrap();
        for _ in 0..200 {
            let (min, max) = rendezvous_ports(dir.path());
            assert!(min >= 10_000 && max < 32_768 && max - min == 199, "{min}..{max}");
            assert!(!(min..=max).contains(&29_500), "{min}..{max}");
        }
        // Without the file: the kernel's default range is assumed.
        let (min, max) = rendezvous_ports(&dir.path().join("missing"));
        assert!(min >= 10_000 && max < 32_768, "{min}..{max}");
    }
}
