#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fleetmend_repairer::fuzzing::check_sns(data));
