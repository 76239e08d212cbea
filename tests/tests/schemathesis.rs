//! The repairer against its own OpenAPI document: schemathesis (PyPI) with every check, against
//! the real `fleetmend repairer` on loopback, once with each credential a caller can hold (a
//! person's of each role, the agent token, the alerts token, a running rank's progress token, and
//! on a second repairer with a token per node, one node's token). Zero failures: where the
//! repairer and its document disagree, one of them is wrong.
//!
//! The rank's token is a real one: a real agent runs a rank of a job submitted to the embedded
//! queue, and the rank writes the token it was given to a file.
//!
//! scripts/test installs schemathesis into its own venv and exports `SCHEMATHESIS`; without it
//! this test fails, saying so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fleetmend_tests::{
    Running, fixture, fixture_flags, free_port, http_with_token, poll_until, repairer_in,
    run_with_timeout, start_agent, workspace_root,
};

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

/// The node whose token the per-node run holds, and that token.
const NODE: &str = "n1";
const NODE_TOKEN: &str = "conformance-node-n1-token";

/// Test cases per operation and phase: enough to cross every bound, few enough for 2 busy cores.
const MAX_EXAMPLES: &str = "12";
/// One run's budget (each caller's run is a test of its own; they go side by side).
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

/// A repairer with every caller's credential (a person's of each role, the agent and alerts
/// tokens), rates far above what a run sends; its address and process.
fn repairer(dir: &Path) -> (SocketAddr, Running) {
    let mut credentials = String::new();
    for (role, token) in &CALLERS[..3] {
        let file = dir.join(format!("{role}.token"));
        std::fs::write(&file, token).unwrap();
        credentials.push_str(&format!(
            "[[credentials]]\nname = \"conformance-{role}\"\nrole = \"{role}\"\ntoken_file = {:?}\n",
            file.display().to_string()
        ));
    }
    // Rates far above what the run sends: a 429 is documented everywhere, but a run of 429s would
    // test nothing else.
    repairer_in(
        dir,
        &format!(
            "agent_token = \"{AGENT}\"\nalerts_token = \"{ALERTS}\"\nscheduler = \"embedded\"\n\
             {credentials}[rate_limits]\n\
             node = {{ per_second = 100000.0, burst = 100000 }}\n\
             person = {{ per_second = 100000.0, burst = 100000 }}\n\
             alerts = {{ per_second = 100000.0, burst = 100000 }}\n\
             rank = {{ per_second = 100000.0, burst = 100000 }}\n\
             peer = {{ per_second = 100000.0, burst = 100000 }}\n"
        ),
    )
}

/// Runs schemathesis as `caller` (one of `CALLERS`) against a repairer of its own; asserts that
/// nothing failed. Each caller is a test of its own, so the runs go side by side.
fn conforms_as(caller: &str) {
    let st = installed();
    let dir = tempfile::tempdir().unwrap();
    let (addr, repairer) = repairer(dir.path());
    let token = CALLERS.iter().find(|(role, _)| *role == caller).unwrap().1;
    let failed = conforms(&st, addr, caller, token, dir.path());
    assert!(
        failed.is_none(),
        "the repairer disagrees with its OpenAPI document:\n{}\n== repairer log\n{}",
        failed.unwrap_or_default(),
        repairer.stderr()
    );
}

/// `SCHEMATHESIS`'s program, failing the test when it does not run.
fn installed() -> PathBuf {
    let st = schemathesis();
    let version = Command::new(&st).arg("--version").output();
    assert!(
        version.as_ref().is_ok_and(|o| o.status.success()),
        "schemathesis ({}) is not installed: run scripts/test, which installs it into \
         ~/.cache/fleetmend-schemathesis, or set SCHEMATHESIS to its `st` ({version:?})",
        st.display()
    );
    st
}

#[test]
fn the_repairer_conforms_to_its_openapi_document_for_a_reader() {
    conforms_as("read");
}

#[test]
fn the_repairer_conforms_to_its_openapi_document_for_an_operator() {
    conforms_as("operator");
}

#[test]
fn the_repairer_conforms_to_its_openapi_document_for_an_admin() {
    conforms_as("admin");
}

#[test]
fn the_repairer_conforms_to_its_openapi_document_for_the_agents_token() {
    conforms_as("agent");
}

#[test]
fn the_repairer_conforms_to_its_openapi_document_for_the_alerts_token() {
    conforms_as("alerts");
}

/// A running rank's token, while the fleet is as it was set up.
#[test]
fn the_repairer_conforms_to_its_openapi_document_for_a_running_rank() {
    let st = installed();
    let dir = tempfile::tempdir().unwrap();
    let (addr, repairer) = repairer(dir.path());
    let (rank_token, mut agent) = rank_token(dir.path(), addr);
    let failed = conforms(&st, addr, "rank", &rank_token, dir.path());
    agent.terminate(Duration::from_secs(20));
    assert!(
        failed.is_none(),
        "the repairer disagrees with its OpenAPI document:\n{}\n== repairer log\n{}",
        failed.unwrap_or_default(),
        repairer.stderr()
    );
}

/// A repairer with a token per node: one node's token.
#[test]
fn the_repairer_conforms_to_its_openapi_document_for_one_nodes_token() {
    let st = installed();
    let dir = tempfile::tempdir().unwrap();
    let hashes = dir.path().join("node-tokens.toml");
    let digest = fleetmend_repairer::identity::hash(NODE_TOKEN);
    std::fs::write(&hashes, format!("{NODE} = \"{digest}\"\n")).unwrap();
    let (per_node, per_node_repairer) = repairer_in(
        dir.path(),
        &format!(
            "node_tokens_file = {:?}\nalerts_token = \"{ALERTS}\"\n\
             admin_token = \"conformance-per-node-admin-token\"\n[rate_limits]\n\
             node = {{ per_second = 100000.0, burst = 100000 }}\n",
            hashes.display().to_string()
        ),
    );
    let failed = conforms(&st, per_node, "node", NODE_TOKEN, dir.path());
    assert!(
        failed.is_none(),
        "the repairer disagrees with its OpenAPI document:\n{}\n== per-node repairer log\n{}",
        failed.unwrap_or_default(),
        per_node_repairer.stderr()
    );
}

/// Runs schemathesis against `addr` holding `token`; what failed, if anything. A run that failed
/// only on schemathesis's own crash (a "Runtime Error" while it generates a case: seen from
/// CPython's parser under hypothesis, "AST constructor recursion depth mismatch", twice in a row
/// once in CI) found nothing about the repairer and runs again, up to `RUNS` runs in all; a
/// failed check is never run again.
fn conforms(st: &Path, addr: SocketAddr, caller: &str, token: &str, dir: &Path) -> Option<String> {
    const RUNS: usize = 3;
    let mut output = run_schemathesis(st, addr, token, dir);
    let mut earlier = String::new();
    for _ in 1..RUNS {
        if output.status.success() || !only_its_own_errors(&String::from_utf8_lossy(&output.stdout))
        {
            break;
        }
        earlier.push_str(&format!(
            "(a run crashed in schemathesis itself and ran again:\n{})\n",
            String::from_utf8_lossy(&output.stdout)
        ));
        output = run_schemathesis(st, addr, token, dir);
    }
    (!output.status.success()).then(|| {
        format!(
            "== as {caller}: schemathesis exited {}\n{earlier}{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// Whether schemathesis's summary names only its own runtime errors: no failed check.
fn only_its_own_errors(stdout: &str) -> bool {
    let summary = stdout.rsplit_once("SUMMARY").map_or("", |(_, summary)| summary);
    summary.contains("Runtime Error") && !summary.contains("Failures:")
}

fn run_schemathesis(st: &Path, addr: SocketAddr, token: &str, dir: &Path) -> std::process::Output {
    let config = workspace_root().join("tests/schemathesis.toml");
    run_with_timeout(
        Command::new(st)
            .arg("--config-file")
            .arg(&config)
            .arg("--no-color")
            .arg("run")
            .arg(format!("http://{addr}/v1/openapi.json"))
            // Every check: schemathesis runs them all unless told otherwise, and the config file
            // turns one off for one operation, saying why. (`--checks all` would override that
            // file.)
            .args(["--max-examples", MAX_EXAMPLES])
            .args(["--max-time", MAX_SECONDS])
            .args(["--request-timeout", "10"])
            .args(["--workers", "2"])
            .args(["--seed", "1"])
            .args(["--generation-database", "none"])
            .args(["--header", &format!("Authorization: Bearer {token}")])
            .current_dir(dir),
        Duration::from_secs(120),
    )
}

#[test]
fn only_schemathesis_s_own_crash_is_run_again() {
    let crashed = "== SUMMARY ==\nErrors:\n  Runtime Error: 1\nTest cases:\n  2860 passed\n";
    let failed = "== SUMMARY ==\nFailures:\n  ST202 Schema-valid request rejected: 1\n\
                  Errors:\n  Runtime Error: 1\n";
    assert!(only_its_own_errors(crashed));
    assert!(!only_its_own_errors(failed), "a failed check is the repairer's");
    assert!(!only_its_own_errors("== SUMMARY ==\nFailures:\n  ST202: 1\n"));
    assert!(!only_its_own_errors("no summary: it died before one"));
}

/// A real agent for node n1 runs a rank of a job submitted as the admin; the rank writes the
/// progress token it was given to a file, which is read back. The token and the agent, which
/// keeps the rank running (stop it with SIGTERM: it stops its ranks).
fn rank_token(dir: &Path, repairer: SocketAddr) -> (String, Running) {
    let case = fixture("healthy");
    let config = dir.join("agent-n1.toml");
    std::fs::write(
        &config,
        format!(
            "{}\n[report]\nrepairer = \"http://{repairer}\"\ntoken = \"{AGENT}\"\ninterval = \"300ms\"\n\
             [jobs]\nenabled = true\ndir = \"{}\"\nadvertise_address = \"127.0.0.1\"\nstop_grace = \"2s\"\n",
            std::fs::read_to_string(case.join("agent.toml")).unwrap(),
            dir.join("jobs-n1").display(),
        ),
    )
    .unwrap();
    let mut flags = fixture_flags(&case);
    flags.push(format!("--config={}", config.display()));
    flags.push(format!("--node={NODE}"));
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let agent: Running = start_agent(dir, SocketAddr::from(([127, 0, 0, 1], free_port())), &args);

    let written = dir.join("rank.token");
    let script = format!(
        "printf %s \"$FLEETMEND_PROGRESS_TOKEN\" > '{}.part' && mv '{0}.part' '{0}' && exec sleep 300",
        written.display()
    );
    let spec = serde_json::json!({
        "name": "conformance", "argv": ["sh", "-c", script], "nodes": 1,
        "checkpoint_dir": dir.join("ckpt").display().to_string(),
    });
    let admin = CALLERS.iter().find(|(role, _)| *role == "admin").unwrap().1;
    let mut submitted = None;
    assert!(
        poll_until(Duration::from_secs(30), || {
            submitted = http_with_token(repairer, "/v1/jobs", admin, Some(&spec.to_string()));
            submitted.as_ref().is_some_and(|(status, _)| *status == 201)
        }),
        "submitting the job failed: {submitted:?}\n{}",
        agent.stderr()
    );
    assert!(
        poll_until(Duration::from_secs(60), || std::fs::metadata(&written)
            .is_ok_and(|m| m.len() > 0)),
        "the rank did not start and write its token\n{}",
        agent.stderr()
    );
    (std::fs::read_to_string(&written).unwrap(), agent)
}
