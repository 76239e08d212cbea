//! Each repairer's TOML config: the in-process repairer's settings, the shared store, a listen
//! address of its own, the lease, and the `command` provider calling back into `fleetmend up`.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use crate::up::fleet::{FleetConfig, FleetError, repairer_config};

/// The repairers' lease: a killed leader's successor leads within this (and one renewal).
pub const LEASE: Duration = Duration::from_secs(6);
/// How often the leader renews its lease.
pub const RENEW: Duration = Duration::from_secs(2);

/// The TOML config of one repairer of the fleet: the in-process repairer's settings
/// ([`repairer_config`]), the shared store, a listen address of its own, the lease, and
/// the `command` provider calling back into `fleetmend up`.
pub fn repairer_toml(
    config: &FleetConfig,
    state_dir: &Path,
    store_url: &str,
    listen: SocketAddr,
) -> Result<String, FleetError> {
    let base = repairer_config(
        config,
        state_dir,
        &state_dir.join("admin.token"),
        &state_dir.join("agent.token"),
        None,
    );
    let exe = config.exe.display().to_string();
    let state = state_dir.display().to_string();
    let command = |operation: &str| {
        vec![
            exe.clone(),
            "up-provider".to_owned(),
            "--state-dir".to_owned(),
            state.clone(),
            operation.to_owned(),
            "{node}".to_owned(),
        ]
    };
    let text = |value: String| toml::Value::String(value);
    let list = |argv: Vec<String>| toml::Value::Array(argv.into_iter().map(text).collect());
    let duration = |d: Duration| text(humantime::format_duration(d).to_string());
    let entries = |entries: Vec<(&str, toml::Value)>| -> toml::Table {
        entries.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
    };
    let table = |list: Vec<(&str, toml::Value)>| toml::Value::Table(entries(list));
    let document = entries(vec![
        ("listen", text(listen.to_string())),
        ("store", text(store_url.to_owned())),
        ("agent_token_file", text(state_dir.join("agent.token").display().to_string())),
        ("admin_token_file", text(state_dir.join("admin.token").display().to_string())),
        ("scheduler", text("embedded".to_owned())),
        (
            "provider",
            table(vec![
                ("kind", text("command".to_owned())),
                ("reboot", list(command("reboot"))),
                ("replace", list(command("replace"))),
                ("power_state", list(command("power-state"))),
                ("reboot_timeout", duration(Duration::from_secs(30))),
                ("replace_timeout", duration(Duration::from_secs(60))),
                ("power_state_timeout", duration(Duration::from_secs(10))),
            ]),
        ),
        ("alerts", table(vec![("poll_interval", duration(base.alerts.poll_interval))])),
        (
            "leadership",
            table(vec![
                ("advertise", text(format!("http://{listen}"))),
                ("lease", duration(LEASE)),
                ("renew", duration(RENEW)),
            ]),
        ),
    ]);
    let mut table = document;
    let section = |name: &str, value: Result<toml::Value, toml::ser::Error>| {
        value.map_err(|err| FleetError::Repairers(format!("writing the [{name}] section: {err}")))
    };
    table.insert("engine".to_owned(), section("engine", toml::Value::try_from(&base.engine))?);
    table.insert("policy".to_owned(), section("policy", toml::Value::try_from(&base.policy))?);
    table.insert("queue".to_owned(), section("queue", toml::Value::try_from(&base.queue))?);
    toml::to_string(&table)
        .map_err(|err| FleetError::Repairers(format!("writing a repairer's config: {err}")))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use fleetmend_repairer::config::RepairerConfig;

    use super::*;

    #[test]
    fn each_repairer_config_has_the_fleet_settings_the_shared_store_and_the_callback() {
        let config = FleetConfig::new(PathBuf::from("/tmp/x"), PathBuf::from("/bin/fleetmend"));
        let listen = SocketAddr::from(([127, 0, 0, 1], 7401));
        let text = repairer_toml(
            &config,
            Path::new("/tmp/x"),
            "postgres://postgres@127.0.0.1:5432/fleetmend",
            listen,
        )
        .unwrap();
        let value: toml::Table = toml::from_str(&text).unwrap();
        assert_eq!(value["leadership"]["advertise"].as_str(), Some("http://127.0.0.1:7401"));
        assert_eq!(value["leadership"]["lease"].as_str(), Some("6s"));
        let reboot: Vec<&str> = value["provider"]["reboot"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(
            reboot,
            ["/bin/fleetmend", "up-provider", "--state-dir", "/tmp/x", "reboot", "{node}"]
        );
        let parsed = RepairerConfig::parse(&text).unwrap();
        assert_eq!(parsed.problems(), Vec::new());
        assert_eq!(parsed.listen, listen);
        let base = repairer_config(
            &config,
            Path::new("/tmp/x"),
            Path::new("/tmp/x/admin.token"),
            Path::new("/tmp/x/agent.token"),
            None,
        );
        assert_eq!(parsed.engine, base.engine);
        assert_eq!(parsed.policy, base.policy);
        // The rendezvous ports are drawn at random per config (a window below the ephemeral
        // range); the rest of the queue's settings are the fleet's.
        let mut queue = base.queue.clone();
        (queue.master_port_min, queue.master_port_max) =
            (parsed.queue.master_port_min, parsed.queue.master_port_max);
        assert_eq!(parsed.queue.master_port_max - parsed.queue.master_port_min, 199);
        assert_eq!(parsed.queue, queue);
        assert_eq!(parsed.alerts.poll_interval, base.alerts.poll_interval);
        assert_eq!(parsed.admin_token_file, base.admin_token_file);
        assert!(
            matches!(parsed.store, fleetmend_repairer::store::StoreLocation::Postgres(_)),
            "{:?}",
            parsed.store
        );
    }
}
