//! Tests of the Slurm backend that need no Slurm: names, config, and its commands
//! stood in by scripts.

#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;

#[test]
fn only_a_reason_starting_fleetmend_s_prefix_is_ours() {
    let ours = |reason: Option<&str>| {
        reason_is_ours(&SlurmNode {
            state: "IDLE+DRAIN".to_owned(),
            reason: reason.map(str::to_owned),
        })
    };
    assert!(ours(Some("fleetmend: xid 79 [gpu 3]")));
    assert!(ours(Some("fleetmend: spare")));
    assert!(!ours(Some("maintenance now")));
    assert!(!ours(Some("Not responding")));
    assert!(!ours(None));
}

#[test]
fn node_names_map_both_ways_identity_by_default() {
    let mut config = SlurmConfig::default();
    config.node_names.insert("gpu-a".to_owned(), "node1".to_owned());
    let slurm = SlurmScheduler::new(config);
    assert_eq!(slurm.slurm_name("gpu-a"), "node1");
    assert_eq!(slurm.slurm_name("node2"), "node2");
    assert_eq!(slurm.fleetmend_name("node1"), "gpu-a");
    assert_eq!(slurm.fleetmend_name("node2"), "node2");
}

#[test]
fn a_requeued_job_is_remembered_for_ten_minutes_of_the_keepers_clock() {
    let slurm = SlurmScheduler::new(SlurmConfig::default());
    slurm.requeued.lock().unwrap_or_else(PoisonError::into_inner).insert("12".to_owned(), None);
    let t0 = 1_000_000;
    assert_eq!(slurm.recently_requeued(t0), BTreeSet::from(["12".to_owned()]));
    assert_eq!(slurm.recently_requeued(t0 + REQUEUED_MEMORY_MS - 1).len(), 1);
    assert!(slurm.recently_requeued(t0 + REQUEUED_MEMORY_MS).is_empty(), "forgotten");
}

#[test]
fn validation_names_every_bad_field() {
    let mut config = SlurmConfig {
        command_timeout: Duration::ZERO,
        requeue_settle_timeout: Duration::ZERO,
        ..SlurmConfig::default()
    };
    config.node_names.insert("a".to_owned(), "node1".to_owned());
    config.node_names.insert("b".to_owned(), "node1".to_owned());
    config.node_names.insert("c".to_owned(), "node[1-2]".to_owned());
    let fields: Vec<String> = config.problems("slurm").into_iter().map(|p| p.0).collect();
    assert_eq!(
        fields,
        [
            "slurm.command_timeout",
            "slurm.requeue_settle_timeout",
            "slurm.node_names.b",
            "slurm.node_names.c"
        ]
    );
    assert!(SlurmConfig::default().problems("slurm").is_empty());
}

#[tokio::test]
async fn a_missing_command_is_an_error_naming_it() {
    let slurm = SlurmScheduler::new(SlurmConfig {
        bin_dir: Some(PathBuf::from("/nonexistent/slurm/bin")),
        ..SlurmConfig::default()
    });
    let err = slurm.drain("node1", "fleetmend: test").await.unwrap_err();
    assert!(err.to_string().contains("/nonexistent/slurm/bin/scontrol"), "{err}");
    let err = slurm.checkpoint("1; rm").await.unwrap_err();
    assert!(err.to_string().contains("not a Slurm job id"), "{err}");
}

/// A fake `scontrol` that cannot reach slurmctld for its first `failures` calls, then
/// answers like a healthy idle node; it counts its calls in `calls`.
fn flaky_scontrol(dir: &std::path::Path, failures: u32) {
    use std::os::unix::fs::PermissionsExt;
    let calls = dir.join("calls");
    let script = format!(
        "#!/bin/sh\necho x >> {calls}\nn=$(wc -l < {calls})\n\
         if [ \"$n\" -le {failures} ]; then\n  \
         echo 'slurm_load_node error: Unable to contact slurm controller (connect failure)' >&2\n  \
         exit 1\nfi\necho '   State=IDLE ThreadsPerCore=1'\n",
        calls = calls.display()
    );
    let path = dir.join("scontrol");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn calls(dir: &std::path::Path) -> usize {
    std::fs::read_to_string(dir.join("calls")).unwrap_or_default().lines().count()
}

#[tokio::test]
async fn an_unreachable_controller_is_retried_until_it_answers_or_time_is_up() {
    let dir = tempfile::tempdir().unwrap();
    flaky_scontrol(dir.path(), 3);
    let config = SlurmConfig {
        bin_dir: Some(dir.path().to_owned()),
        controller_retry_for: Duration::from_secs(20),
        controller_retry_max_backoff: Duration::from_millis(100),
        ..SlurmConfig::default()
    };
    let slurm = SlurmScheduler::new(config.clone());
    // 3 failed reads, the read that answers, the drain itself.
    slurm.drain("node1", "fleetmend: test").await.unwrap();
    assert_eq!(calls(dir.path()), 5);

    let dir = tempfile::tempdir().unwrap();
    flaky_scontrol(dir.path(), 1000);
    let slurm = SlurmScheduler::new(SlurmConfig {
        bin_dir: Some(dir.path().to_owned()),
        controller_retry_for: Duration::from_millis(600),
        ..config
    });
    let started = std::time::Instant::now();
    let err = slurm.undrain("node1").await.unwrap_err().to_string();
    assert!(err.contains("Unable to contact slurm controller"), "{err}");
    assert!(err.contains("gave up after"), "{err}");
    assert!(calls(dir.path()) >= 2, "retried: {}", calls(dir.path()));
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_hanging_command_times_out_and_stderr_is_in_errors() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, body: &str| {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    write("scontrol", "exec sleep 30");
    write("scancel", "echo 'scancel: error: Kill job error on job id 7: boom' >&2; exit 1");
    let slurm = SlurmScheduler::new(SlurmConfig {
        bin_dir: Some(dir.path().to_owned()),
        command_timeout: Duration::from_millis(200),
        ..SlurmConfig::default()
    });
    let started = std::time::Instant::now();
    let err = slurm.undrain("node1").await.unwrap_err();
    assert!(matches!(err, SchedulerError::Timeout { operation: "undrain", .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
    let err = slurm.checkpoint("7").await.unwrap_err();
    assert!(err.to_string().contains("boom"), "{err}");
}
