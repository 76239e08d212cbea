//! Every fuzz target on the stable toolchain, for a bounded number of cases: first each seed in
//! `fuzz/seeds/TARGET/` and each input that once failed (`fuzz/regressions/TARGET/`), then
//! proptest's inputs, mostly seeds with random edits (bytes flipped, inserted, removed, repeated,
//! and tokens of the formats spliced in), some random bytes. The targets are the same `check_*`
//! functions cargo-fuzz runs (`fuzz/fuzz_targets/`, `scripts/fuzz`); a failure here prints the
//! shrunk input, which goes into `fuzz/regressions/TARGET/` with its fix.
//!
//! Case counts keep each target to a few seconds in a debug build on 2 cores;
//! `FLEETMEND_FUZZ_CASES` multiplies them for a longer run.

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestRunner};

/// Pieces of the formats the targets read, spliced in where an edit lands.
const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    "\"",
    ":",
    ",",
    "null",
    "true",
    "-0",
    "1e999",
    "18446744073709551616",
    "-1",
    "0.1",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "\n",
    "\r\n",
    " ",
    "\t",
    "=",
    "[[",
    "]]",
    "'",
    "\"\"\"",
    "#",
    ";",
    "\\x",
    "\\x0a",
    "\\xff",
    "[  12.5] ",
    "kernel: ",
    ".",
    "+00:00",
    "Z",
    "T",
    "Dec  1 ",
    "NVRM: Xid (PCI:0000:3b:00): ",
    "79, ",
    "(GPC 0, TPC 1",
    "\u{fffd}",
    "\u{0}",
    "\u{7f}",
    "é",
    "\u{10ffff}",
    "${",
    "}",
    "1h",
    "0s",
    "200000000000000d",
    "18446744073709551615ns",
];

/// One random change to an input.
#[derive(Debug, Clone)]
enum Edit {
    Flip(Index, u8),
    Insert(Index, Vec<u8>),
    Remove(Index, usize),
    Repeat(Index, usize, usize),
    Token(Index, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<Index>(), any::<u8>()).prop_map(|(at, bit)| Edit::Flip(at, bit)),
        (any::<Index>(), prop::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(at, bytes)| Edit::Insert(at, bytes)),
        (any::<Index>(), 1usize..64).prop_map(|(at, len)| Edit::Remove(at, len)),
        (any::<Index>(), 1usize..64, 1usize..16)
            .prop_map(|(at, len, times)| Edit::Repeat(at, len, times)),
        (any::<Index>(), 0..TOKENS.len()).prop_map(|(at, token)| Edit::Token(at, token)),
    ]
}

fn apply(mut data: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for edit in edits {
        let len = data.len();
        let place = |at: &Index| if len == 0 { 0 } else { at.index(len + 1) };
        match edit {
            Edit::Flip(at, bit) if len > 0 => data[at.index(len)] ^= 1 << (bit % 8),
            Edit::Flip(..) => {}
            Edit::Insert(at, bytes) => {
                let at = place(at);
                data.splice(at..at, bytes.iter().copied());
            }
            Edit::Remove(at, n) => {
                let at = place(at).min(len);
                data.drain(at..(at + n).min(len));
            }
            Edit::Repeat(at, n, times) => {
                let at = place(at).min(len);
                let piece = data[at..(at + n).min(len)].to_vec();
                for _ in 0..*times {
                    data.splice(at..at, piece.iter().copied());
                }
            }
            Edit::Token(at, token) => {
                let at = place(at);
                data.splice(at..at, TOKENS[*token].bytes());
            }
        }
    }
    data
}

fn files_in(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<(PathBuf, Vec<u8>)> = entries
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.is_file())
        .map(|path| {
            let bytes = std::fs::read(&path)
                .unwrap_or_else(|err| panic!("reading {}: {err}", path.display()));
            (path, bytes)
        })
        .collect();
    files.sort();
    files
}

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// Runs `check` on the target's seeds and regressions, then on `cases` generated inputs.
fn run(target: &str, cases: u32, check: fn(&[u8])) {
    let seeds = files_in(&fuzz_dir().join("seeds").join(target));
    assert!(!seeds.is_empty(), "no seeds for {target} in fuzz/seeds/{target}");
    for (path, bytes) in seeds.iter().chain(&files_in(&fuzz_dir().join("regressions").join(target)))
    {
        eprintln!("{target}: {}", path.display());
        check(bytes);
    }
    let scale: u32 =
        std::env::var("FLEETMEND_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let config = Config {
        cases: cases.saturating_mul(scale),
        failure_persistence: None,
        max_shrink_iters: 4096,
        ..Config::default()
    };
    let seeds: Vec<Vec<u8>> = seeds.into_iter().map(|(_, bytes)| bytes).collect();
    let inputs = prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..512),
        6 => (prop::sample::select(seeds), prop::collection::vec(edit(), 1..6))
            .prop_map(|(seed, edits)| apply(seed, &edits)),
    ];
    let mut runner = TestRunner::new(config);
    let result = runner.run(&inputs, |data| {
        check(&data);
        Ok(())
    });
    if let Err(err) = result {
        panic!("{target}: {err}");
    }
}

#[test]
fn fuzz_report() {
    run("report", 40000, fleetmend_repairer::fuzzing::check_report);
}

#[test]
fn fuzz_alertmanager() {
    run("alertmanager", 40000, fleetmend_repairer::fuzzing::check_alertmanager);
}

#[test]
fn fuzz_sns() {
    run("sns", 40000, fleetmend_repairer::fuzzing::check_sns);
}

#[test]
fn fuzz_repairer_config() {
    run("repairer_config", 15000, fleetmend_repairer::fuzzing::check_repairer_config);
}

#[test]
fn fuzz_kernel_log() {
    run("kernel_log", 10000, fleetmend_agent::fuzzing::check_kernel_log);
}

#[test]
fn fuzz_agent_config() {
    run("agent_config", 3000, fleetmend_agent::fuzzing::check_agent_config);
}

#[test]
fn fuzz_scenario() {
    run("scenario", 30000, fleetmend_local::fuzzing::check_scenario);
}

#[test]
fn fuzz_checkpoint_manifest() {
    run("checkpoint_manifest", 3000, fleetmend_runtime::fuzzing::check_manifest);
}

#[test]
fn fuzz_collective_frames() {
    run("collective_frames", 10000, fleetmend_runtime::fuzzing::check_collective_frames);
}

#[test]
fn fuzz_rendezvous_message() {
    run("rendezvous_message", 10000, fleetmend_runtime::fuzzing::check_rendezvous_message);
}
