#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fleetmend_local::fuzzing::check_scenario(data));
