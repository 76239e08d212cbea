//! The repairer against its own OpenAPI document: schemathesis (PyPI) with every check, against
//! the real `fleetmend repairer` on loopback, once with each credential a caller can hold (a
//! person's of each role, the agent token, the alerts token). Zero failures: where the repairer
//! and its document disagree, one of them is wrong.
//!
//! scripts/test installs schemathesis into its own venv and exports `SCHEMATHESIS`; without it
//! this test fails, saying so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use fleetmend_tests::{repairer_in, run_with_timeout, workspace_root};

const AGENT: &str = "conformance-agent-token";
const ALERTS: &str = "conformance-alerts-token";

/// The credentials the run is repeated with: (what it is, token).
const CALLERS: &[(&str, &str)] = &[
    ("read", "conformance-read-token"),
    ("operator", "conformance-operator-token"),
    ("admin", "conformance-admin-token"),
    ("agent", AGENT),
    ("alerts", ALERTS),
];

/// Test cases per operation and phase: enough to cross every bound, few enough for 2 busy cores.
const MAX_EXAMPLES: &str = "12";
/// One run's budget (the test's whole, five runs, stays under 3 minutes).
const MAX_SECONDS: &str = "25";

/// `SCHEMATHESIS`, else the venv scripts/test installs, else `st` on PATH.
fn schemathesis() -> PathBuf {
    if let Some(program) = std::env::var_os("SCHEMATHESIS") {
        return PathBuf::from(program);
    }
    let venv = std::env::var_os("HOME")
        .map(|home| PathBuf::from(home).join(".cache/fleetmend-schemathesis/bin/st"));
    venv.filter(|p| p.is_file()).unwrap_or_else(|| PathBuf::from("st"))
}

#[test]
fn the_repairer_conforms_to_its_openapi_document_for_every_caller() {
    let st = schemathesis();
    let version = Command::new(&st).arg("--version").output();
    assert!(
        version.as_ref().is_ok_and(|o| o.status.success()),
        "schemathesis ({}) is not installed: run scripts/test, which installs it into \
         ~/.cache/fleetmend-schemathesis, or set SCHEMATHESIS to its `st` ({version:?})",
        st.display()
    );

    let dir = tempfile::tempdir().unwrap();
    let mut credentials = String::new();
    for (role, token) in &CALLERS[..3] {
        let file = dir.path().join(format!("{role}.token"));
        std::fs::write(&file, token).unwrap();
        credentials.push_str(&format!(
            "[[credentials]]\nname = \"conformance-{role}\"\nrole = \"{role}\"\ntoken_file = {:?}\n",
            file.display().to_string()
        ));
    }
    // Rates far above what the run sends: a 429 is documented everywhere, but a run of 429s would
    // test nothing else.
    let (addr, repairer) = repairer_in(
        dir.path(),
        &format!(
            "agent_token = \"{AGENT}\"\nalerts_token = \"{ALERTS}\"\nscheduler = \"embedded\"\n\
             {credentials}[rate_limits]\n\
             node = {{ per_second = 100000.0, burst = 100000 }}\n\
             person = {{ per_second = 100000.0, burst = 100000 }}\n\
             alerts = {{ per_second = 100000.0, burst = 100000 }}\n\
             rank = {{ per_second = 100000.0, burst = 100000 }}\n\
             peer = {{ per_second = 100000.0, burst = 100000 }}\n"
        ),
    );
    let config = workspace_root().join("tests/schemathesis.toml");
    let mut failed = Vec::new();
    for (caller, token) in CALLERS {
        let output = run_with_timeout(
            Command::new(&st)
                .arg("--config-file")
                .arg(&config)
                .arg("--no-color")
                .arg("run")
                .arg(format!("http://{addr}/v1/openapi.json"))
                // Every check: schemathesis runs them all unless told otherwise, and the config
                // file turns one off for one operation, saying why. (`--checks all` would
                // override that file.)
                .args(["--max-examples", MAX_EXAMPLES])
                .args(["--max-time", MAX_SECONDS])
                .args(["--request-timeout", "10"])
                .args(["--workers", "2"])
                .args(["--seed", "1"])
                .args(["--generation-database", "none"])
                .args(["--header", &format!("Authorization: Bearer {token}")])
                .current_dir(dir.path()),
            Duration::from_secs(120),
        );
        if !output.status.success() {
            failed.push(format!(
                "== as {caller}: schemathesis exited {}\n{}\n{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "the repairer disagrees with its OpenAPI document:\n{}\n== repairer log\n{}",
        failed.join("\n"),
        repairer.stderr()
    );
}
