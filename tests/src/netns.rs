//! Simulated hosts for system tests: network namespaces whose control link reaches a repairer
//! in the test's own namespace and whose data link is a port of a bridge standing for the fabric
//! (tests/tests/chaos.rs, tests/tests/allreduce_netns.rs). Needs root and iproute2.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::{Running, fleetmend_bin, http_get, poll_until, run_with_timeout};

/// The tokens of the namespaced fleets' repairers.
pub const ADMIN: &str = "admin-secret";
pub const AGENT: &str = "agent-secret";

/// Runs `ip ARGS`, failing the test when it fails.
pub fn ip(args: &[&str]) {
    let output = run_with_timeout(Command::new("ip").args(args), Duration::from_secs(10));
    assert!(
        output.status.success(),
        "ip {} failed (this test needs root and iproute2): {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A simulated host: a network namespace with a control link to the repairer (a veth pair with
/// addresses) and a data link (a veth pair whose outer end is a port of the fabric's bridge).
#[derive(Debug)]
pub struct NetnsHost {
    pub node: String,
    pub netns: String,
    /// The data link's ends: the switch port (outside) and the host's NIC (inside).
    pub port: String,
    pub nic: String,
    pub control_outer: String,
    /// The host's address on the control link, where its agent listens.
    pub address: String,
    /// The host's address on the data link (on the bridge).
    pub data_address: String,
}

impl NetnsHost {
    pub fn create(node: &str, index: u8, tag: u32, bridge: &str) -> NetnsHost {
        let subnet = tag % 250;
        let host = NetnsHost {
            node: node.to_owned(),
            netns: format!("fmc-{node}-{tag}"),
            port: format!("fd{index}{tag}p"),
            nic: format!("fd{index}{tag}n"),
            control_outer: format!("fc{index}{tag}o"),
            address: format!("10.231.{subnet}.{}", index * 4 + 2),
            data_address: format!("10.232.{subnet}.{}", index + 1),
        };
        let control_inner = format!("fc{index}{tag}i");
        let outer_address = format!("10.231.{subnet}.{}/30", index * 4 + 1);
        let inner_address = format!("{}/30", host.address);
        let data_address = format!("{}/24", host.data_address);
        for args in [
            vec!["netns", "add", &host.netns],
            vec!["-n", &host.netns, "link", "set", "lo", "up"],
            // Control: the agent's reports and the repairer's replies.
            vec![
                "link",
                "add",
                &host.control_outer,
                "type",
                "veth",
                "peer",
                "name",
                &control_inner,
            ],
            vec!["link", "set", &control_inner, "netns", &host.netns],
            vec!["addr", "add", &outer_address, "dev", &host.control_outer],
            vec!["link", "set", &host.control_outer, "up"],
            vec!["-n", &host.netns, "addr", "add", &inner_address, "dev", &control_inner],
            vec!["-n", &host.netns, "link", "set", &control_inner, "up"],
            // Data: the NIC the job would use, cabled to a port of the bridge.
            vec!["link", "add", &host.port, "type", "veth", "peer", "name", &host.nic],
            vec!["link", "set", &host.nic, "netns", &host.netns],
            vec!["link", "set", &host.port, "master", bridge],
            vec!["link", "set", &host.port, "up"],
            vec!["-n", &host.netns, "addr", "add", &data_address, "dev", &host.nic],
            vec!["-n", &host.netns, "link", "set", &host.nic, "up"],
        ] {
            ip(&args);
        }
        host
    }

    /// The real agent inside the namespace, reading the namespace's own /sys for its NIC and
    /// reporting to `repairer` over the control link.
    /// `extra` is appended to the agent's config (more sections).
    pub fn start_agent(&self, dir: &Path, repairer: &str, extra: &str) -> Running {
        let listen: SocketAddr = format!("{}:9831", self.address).parse().unwrap();
        let config = dir.join(format!("agent-{}.toml", self.node));
        std::fs::write(
            &config,
            format!(
                "node = \"{node}\"\n\
                 [checks.nic]\nrequired = [\"{nic}\"]\ninterval = \"500ms\"\ntimeout = \"500ms\"\n\
                 [checks.kernel_log]\nenabled = false\n[checks.disk]\nenabled = false\n\
                 [checks.host]\nenabled = false\n\
                 [report]\nrepairer = \"{repairer}\"\ntoken = \"{AGENT}\"\ninterval = \"300ms\"\n{extra}",
                node = self.node,
                nic = self.nic,
            ),
        )
        .unwrap();
        let stderr_path = dir.join(format!("agent-{}.stderr", self.node));
        let child = Command::new("ip")
            .args(["netns", "exec", &self.netns])
            .arg(fleetmend_bin())
            .args(["agent", "--gpu=none", "--listen", &listen.to_string(), "--config"])
            .arg(&config)
            .env("FLEETMEND_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr_path).unwrap())
            .spawn()
            .unwrap();
        let mut running = Running { child, stderr_path };
        let up = poll_until(Duration::from_secs(20), || {
            if let Ok(Some(status)) = running.child.try_wait() {
                panic!("the agent of {} exited ({status}):\n{}", self.node, running.stderr());
            }
            http_get(listen, "/healthz").is_some_and(|(status, _)| status == 200)
        });
        assert!(up, "the agent of {} did not answer on {listen}:\n{}", self.node, running.stderr());
        running
    }
}

impl Drop for NetnsHost {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.port]).status();
        let _ = Command::new("ip").args(["link", "del", &self.control_outer]).status();
        let _ = Command::new("ip").args(["netns", "del", &self.netns]).status();
    }
}

/// A bridge standing for the fabric's switch, removed on drop.
#[derive(Debug)]
pub struct Bridge(pub String);

impl Bridge {
    /// A bridge named `name`, up.
    pub fn create(name: String) -> Bridge {
        let bridge = Bridge(name);
        ip(&["link", "add", &bridge.0, "type", "bridge"]);
        ip(&["link", "set", &bridge.0, "up"]);
        bridge
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.0]).status();
    }
}

/// `fleetmend ARGS --output json` against `repairer` as the admin, as a list (empty when it
/// printed none).
fn cli_json(repairer: SocketAddr, args: &[&str]) -> Vec<Value> {
    let output = run_with_timeout(
        Command::new(fleetmend_bin())
            .args(args)
            .args(["--output", "json"])
            .env("FLEETMEND_REPAIRER", format!("http://127.0.0.1:{}", repairer.port()))
            .env("FLEETMEND_TOKEN", ADMIN),
        Duration::from_secs(20),
    );
    serde_json::from_slice::<Value>(&output.stdout)
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
}

pub fn nodes_json(repairer: SocketAddr) -> Vec<Value> {
    cli_json(repairer, &["nodes"])
}

pub fn node_state(nodes: &[Value], node: &str) -> Option<String> {
    nodes.iter().find(|n| n["name"] == node).and_then(|n| n["state"].as_str().map(str::to_owned))
}

pub fn events_cli(repairer: SocketAddr) -> Vec<Value> {
    cli_json(repairer, &["events", "--limit", "1000"])
}

/// One line per event, for failure messages.
pub fn story(events: &[Value]) -> String {
    events
        .iter()
        .map(|e| {
            format!(
                "{:>4} {:<24} {:<8} {}{}",
                e["id"],
                e["kind"].as_str().unwrap_or(""),
                e["node"].as_str().unwrap_or("-"),
                match (e["from_state"].as_str(), e["to_state"].as_str()) {
                    (Some(from), Some(to)) => format!("{from} → {to}: "),
                    _ => String::new(),
                },
                e["reason"].as_str().unwrap_or("")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Hosts in namespaces on one bridge, a real repairer in the test's namespace listening on every
/// address (plain HTTP: `insecure`, as in a lab), and each host's real agent reporting to it over
/// its control link.
#[derive(Debug)]
pub struct NetnsFleet {
    pub repairer: Running,
    pub agents: Vec<Running>,
    /// The repairer's API, from the test's namespace.
    pub api: SocketAddr,
    /// Dropped after the agents: the hosts, then the bridge.
    pub hosts: Vec<NetnsHost>,
    pub bridge: Bridge,
}

impl NetnsFleet {
    /// Hosts named `names` on bridge `BRIDGE_PREFIX<tag>`; `settings` is appended to the repairer's
    /// config and `agent_extra(index, host)` to each agent's.
    pub fn start(
        dir: &Path,
        bridge_prefix: &str,
        names: &[&str],
        settings: &str,
        agent_extra: impl Fn(usize, &NetnsHost) -> String,
    ) -> NetnsFleet {
        let tag = std::process::id() % 100_000;
        let bridge = Bridge::create(format!("{bridge_prefix}{tag}"));
        let hosts: Vec<NetnsHost> = names
            .iter()
            .enumerate()
            .map(|(i, name)| NetnsHost::create(name, i as u8, tag, &bridge.0))
            .collect();
        let port = crate::free_port();
        let listen = SocketAddr::from(([0, 0, 0, 0], port));
        let config = dir.join("repairer.toml");
        std::fs::write(
            &config,
            format!(
                "listen = \"{listen}\"\nstore = \"{}\"\nagent_token = \"{AGENT}\"\n\
                 admin_token = \"{ADMIN}\"\ninsecure = true\n{settings}\n",
                dir.join("repairer.db").display()
            ),
        )
        .unwrap();
        let api = SocketAddr::from(([127, 0, 0, 1], port));
        let repairer = crate::start_repairer(
            &config,
            api,
            &dir.join("repairer.stderr"),
            Duration::from_secs(20),
        );
        let agents = hosts
            .iter()
            .enumerate()
            .map(|(i, host)| {
                let gateway = format!("http://10.231.{}.{}:{port}", tag % 250, i * 4 + 1);
                host.start_agent(dir, &gateway, &agent_extra(i, host))
            })
            .collect();
        NetnsFleet { repairer, agents, api, hosts, bridge }
    }

    /// The nodes, the events and every process's log, for a failure message.
    pub fn diagnostics(&self) -> String {
        format!(
            "nodes: {:#?}\nevents:\n{}\nrepairer:\n{}\nagents:\n{}",
            nodes_json(self.api),
            story(&events_cli(self.api)),
            self.repairer.stderr(),
            self.agents.iter().map(Running::stderr).collect::<Vec<_>>().join("\n---\n")
        )
    }

    /// Stops every agent, then the repairer.
    pub fn stop(mut self) {
        for agent in &mut self.agents {
            agent.terminate(Duration::from_secs(10));
        }
        self.repairer.terminate(Duration::from_secs(10));
    }
}
