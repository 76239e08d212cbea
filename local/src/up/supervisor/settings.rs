//! How the agents are run ([`AgentSettings`]) and the part of each agent's config that the fleet
//! writes: whom it reports to, where its job ranks run, where its evidence goes.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How the agents are run.
#[derive(Debug, Clone)]
pub struct AgentSettings {
    /// The `fleetmend` executable (`agent` is its verb).
    pub exe: PathBuf,
    /// The agents' bearer token, in a file.
    pub token_file: PathBuf,
    /// Time between the agents' regular reports.
    pub report_interval: Duration,
    /// When an agent stops, its ranks get SIGTERM, then SIGKILL after this long.
    pub rank_stop_grace: Duration,
    /// A simulated reboot keeps the agent down this long after the tree was rebuilt.
    pub boot_delay: Duration,
}

impl AgentSettings {
    /// The `[report]`, `[jobs]` and `[commands.evidence]` sections of `node`'s agent config.
    /// `repairers`: the repairers' base URLs (several: every repairer of a fleet with a standby,
    /// the agent follows a standby's pointer to the leader).
    pub fn agent_toml(&self, repairers: &[String], jobs_dir: &Path) -> String {
        let evidence = jobs_dir.parent().unwrap_or(jobs_dir).join("evidence");
        format!(
            "[report]\nrepairer = {repairer}\ntoken_file = {token}\ninterval = \"{interval}\"\n\
             timeout = \"2s\"\nbackoff_initial = \"200ms\"\nbackoff_max = \"2s\"\n\n\
             [jobs]\nenabled = true\ndir = {jobs}\nadvertise_address = \"127.0.0.1\"\n\
             stop_grace = \"{grace}\"\n\n[commands.evidence]\ndir = {evidence}\n",
            repairer = match repairers {
                [one] => toml_string(one),
                many => format!(
                    "[{}]",
                    many.iter().map(|url| toml_string(url)).collect::<Vec<_>>().join(", ")
                ),
            },
            token = toml_string(&self.token_file.display().to_string()),
            interval = humantime::format_duration(self.report_interval),
            jobs = toml_string(&jobs_dir.display().to_string()),
            grace = humantime::format_duration(self.rank_stop_grace),
            evidence = toml_string(&evidence.display().to_string()),
        )
    }
}

/// `s` as a TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_config_is_valid_toml_naming_the_repairer_and_the_jobs_dir() {
        let settings = AgentSettings {
            exe: PathBuf::from("/bin/fleetmend"),
            token_file: PathBuf::from("/tmp/x \"y\"/agent.token"),
            report_interval: Duration::from_millis(300),
            rank_stop_grace: Duration::from_secs(5),
            boot_delay: Duration::from_secs(2),
        };
        let jobs = Path::new("/state/nodes/node-1/jobs");
        let text = settings.agent_toml(&["http://127.0.0.1:9830".to_owned()], jobs);
        let value: toml::Value = toml::from_str(&text).unwrap();
        assert_eq!(value["report"]["repairer"].as_str(), Some("http://127.0.0.1:9830"));
        assert_eq!(value["report"]["token_file"].as_str(), Some("/tmp/x \"y\"/agent.token"));
        assert_eq!(value["report"]["interval"].as_str(), Some("300ms"));
        assert_eq!(value["jobs"]["enabled"].as_bool(), Some(true));
        assert_eq!(value["jobs"]["dir"].as_str(), Some("/state/nodes/node-1/jobs"));
        assert_eq!(value["jobs"]["advertise_address"].as_str(), Some("127.0.0.1"));
        assert_eq!(
            value["commands"]["evidence"]["dir"].as_str(),
            Some("/state/nodes/node-1/evidence")
        );
        let both = ["http://127.0.0.1:7401".to_owned(), "http://127.0.0.1:7402".to_owned()];
        let value: toml::Value = toml::from_str(&settings.agent_toml(&both, jobs)).unwrap();
        let listed: Vec<&str> = value["report"]["repairer"]
            .as_array()
            .unwrap()
            .iter()
            .map(|url| url.as_str().unwrap())
            .collect();
        assert_eq!(listed, ["http://127.0.0.1:7401", "http://127.0.0.1:7402"]);
    }
}
