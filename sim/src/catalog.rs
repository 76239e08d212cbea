//! The fault catalog: which root causes interrupt a training run, how often each does relative to
//! the others, what fleetmend's agent sees of each, and what it takes to fix the node.
//!
//! The default is the Llama 3 405B pre-training table (arXiv 2407.21783, Table 5), embedded from
//! `catalog.toml` beside this file with the reason for every mapping; a user's own TOML in the same
//! shape replaces it.

use std::fmt;
use std::time::Duration;

use fleetmend_local::faults::Fault;
use serde::Deserialize;

pub use fleetmend_agent::config::ConfigProblems;

/// The embedded default catalog.
pub const DEFAULT_CATALOG_TOML: &str = include_str!("catalog.toml");

/// Seconds in a day, for rates per node-day.
const DAY_SECONDS: f64 = 86_400.0;

/// The root causes that interrupt a run, with their counts over an observed fleet and window.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultCatalog {
    /// Where the counts come from, in a few words (shown in summaries).
    pub source: String,
    /// How many nodes the counts were observed on.
    pub nodes: u32,
    /// How long the counts were observed for.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// One row per root cause.
    pub categories: Vec<FaultCategory>,
}

/// One root cause of interruptions.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultCategory {
    /// A kebab-case id, unique in the catalog (`faulty-gpu`).
    pub name: String,
    /// Interruptions of this cause over the catalog's window; its share is count / total.
    pub count: u32,
    /// The agent's check that sees it, or `none` where the agent sees nothing.
    pub check: AgentCheck,
    /// The finding id the check reports (`xid`, `nic_down`), or `none` with check `none`.
    pub finding: String,
    /// The `fleetmend inject` fault that makes the agent see the same, or `none`.
    #[serde(deserialize_with = "fault_or_none")]
    pub fault: Option<Fault>,
    /// Whether the node is healthy again after a reboot; false: a part must be replaced (or, for
    /// the network, fixed outside the node) first.
    pub reboot_clears: bool,
    /// How long a reboot takes, until the node's agent reports again.
    #[serde(with = "humantime_serde")]
    pub reboot_time: Duration,
    /// How long a replacement takes, until the node is back in the fleet.
    #[serde(with = "humantime_serde")]
    pub replace_time: Duration,
    /// Whether the fault kills the job's rank where it strikes (default); false: the job runs on
    /// until the repairer drains the node, and checkpoints when asked to first.
    #[serde(default = "kills_job_by_default")]
    pub kills_job: bool,
}

fn kills_job_by_default() -> bool {
    true
}

/// The agent's checks (agent/src/checks/mod.rs, `CHECK_NAMES`), and `none`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentCheck {
    Gpu,
    KernelLog,
    Nic,
    Pcie,
    Disk,
    Host,
    /// The agent sees nothing: the job fails, or the node goes silent.
    None,
}

impl AgentCheck {
    pub fn as_str(self) -> &'static str {
        match self {
            AgentCheck::Gpu => "gpu",
            AgentCheck::KernelLog => "kernel_log",
            AgentCheck::Nic => "nic",
            AgentCheck::Pcie => "pcie",
            AgentCheck::Disk => "disk",
            AgentCheck::Host => "host",
            AgentCheck::None => "none",
        }
    }
}

impl fmt::Display for AgentCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `fault = "none"` (no inject fault reproduces it) or a `fleetmend inject` fault name.
fn fault_or_none<'de, D: serde::Deserializer<'de>>(from: D) -> Result<Option<Fault>, D::Error> {
    let text = String::deserialize(from)?;
    if text == "none" {
        return Ok(None);
    }
    text.parse().map(Some).map_err(serde::de::Error::custom)
}

/// Loading a catalog failed.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("parsing fault catalog {origin}: {message}")]
    Parse { origin: String, message: String },
    #[error("fault catalog {origin} has {} problem(s):\n{problems}", problems.0.len())]
    Invalid { origin: String, problems: ConfigProblems },
}

impl FaultCatalog {
    /// The embedded Llama 3 405B catalog.
    pub fn builtin() -> Result<FaultCatalog, CatalogError> {
        FaultCatalog::parse(DEFAULT_CATALOG_TOML, "(built in)")
    }

    /// Parses and validates a catalog; `origin` names it in errors (a path, or "(built in)").
    pub fn parse(text: &str, origin: &str) -> Result<FaultCatalog, CatalogError> {
        let catalog: FaultCatalog = toml::from_str(text).map_err(|err| CatalogError::Parse {
            origin: origin.to_owned(),
            message: err.to_string(),
        })?;
        let problems = catalog.validate();
        if problems.is_empty() {
            Ok(catalog)
        } else {
            Err(CatalogError::Invalid { origin: origin.to_owned(), problems })
        }
    }

    /// Every problem in the catalog, each naming its field.
    pub fn validate(&self) -> ConfigProblems {
        let mut problems = ConfigProblems::default();
        if self.source.trim().is_empty() {
            problems.push("source", "must say where the counts come from");
        }
        if self.nodes == 0 {
            problems.push("nodes", "must be greater than zero");
        }
        if self.window.is_zero() {
            problems.push("window", "must be greater than zero");
        }
        if self.categories.is_empty() {
            problems.push("categories", "must list at least one category");
        } else if self.total_count() == 0 {
            problems.push("categories", "the counts sum to zero: no category can be drawn");
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, category) in self.categories.iter().enumerate() {
            let at = format!("categories[{i}]");
            if !is_kebab_case(&category.name) {
                problems.push(
                    format!("{at}.name"),
                    format!("{:?} is not a kebab-case id (a-z, 0-9, -)", category.name),
                );
            } else if !names.insert(category.name.as_str()) {
                problems.push(
                    format!("{at}.name"),
                    format!("{:?} names another category already", category.name),
                );
            }
            validate_sighting(category, &at, &mut problems);
            // The other way round is fine: a fault the agent would reboot for may still need a part
            // (the repairer's escalation finds out); one it asks to replace cannot clear on reboot.
            if let Some(fault) = category.fault
                && category.reboot_clears
                && fault.agent_advises_replace()
            {
                problems.push(
                    format!("{at}.reboot_clears"),
                    format!(
                        "the agent advises a replacement for {fault}: a reboot cannot clear it"
                    ),
                );
            }
            for (field, value) in
                [("reboot_time", category.reboot_time), ("replace_time", category.replace_time)]
            {
                if value.is_zero() {
                    problems.push(format!("{at}.{field}"), "must be greater than zero");
                }
            }
        }
        problems
    }

    /// The sum of every category's count.
    pub fn total_count(&self) -> u64 {
        self.categories.iter().map(|category| u64::from(category.count)).sum()
    }

    /// The share of interruptions from category `index` (0 when there is no such category).
    pub fn share(&self, index: usize) -> f64 {
        let total = self.total_count();
        match self.categories.get(index) {
            Some(category) if total > 0 => f64::from(category.count) / total as f64,
            _ => 0.0,
        }
    }

    /// The observed interruption rate, per node per day (3.79 per 1,000 node-days for Llama 3).
    pub fn rate_per_node_day(&self) -> f64 {
        let node_days = f64::from(self.nodes) * self.window.as_secs_f64() / DAY_SECONDS;
        if node_days > 0.0 { self.total_count() as f64 / node_days } else { 0.0 }
    }

    /// The index of the category called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.categories.iter().position(|category| category.name == name)
    }
}

/// Checks that `check`, `finding` and `fault` agree with each other and with the agent.
fn validate_sighting(category: &FaultCategory, at: &str, problems: &mut ConfigProblems) {
    let finding = category.finding.as_str();
    match category.check {
        AgentCheck::None if finding != "none" => problems.push(
            format!("{at}.finding"),
            format!("must be \"none\" when check is \"none\" (found {finding:?})"),
        ),
        AgentCheck::None => {}
        check if finding == "none" || !is_snake_case(finding) => problems.push(
            format!("{at}.finding"),
            format!("{finding:?} is not a snake_case finding id of the {check} check"),
        ),
        _ => {}
    }
    let Some(fault) = category.fault else { return };
    let expected = fault.agent_findings();
    match fault {
        Fault::AgentKill if category.check != AgentCheck::None => problems.push(
            format!("{at}.check"),
            "agent-kill silences the node's agent: the check must be \"none\"",
        ),
        Fault::AgentKill => {}
        fault if fault.is_job_fault() => problems.push(
            format!("{at}.fault"),
            format!("{fault} hits a job's ranks, which the simulator does not model per rank"),
        ),
        fault if !expected.contains(&(category.check.as_str(), finding)) => {
            let raised: Vec<String> =
                expected.iter().map(|(check, finding)| format!("{check}/{finding}")).collect();
            problems.push(
                format!("{at}.finding"),
                format!(
                    "{fault} makes the agent report {}, not {}/{finding}",
                    raised.join(" or "),
                    category.check
                ),
            );
        }
        _ => {}
    }
}

fn is_kebab_case(text: &str) -> bool {
    !text.is_empty()
        && !text.starts_with('-')
        && !text.ends_with('-')
        && text.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

fn is_snake_case(text: &str) -> bool {
    !text.is_empty()
        && text.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_catalog_parses_and_validates() {
        let catalog = FaultCatalog::builtin().unwrap();
        assert_eq!(catalog.categories.len(), 18);
        assert_eq!(catalog.nodes, 2048);
        assert_eq!(catalog.window, Duration::from_secs(54 * 86_400));
        assert_eq!(catalog.validate(), ConfigProblems::default());
    }

    #[test]
    fn the_builtin_counts_are_table_5() {
        let catalog = FaultCatalog::builtin().unwrap();
        assert_eq!(catalog.total_count(), 419);
        let counts: Vec<u32> = catalog.categories.iter().map(|c| c.count).collect();
        assert_eq!(counts, [148, 72, 54, 35, 32, 19, 17, 7, 7, 6, 6, 3, 3, 2, 2, 2, 2, 2]);
        let shares: f64 = (0..catalog.categories.len()).map(|i| catalog.share(i)).sum();
        assert!((shares - 1.0).abs() < 1e-12);
        assert!((catalog.share(0) - 148.0 / 419.0).abs() < 1e-12);
        // 419 / (2,048 x 54) = 3.79 per 1,000 node-days, as the notes say.
        assert!((catalog.rate_per_node_day() * 1000.0 - 3.79).abs() < 0.005);
        assert_eq!(catalog.index_of("software-bug"), Some(2));
        assert_eq!(catalog.index_of("no-such"), None);
    }

    #[test]
    fn the_builtin_mapping_reads_as_intended() {
        let catalog = FaultCatalog::builtin().unwrap();
        let row = |name: &str| &catalog.categories[catalog.index_of(name).unwrap()];
        assert_eq!(row("faulty-gpu").fault, Some(Fault::GpuXid(79)));
        assert!(!row("faulty-gpu").reboot_clears);
        assert_eq!(row("gpu-hbm3-memory").fault, Some(Fault::GpuXid(48)));
        assert!(row("gpu-hbm3-memory").reboot_clears);
        assert_eq!(row("software-bug").check, AgentCheck::None);
        assert_eq!(row("software-bug").fault, None);
        assert_eq!(row("host-maintenance").fault, Some(Fault::AgentKill));
        assert_eq!(row("host-maintenance").reboot_time, Duration::from_secs(2 * 3600));
        assert!(!row("silent-data-corruption").reboot_clears);
    }

    /// The finding ids are the agent's: its checks' sources name each of them, and each check is
    /// one the agent registers.
    #[test]
    fn the_builtin_findings_are_the_agents() {
        // A check's source: its file and, for a check split into a directory, every file in it.
        let source_of = |check: AgentCheck| -> String {
            if check == AgentCheck::None {
                return String::new();
            }
            let checks =
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent/src/checks");
            let name = check.as_str();
            let mut files = vec![checks.join(format!("{name}.rs"))];
            if let Ok(dir) = std::fs::read_dir(checks.join(name)) {
                files.extend(dir.map(|entry| entry.unwrap().path()));
            }
            files.iter().filter_map(|file| std::fs::read_to_string(file).ok()).collect()
        };
        let catalog = FaultCatalog::builtin().unwrap();
        for category in &catalog.categories {
            if category.check == AgentCheck::None {
                continue;
            }
            let check = category.check.as_str();
            assert!(fleetmend_agent::checks::CHECK_NAMES.contains(&check), "{}", category.name);
            let quoted = format!("\"{}\"", category.finding);
            assert!(
                source_of(category.check).contains(&quoted),
                "{}: finding {quoted} not in the {} check's source",
                category.name,
                category.check
            );
        }
    }

    #[test]
    fn a_bad_table_names_every_bad_field() {
        let text = r#"
            source = ""
            nodes = 0
            window = "0s"

            [[categories]]
            name = "Faulty GPU"
            count = 1
            check = "gpu"
            finding = "xid"
            fault = "gpu-xid:79"
            reboot_clears = true
            reboot_time = "0s"
            replace_time = "2days"

            [[categories]]
            name = "hbm"
            count = 1
            check = "gpu"
            finding = "nic_down"
            fault = "gpu-xid:48"
            reboot_clears = true
            reboot_time = "10m"
            replace_time = "0s"

            [[categories]]
            name = "hbm"
            count = 1
            check = "none"
            finding = "xid"
            fault = "none"
            reboot_clears = true
            reboot_time = "10m"
            replace_time = "1d"

            [[categories]]
            name = "rows"
            count = 1
            check = "gpu"
            finding = "row_remap"
            fault = "row-remap-failure"
            reboot_clears = true
            reboot_time = "10m"
            replace_time = "1d"

            [[categories]]
            name = "psu"
            count = 1
            check = "host"
            finding = "memory_low"
            fault = "agent-kill"
            reboot_clears = false
            reboot_time = "10m"
            replace_time = "1d"
        "#;
        let err = FaultCatalog::parse(text, "bad.toml").unwrap_err();
        let CatalogError::Invalid { origin, problems } = err else { panic!("{err}") };
        assert_eq!(origin, "bad.toml");
        let fields: Vec<&str> = problems.0.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "source",
                "nodes",
                "window",
                "categories[0].name",
                "categories[0].reboot_time",
                "categories[1].finding",
                "categories[1].replace_time",
                "categories[2].name",
                "categories[2].finding",
                "categories[3].reboot_clears",
                "categories[4].check",
            ]
        );
        let text = problems.to_string();
        assert!(text.contains("gpu-xid:48 makes the agent report gpu/xid or kernel_log/xid"));
        assert!(text.contains("\"hbm\" names another category already"));
    }

    #[test]
    fn zero_counts_and_an_empty_table_are_problems() {
        let mut catalog = FaultCatalog::builtin().unwrap();
        for category in &mut catalog.categories {
            category.count = 0;
        }
        assert!(catalog.validate().names("categories"));
        catalog.categories.clear();
        assert!(catalog.validate().names("categories"));
    }

    #[test]
    fn unknown_fields_and_bad_names_fail_to_parse() {
        let extra = DEFAULT_CATALOG_TOML.replacen("count = 148", "count = 148\ncolour = 1", 1);
        let err = FaultCatalog::parse(&extra, "x").unwrap_err().to_string();
        assert!(err.contains("colour"), "{err}");
        let bad_fault = DEFAULT_CATALOG_TOML.replacen("gpu-xid:79", "gpu-on-fire", 1);
        let err = FaultCatalog::parse(&bad_fault, "x").unwrap_err().to_string();
        assert!(err.contains("gpu-on-fire"), "{err}");
        let bad_check = DEFAULT_CATALOG_TOML.replacen("check = \"gpu\"", "check = \"psu\"", 1);
        assert!(FaultCatalog::parse(&bad_check, "x").is_err());
    }
}
