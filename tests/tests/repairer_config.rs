//! `fleetmend repairer --check-config`: the shipped example is valid; bad configs exit 2 naming
//! every problem.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::Duration;

use fleetmend_tests::{fleetmend_bin, run_with_timeout, workspace_root};

fn check(path: &std::path::Path) -> std::process::Output {
    run_with_timeout(
        Command::new(fleetmend_bin()).args(["repairer", "--check-config"]).arg(path),
        Duration::from_secs(10),
    )
}

#[test]
fn the_shipped_repairer_config_is_valid() {
    let output = check(&workspace_root().join("deploy/repairer.toml"));
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn a_bad_repairer_config_lists_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "listen = \"0.0.0.0:9830\"\n[policy.guard_rails]\nbreaker_fraction = 2.0\n[[policy.rules]]\nname = \"\"\naction = \"drain\"\n",
    )
    .unwrap();
    let output = check(&path);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    for field in ["listen", "policy.guard_rails.breaker_fraction", "policy.rules[0].name"] {
        assert!(stderr.contains(field), "{field} missing from:\n{stderr}");
    }
    std::fs::write(&path, "[policy]\nmodee = \"x\"\n").unwrap();
    let output = check(&path);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("modee"));
}
