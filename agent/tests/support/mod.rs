//! Helpers shared by the agent's integration tests: fixture cases, building and running a check,
//! and looking up what a run reported. Each test file uses only some of them.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use fleetmend_agent::checks::{BuildContext, Check, EventSignal, Mode, Observation, RunContext};
use fleetmend_agent::config::HostPaths;
use fleetmend_proto::{Finding, RecommendedAction, Status};

/// A fixture case: `agent/tests/fixtures/<case>`.
pub fn fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(case)
}

/// A writable copy of a fixture case, removed when dropped.
pub fn copy_case(case: &str) -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), &target).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    copy(&fixture(case), dir.path());
    dir
}

/// What a check is built with: node `node1` and a fresh event signal.
pub fn build_context(paths: &HostPaths, mode: Mode) -> BuildContext<'_> {
    BuildContext { paths, node: "node1", mode, events: EventSignal::default() }
}

/// One run of `check` at wall-clock time `now`, with ten seconds to finish.
pub fn run_at(check: &mut dyn Check, paths: &HostPaths, now: SystemTime) -> Observation {
    check.run(&RunContext { paths, now, deadline: Instant::now() + Duration::from_secs(10) })
}

/// One run of `check` now.
pub fn run(check: &mut dyn Check, paths: &HostPaths) -> Observation {
    run_at(check, paths, SystemTime::now())
}

/// The finding `finding` about `subject`; panics, listing the findings, when there is none.
pub fn find<'a>(obs: &'a Observation, finding: &str, subject: &str) -> &'a Finding {
    obs.findings
        .iter()
        .find(|f| f.finding == finding && f.subject == subject)
        .unwrap_or_else(|| panic!("no {finding}/{subject:?} in {:#?}", obs.findings))
}

/// The findings that are not ok.
pub fn not_ok(obs: &Observation) -> Vec<&Finding> {
    obs.findings.iter().filter(|f| f.status != Status::Ok).collect()
}

/// The value of the first sample `name` carrying all of `labels` (and maybe others).
pub fn sample(obs: &Observation, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    obs.samples
        .iter()
        .find(|s| {
            s.desc.name == name
                && labels.iter().all(|(k, v)| s.labels.iter().any(|(sk, sv)| sk == k && sv == v))
        })
        .map(|s| s.value)
}

pub fn assert_finding(f: &Finding, status: Status, action: RecommendedAction) {
    assert_eq!((f.status, f.action), (status, action), "{f:#?}");
}

/// Polls `cond` every 10 ms until it holds or `within` passes; then whether it held.
pub fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}
