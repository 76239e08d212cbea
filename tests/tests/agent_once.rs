//! `fleetmend agent --once` and `--check-config`: exit codes and output, as Slurm's
//! HealthCheckProgram and a job prolog use them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use fleetmend_proto::{HealthView, Status, Verdict};
use fleetmend_tests::{fixture, fixture_flags, fleetmend_bin, run_with_timeout, workspace_root};

fn once(case: &str, extra: &[&str]) -> std::process::Output {
    let mut flags = fixture_flags(&fixture(case));
    // A flag given in `extra` replaces the fixture's (clap takes each once).
    flags.retain(|flag| {
        let name = flag.split('=').next().unwrap_or_default();
        !extra.iter().any(|e| e.starts_with(&format!("{name}=")))
    });
    let mut command = Command::new(fleetmend_bin());
    command
        .arg("agent")
        .arg("--once")
        .arg(format!("--config={}", fixture("healthy").join("agent.toml").display()))
        .args(flags)
        .args(extra);
    run_with_timeout(&mut command, Duration::from_secs(30))
}

#[test]
fn healthy_fixture_exits_zero_with_a_table() {
    let started = Instant::now();
    let output = once("healthy", &[]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.starts_with("CHECK"), "{stdout}");
    assert!(stdout.trim_end().ends_with("is healthy"), "{stdout}");
    // Slurm kills a HealthCheckProgram at 60 s; the agent must be far quicker.
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
}

#[test]
fn healthy_fixture_json_lists_every_check() {
    let output = once("healthy", &["--output=json"]);
    assert_eq!(output.status.code(), Some(0));
    let view: HealthView = serde_json::from_slice(&output.stdout).expect("JSON health view");
    assert_eq!(view.verdict, Verdict::Healthy);
    let checks: Vec<&str> = view.checks.iter().map(|c| c.check.as_str()).collect();
    assert_eq!(checks, ["gpu", "kernel_log", "nic", "pcie", "disk", "host"]);
    assert!(view.findings.iter().all(|f| f.status == Status::Ok), "{:#?}", view.findings);
}

#[test]
fn a_fault_exits_one_and_names_the_finding() {
    let output = once(
        "healthy",
        &[
            &format!("--gpu=fixture:{}", fixture("gpu_xid79").join("gpu.json").display()),
            "--output=json",
        ],
    );
    assert_eq!(output.status.code(), Some(1), "{}", String::from_utf8_lossy(&output.stdout));
    let view: HealthView = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(view.verdict, Verdict::Unhealthy);
    assert!(
        view.findings.iter().any(|f| f.check == "gpu" && f.status == Status::Fail),
        "{:#?}",
        view.findings
    );
}

#[test]
fn config_with_unknown_keys_and_bad_values_exits_two_listing_each_problem() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[checks.gpu]\ninterval = \"0s\"\n[report]\nrepairer = \"ftp://x\"\n")
        .unwrap();
    let output = run_with_timeout(
        Command::new(fleetmend_bin()).args(["agent", "--check-config"]).arg(&bad),
        Duration::from_secs(10),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("checks.gpu.interval"), "{stderr}");
    assert!(stderr.contains("report.repairer"), "{stderr}");

    std::fs::write(&bad, "[checks.nic]\nrequird = [\"eth0\"]\n").unwrap();
    let output = run_with_timeout(
        Command::new(fleetmend_bin()).args(["agent", "--once", "--config"]).arg(&bad),
        Duration::from_secs(10),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("requird"), "{stderr}");
}

#[test]
fn every_shipped_config_is_valid() {
    let mut configs = vec![workspace_root().join("deploy/agent.toml")];
    configs.push(fixture("healthy").join("agent.toml"));
    // The README's config example, between its ```toml fences after "## Agent config".
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (i, block) in readme.split("```toml\n").skip(1).enumerate() {
        let text = block.split("```").next().unwrap_or_default();
        let path = dir.path().join(format!("readme-{i}.toml"));
        std::fs::write(&path, text).unwrap();
        configs.push(path);
    }
    assert!(configs.len() >= 3, "the README has no ```toml example");
    for config in configs {
        let output = run_with_timeout(
            Command::new(fleetmend_bin()).args(["agent", "--check-config"]).arg(&config),
            Duration::from_secs(10),
        );
        assert_eq!(
            output.status.code(),
            Some(0),
            "{}: {}",
            config.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// The binary every node runs links no repairer code: a node's own Slurm drain runs Slurm's
/// commands through the `fleetmend-slurm` crate, as the repairer does, not through the repairer.
#[test]
fn the_lean_agent_binary_links_no_repairer_code() {
    let agent = fleetmend_bin().with_file_name("fleetmend-agent");
    assert!(agent.exists(), "{} is built with the workspace's binaries", agent.display());
    let output = run_with_timeout(
        Command::new("nm").arg("--demangle").arg("--defined-only").arg(&agent),
        Duration::from_secs(60),
    );
    assert!(output.status.success(), "nm: {}", String::from_utf8_lossy(&output.stderr));
    let symbols = String::from_utf8_lossy(&output.stdout);
    // The symbols are there to read (a stripped binary would pass for the wrong reason).
    assert!(symbols.contains("fleetmend_agent::"), "no agent symbols in {}", agent.display());
    assert!(symbols.contains("fleetmend_slurm::"), "the self-drain's Slurm commands are linked");
    let repairer: Vec<&str> =
        symbols.lines().filter(|l| l.contains("fleetmend_repairer::")).take(5).collect();
    assert!(repairer.is_empty(), "repairer code in {}: {repairer:#?}", agent.display());
}
