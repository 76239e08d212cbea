//! The allreduce probe on a real link: four nodes in network namespaces, their data links veth
//! pairs on a bridge, each agent running `fleetmend allreduce` ranks over its namespace's data
//! link for the repairer's probe of idle nodes. Once the fleet has a median, one node's NIC is
//! rate-limited (`tc ... tbf`, real kernel shaping): the probe measures it low with two peers, the
//! `allreduce_slow` finding drains it and no other node; the limit lifted, it measures well again
//! and is put back.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use fleetmend_tests::netns::{NetnsFleet, events_cli, node_state, nodes_json, story};
use fleetmend_tests::{free_port, http_get, poll_until, run_with_timeout};

/// The probe's results so far (`fleetmend_allreduce_probes_total`), by result.
fn probes(api: SocketAddr, result: &str) -> f64 {
    let Some((200, text)) = http_get(api, "/metrics") else { return 0.0 };
    let prefix = format!("fleetmend_allreduce_probes_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

fn tc(netns: &str, args: &[&str]) {
    let output = run_with_timeout(
        std::process::Command::new("ip").args(["netns", "exec", netns, "tc"]).args(args),
        Duration::from_secs(10),
    );
    assert!(
        output.status.success(),
        "tc {} failed (this test needs root and sch_tbf): {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn a_rate_limited_link_fails_the_allreduce_probe_and_passes_once_lifted() {
    let dir = tempfile::tempdir().unwrap();
    let names = ["ar-a", "ar-b", "ar-c", "ar-d"];
    // Fraction 0.25, not the default 0.5: on a 2-core machine, with every rank a debug build
    // sharing the CPUs, healthy pairs measure up to 2× apart; the shaped link measures ~0.02×.
    let settings = format!(
        "scheduler = \"memory\"\n\
         [engine]\ntick = \"100ms\"\nreport_interval = \"300ms\"\n\
         [allreduce]\nevery = \"1s\"\nbytes = 2097152\niterations = 3\nmin_samples = 3\n\
         fraction = 0.25\ntimeout = \"20s\"\nport = {}\n",
        free_port()
    );
    // The probe's ranks meet over the data link: the node is reached at that address.
    let fleet = NetnsFleet::start(dir.path(), "fmar", &names, &settings, |_, host| {
        format!(
            "[jobs]\nenabled = true\ndir = \"{}\"\nadvertise_address = \"{}\"\n",
            dir.path().join(format!("jobs-{}", host.node)).display(),
            host.data_address,
        )
    });
    let api = fleet.api;

    // Healthy, then enough passing measurements for a median.
    let baseline = poll_until(Duration::from_secs(60), || {
        let nodes = nodes_json(api);
        names.iter().all(|n| node_state(&nodes, n).as_deref() == Some("healthy"))
            && probes(api, "pass") >= 2.0
    });
    assert!(baseline, "no baseline formed:\n{}", fleet.diagnostics());
    assert_eq!(probes(api, "low") + probes(api, "failed"), 0.0, "a healthy fleet measured low");

    // ar-c's NIC sends at 50 Mbit/s: a real kernel shaper on its egress.
    let slow = &fleet.hosts[2];
    tc(
        &slow.netns,
        &[
            "qdisc", "add", "dev", &slow.nic, "root", "tbf", "rate", "50mbit", "burst", "32kbit",
            "latency", "400ms",
        ],
    );
    let limited = Instant::now();
    let drained = poll_until(Duration::from_secs(60), || {
        node_state(&nodes_json(api), "ar-c").as_deref() == Some("drained")
    });
    assert!(drained, "ar-c was not drained:\n{}", fleet.diagnostics());
    eprintln!("rate limit → drained in {:.2} s", limited.elapsed().as_secs_f64());
    let events = events_cli(api);
    let draining = events
        .iter()
        .find(|e| {
            e["kind"] == "state-changed" && e["node"] == "ar-c" && e["to_state"] == "draining"
        })
        .unwrap_or_else(|| panic!("no draining event:\n{}", story(&events)));
    let why = serde_json::to_string(&draining["findings"]).unwrap();
    assert!(why.contains("allreduce_slow"), "ar-c was drained for something else: {why}");
    eprintln!("{}", draining["findings"][0]["message"]);
    let nodes = nodes_json(api);
    for other in ["ar-a", "ar-b", "ar-d"] {
        assert_eq!(node_state(&nodes, other).as_deref(), Some("healthy"), "{}", story(&events));
        assert!(
            !events.iter().any(|e| e["node"] == other && e["to_state"] == "draining"),
            "{other} was drained:\n{}",
            story(&events)
        );
    }

    // The limit lifted: the same node measures well and is put back.
    tc(&slow.netns, &["qdisc", "del", "dev", &slow.nic, "root"]);
    let back = poll_until(Duration::from_secs(60), || {
        node_state(&nodes_json(api), "ar-c").as_deref() == Some("healthy")
    });
    assert!(back, "ar-c did not come back once the limit was lifted:\n{}", fleet.diagnostics());

    fleet.stop();
}
