//! The `command` provider against real processes: built from TOML the way the repairer builds it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetmend_repairer::commands::CommandQueue;
use fleetmend_repairer::provider::{
    PowerState, Provider, ProviderConfig, ProviderDeps, ProviderError, build,
};

fn provider(toml_body: &str) -> Arc<dyn Provider> {
    #[derive(serde::Deserialize)]
    struct Doc {
        provider: ProviderConfig,
    }
    let doc: Doc = toml::from_str(&format!("[provider]\nkind = \"command\"\n{toml_body}")).unwrap();
    build(&doc.provider, &ProviderDeps::new(Arc::new(CommandQueue::new()))).unwrap()
}

fn quoted(path: &Path) -> String {
    format!("{:?}", path.display().to_string())
}

/// Whether `pid` is a live (not zombie) process.
fn process_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| !stat.rsplit(')').next().unwrap_or_default().trim_start().starts_with('Z'))
        .unwrap_or(false)
}

#[tokio::test]
async fn reboot_runs_the_argv_command_with_the_node_substituted() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("rebooted");
    // Program and arguments go straight to exec: `$1` and `$2` are the substituted arguments.
    let provider = provider(&format!(
        r#"reboot = ["sh", "-c", 'echo "$1 $FLEETMEND_OPERATION" >> "$2"', "sh", "{{node}}-bmc", {}]"#,
        quoted(&marker)
    ));
    provider.reboot("gpu-node-7").await.unwrap();
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "gpu-node-7-bmc reboot\n");
}

#[tokio::test]
async fn reboot_runs_a_shell_string() {
    let dir = tempfile::tempdir().unwrap();
    let provider = provider(&format!(
        "reboot = \"cd {} && echo cycled > {{node}}.power\"",
        dir.path().display()
    ));
    provider.reboot("n3").await.unwrap();
    assert_eq!(std::fs::read_to_string(dir.path().join("n3.power")).unwrap(), "cycled\n");
}

#[tokio::test]
async fn an_unsafe_node_name_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let provider =
        provider(&format!("reboot = \"cd {} && touch ran-for-{{node}}\"", dir.path().display()));
    let error = provider.reboot("n1;touch injected").await.unwrap_err();
    assert!(error.to_string().contains("cannot be substituted safely"), "{error}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "something ran");
}

#[tokio::test]
async fn a_failing_command_reports_its_exit_code_and_stderr() {
    let provider = provider(
        "reboot = \"echo 'Error: Unable to establish IPMI v2 / RMCP+ session' >&2; exit 7\"",
    );
    let error = provider.reboot("n1").await.unwrap_err();
    assert!(matches!(error, ProviderError::Failed { operation: "reboot", .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("exit code 7"), "{message}");
    assert!(message.contains("Unable to establish IPMI v2 / RMCP+ session"), "{message}");
}

#[tokio::test]
async fn a_missing_program_is_named() {
    let provider = provider("reboot = [\"/nonexistent/ipmitool\", \"{node}\"]");
    let message = provider.reboot("n1").await.unwrap_err().to_string();
    assert!(message.contains("/nonexistent/ipmitool"), "{message}");
}

#[tokio::test]
async fn a_hanging_command_is_killed_at_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    // The shell waits on a child, as a stuck ipmitool under a wrapper script would.
    let provider = provider(&format!(
        "reboot = \"sleep 600 & echo $! > {}; wait\"\nreboot_timeout = \"1s\"",
        dir.path().join("pid").display()
    ));
    let started = Instant::now();
    let error = provider.reboot("n1").await.unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(error, ProviderError::Timeout { operation: "reboot", seconds: 1, .. }),
        "{error:?}"
    );
    assert!(took >= Duration::from_secs(1) && took < Duration::from_secs(10), "took {took:?}");
    let pid: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while process_alive(pid) {
        assert!(Instant::now() < deadline, "the command's child {pid} outlived the timeout");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn replace_and_power_state_read_the_commands_output() {
    let provider = provider(
        "reboot = \"true\"\n\
         replace = \"echo allocating a node for {node}; echo; echo {node}-r1; echo\"\n\
         power_state = [\"echo\", \"Chassis Power is on\"]",
    );
    assert_eq!(provider.replace("n4").await.unwrap(), "n4-r1");
    assert_eq!(provider.power_state("n4").await.unwrap(), PowerState::On);
}

#[tokio::test]
async fn replace_that_prints_no_usable_name_fails() {
    let silent = provider("reboot = \"true\"\nreplace = \"true\"");
    let message = silent.replace("n1").await.unwrap_err().to_string();
    assert!(message.contains("printed no new node name"), "{message}");
    let garbage = provider("reboot = \"true\"\nreplace = \"echo 'new node: n2'\"");
    let message = garbage.replace("n1").await.unwrap_err().to_string();
    assert!(message.contains("unusable node name"), "{message}");
}
