//! The repairer's audit log of one simulation, one event a line (`at_ms kind node action
//! reason`): `cargo run --release -p fleetmend-sim --example event_log -- [--config=FILE] KEY=VALUE...` with the
//! settings of `fleetmend simulate --set`. Two builds' logs of the same settings diff to show
//! whether a change moved any decision.

use std::process::ExitCode;

use fleetmend_sim::config::SimConfig;
use fleetmend_sim::run::simulate_recorded;

fn main() -> ExitCode {
    let mut overrides = Vec::new();
    let mut file = None;
    for arg in std::env::args().skip(1) {
        if let Some(path) = arg.strip_prefix("--config=") {
            file = Some(std::path::PathBuf::from(path));
            continue;
        }
        let Some((key, value)) = arg.split_once('=') else {
            eprintln!("event_log: {arg:?} is not KEY=VALUE");
            return ExitCode::from(2);
        };
        overrides.push((key.to_owned(), value.to_owned()));
    }
    let config = match SimConfig::load(file.as_deref(), &overrides) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("event_log: {err}");
            return ExitCode::from(2);
        }
    };
    let started = std::time::Instant::now();
    let (report, events) = match simulate_recorded(&config, None) {
        Ok(run) => run,
        Err(err) => {
            eprintln!("event_log: {err}");
            return ExitCode::from(1);
        }
    };
    for event in &events {
        let action = event.action.map(|a| a.to_string()).unwrap_or_default();
        println!(
            "{} {:?} {} {} {}",
            event.at_ms,
            event.kind,
            event.node.as_deref().unwrap_or("-"),
            action,
            event.reason
        );
    }
    eprintln!(
        "ETTR {:.4}, {} sim events, {} audit events, {:.2} s wall",
        report.ettr,
        report.sim_events,
        events.len(),
        started.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}
