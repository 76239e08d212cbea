//! A real NIC fault: the agent runs inside a network namespace (as a test host would), its
//! interface is one end of a veth pair, and the other end is taken down and up from outside.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::Duration;

use fleetmend_proto::{HealthView, Status};
use fleetmend_tests::netns::ip;
use fleetmend_tests::{fleetmend_bin, poll_until, run_with_timeout};

/// A namespace and veth pair, removed on drop.
struct TestHost {
    netns: String,
    /// The far end, in the test's own namespace.
    outer: String,
    /// The host's interface, inside the namespace.
    inner: String,
}

impl TestHost {
    fn create(tag: &str) -> TestHost {
        let id = std::process::id() % 100_000;
        let host = TestHost {
            netns: format!("fm-{tag}-{id}"),
            outer: format!("fm{tag}{id}o"),
            inner: format!("fm{tag}{id}i"),
        };
        let inner = host.inner.clone();
        for args in [
            vec!["netns", "add", &host.netns],
            vec!["link", "add", &host.outer, "type", "veth", "peer", "name", &inner],
            vec!["link", "set", &inner, "netns", &host.netns],
            vec!["link", "set", &host.outer, "up"],
            vec!["-n", &host.netns, "link", "set", &inner, "up"],
            vec!["-n", &host.netns, "link", "set", "lo", "up"],
        ] {
            ip(&args);
        }
        host
    }

    /// `fleetmend agent --once` inside the namespace (with its own sysfs, as `ip netns exec`
    /// mounts), requiring the inner interface.
    fn agent_once(&self, config: &std::path::Path) -> (Option<i32>, HealthView) {
        let output = run_with_timeout(
            Command::new("ip")
                .args(["netns", "exec", &self.netns])
                .arg(fleetmend_bin())
                .args(["agent", "--once", "--output=json", "--gpu=none", "--config"])
                .arg(config),
            Duration::from_secs(30),
        );
        let view = serde_json::from_slice(&output.stdout).unwrap_or_else(|err| {
            panic!(
                "not a health view ({err}):\n{}\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )
        });
        (output.status.code(), view)
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.outer]).status();
        let _ = Command::new("ip").args(["netns", "del", &self.netns]).status();
    }
}

fn nic_findings(view: &HealthView, interface: &str) -> Vec<(String, Status)> {
    view.findings
        .iter()
        .filter(|f| f.check == "nic" && f.subject == interface)
        .map(|f| (f.finding.clone(), f.status))
        .collect()
}

#[test]
fn link_down_fails_the_nic_check_and_link_up_clears_it() {
    let host = TestHost::create("n");
    let inner = host.inner.clone();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[checks.nic]\nrequired = [\"{inner}\"]\n[checks.kernel_log]\nenabled = false\n[checks.disk]\nenabled = false\n[checks.host]\nenabled = false\n[checks.pcie]\nenabled = false\n"
        ),
    )
    .unwrap();

    let (code, view) = host.agent_once(&config);
    assert_eq!(code, Some(0), "{:#?}", view.findings);
    assert!(
        nic_findings(&view, &inner).iter().all(|(_, s)| *s == Status::Ok),
        "{:#?}",
        view.findings
    );

    // The cable is pulled at the far end: the host's interface loses carrier.
    ip(&["link", "set", &host.outer, "down"]);
    let mut last = None;
    let failed = poll_until(Duration::from_secs(5), || {
        let (code, view) = host.agent_once(&config);
        let failing =
            code == Some(1) && nic_findings(&view, &inner).iter().any(|(_, s)| *s == Status::Fail);
        last = Some(view);
        failing
    });
    assert!(failed, "link down did not fail the nic check: {last:#?}");

    ip(&["link", "set", &host.outer, "up"]);
    let cleared = poll_until(Duration::from_secs(5), || {
        let (code, view) = host.agent_once(&config);
        let ok =
            code == Some(0) && nic_findings(&view, &inner).iter().all(|(_, s)| *s != Status::Fail);
        last = Some(view);
        ok
    });
    assert!(cleared, "link up did not clear the nic check: {last:#?}");
}
