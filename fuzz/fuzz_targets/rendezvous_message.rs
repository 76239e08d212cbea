#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fleetmend_runtime::fuzzing::check_rendezvous_message(data));
