//! Fuzz target bodies for the agent's parsers of outside input: the kernel log and the config file.
//! Each takes arbitrary bytes and asserts what must hold for any input; `fuzz/` runs them under
//! cargo-fuzz and `tests/tests/fuzz_targets.rs` under proptest on the stable toolchain.

pub use crate::checks::kernel_log::fuzzing::check_kernel_log;

use crate::config::AgentConfig;

/// `data` as the agent's TOML config: parsing and validating never panic, and a config that
/// validates runs (see [`crate::checks::kernel_log::fuzzing::check_valid_config`]).
pub fn check_agent_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(config) = AgentConfig::parse(text) else { return };
    let problems = config.validate();
    for problem in problems.iter() {
        assert!(!problem.field.is_empty(), "a problem naming no field: {problem:?}");
    }
    if problems.is_empty() {
        crate::checks::kernel_log::fuzzing::check_valid_config(&config.checks.kernel_log);
    }
}
