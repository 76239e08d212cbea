//! Fuzz target bodies for the bytes the runtime reads from outside: checkpoint manifests, collective
//! frames and rendezvous messages. Each takes arbitrary bytes and asserts what must hold for any
//! input; `fuzz/` runs them under cargo-fuzz and `tests/tests/fuzz_targets.rs` under proptest on the
//! stable toolchain.

pub use crate::checkpoint::fuzzing::check_manifest;
pub use crate::collective::fuzzing::{check_collective_frames, check_rendezvous_message};
