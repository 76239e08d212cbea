#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fleetmend_agent::fuzzing::check_agent_config(data));
