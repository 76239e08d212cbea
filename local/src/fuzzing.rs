//! The scenario file's fuzz target body ([`check_scenario`]); `fuzz/` runs it under cargo-fuzz and
//! `tests/tests/fuzz_targets.rs` under proptest on the stable toolchain.

use std::path::Path;

use crate::faults::Fault;
use crate::scenario::{Scenario, ScenarioError};

/// `data` as a scenario file (`fleetmend up --scenario FILE`).
///
/// Holds: parsing never panics; a scenario refused for its content names every problem's field; a
/// scenario accepted writes back to TOML that parses to the same scenario, and each of its faults
/// prints as a name that parses back to the same fault.
pub fn check_scenario(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let path = Path::new("fuzzed.toml");
    match Scenario::parse(text, path) {
        Ok(scenario) => {
            let written = match toml::to_string(&scenario) {
                Ok(written) => written,
                Err(err) => panic!("an accepted scenario does not write back: {err}"),
            };
            match Scenario::parse(&written, path) {
                Ok(again) => assert_eq!(again, scenario, "written back as:\n{written}"),
                Err(err) => panic!("a scenario written back does not parse: {err}\n{written}"),
            }
            for plan in &scenario.faults {
                let name = plan.fault.to_string();
                assert_eq!(name.parse::<Fault>().ok(), Some(plan.fault), "{name:?}");
            }
        }
        Err(ScenarioError::Invalid { problems, .. }) => {
            assert!(!problems.is_empty());
            for (field, message) in &problems {
                assert!(!field.is_empty() && !message.is_empty(), "{field:?}: {message:?}");
            }
        }
        Err(_) => {}
    }
}
