//! Checkpoint write and restore throughput against `dd` on the same filesystem, in one run
//! (`scripts/bench-runtime`; a bench target so that `cargo test` never builds it).
//!
//! For each repetition, in one directory:
//!
//! - *write*: `dd if=/dev/zero of=dd.bin bs=1M count=N conv=fsync` (dd's own time, which includes
//!   its fsync) against [`CheckpointWriter`]: begin, `--files` files totalling N MiB (contents
//!   prepared in memory beforehand, as a trainer's snapshot is), commit (every file and both
//!   directories fsynced, the manifest written, the rename). Twice: the files written side by
//!   side ([`CheckpointWriter::add_files`]) and one after the other
//!   ([`CheckpointWriter::add_file`]).
//! - *restore*: `dd if=dd.bin of=/dev/null bs=1M` against [`checkpoint::newest_loaded`] (find the
//!   newest checkpoint, verify and read every file into memory in one pass), and, for comparison,
//!   the two-pass way: [`checkpoint::newest_valid`] then [`ValidCheckpoint::read_file`] of every
//!   file.
//!
//! Before every measurement the page cache is written back and dropped (`sync; echo 3 >
//! /proc/sys/vm/drop_caches`) when this process may (root); otherwise every measurement runs with
//! a warm cache, and the summary says so. The order of dd and checkpoint alternates between
//! repetitions.
//!
//! Usage: `checkpoint_io [--mib 512] [--files 2] [--reps 5] [--dir DIR] [--json FILE]`

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use fleetmend_proto::stats::median;
use fleetmend_runtime::checkpoint::{self, CheckpointWriter};
use serde_json::json;
use sha2::{Digest, Sha256};

#[derive(Debug)]
struct Args {
    mib: usize,
    files: usize,
    reps: usize,
    dir: Option<PathBuf>,
    json: Option<String>,
}

fn parse_args() -> Args {
    let mut args = Args { mib: 512, files: 2, reps: 5, dir: None, json: None };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{arg} needs a value"));
        match arg.as_str() {
            "--mib" => args.mib = value().parse().expect("--mib: a number"),
            "--files" => args.files = value().parse().expect("--files: a number"),
            "--reps" => args.reps = value().parse().expect("--reps: a number"),
            "--dir" => args.dir = Some(PathBuf::from(value())),
            "--json" => args.json = Some(value()),
            // cargo bench passes --bench to harness-less targets.
            "--bench" => {}
            other => panic!("unknown argument {other:?} (see the file's doc comment)"),
        }
    }
    assert!(args.mib >= 1 && args.files >= 1 && args.reps >= 1);
    assert!(args.mib.is_multiple_of(args.files), "--mib must be a multiple of --files");
    args
}

/// Writes dirty pages back and drops the page cache; false when not permitted.
fn drop_caches() -> bool {
    let synced = Command::new("sync").status().is_ok_and(|s| s.success());
    synced && fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

/// Runs dd and returns the seconds it reports (its own clock, fsync included with conv=fsync).
fn dd(args: &[&str]) -> f64 {
    let output = Command::new("dd").args(args).output().expect("running dd");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "dd {args:?} failed: {stderr}");
    // "536870912 bytes (537 MB, 512 MiB) copied, 1.23 s, 435 MB/s"
    stderr
        .lines()
        .rev()
        .find_map(|line| {
            let (_, after) = line.split_once("copied, ")?;
            after.split_once(" s")?.0.trim().parse().ok()
        })
        .unwrap_or_else(|| panic!("no time in dd's output: {stderr}"))
}

/// The filesystem type of the mount that holds `dir` (longest matching mount point).
fn filesystem_of(dir: &Path) -> String {
    let dir = fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (source, target, kind) = (fields.next()?, fields.next()?, fields.next()?);
            dir.starts_with(target).then(|| (target.len(), format!("{kind} on {source}")))
        })
        .max()
        .map_or_else(|| "unknown".to_string(), |(_, what)| what)
}

/// Busy and total CPU time of the whole machine from `/proc/stat` (jiffies): how much else ran.
fn machine_cpu() -> (u64, u64) {
    let stat = fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().take(8).sum();
    // idle and iowait
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

fn main() {
    let args = parse_args();
    let parent = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let work = tempfile::Builder::new().prefix("checkpoint-io-").tempdir_in(&parent).unwrap();
    let bytes = args.mib << 20;
    let per_file = bytes / args.files;
    // A trainer's snapshot: in memory before the write begins. Random, so nothing downstream can
    // shortcut it.
    let mut rng = fastrand::Rng::with_seed(0xc0ffee);
    let contents: Vec<Vec<u8>> = (0..args.files)
        .map(|_| {
            let mut data = vec![0u8; per_file];
            rng.fill(&mut data);
            data
        })
        .collect();
    let dd_file = work.path().join("dd.bin");
    let checkpoints = work.path().join("checkpoints");
    let dd_file_arg = format!("of={}", dd_file.display());
    let dd_in_arg = format!("if={}", dd_file.display());
    let count_arg = format!("count={}", args.mib);
    let cold = drop_caches();
    let filesystem = filesystem_of(work.path());
    eprintln!(
        "{} MiB in {} file(s) in {} ({filesystem}); page cache {}",
        args.mib,
        args.files,
        work.path().display(),
        if cold { "dropped before every measurement" } else { "warm (cannot drop it)" }
    );

    let cpu_before = machine_cpu();
    let mut times: [Vec<f64>; 7] = Default::default();
    let [dd_write, ckpt_write, ckpt_write_seq, dd_read, ckpt_load, ckpt_two_pass, hash_only] =
        &mut times;
    for rep in 0..args.reps {
        let step = 2 * rep as u64 + 2;
        let write_dd = || {
            drop_caches();
            dd(&["if=/dev/zero", &dd_file_arg, "bs=1M", &count_arg, "conv=fsync"])
        };
        let names: Vec<String> = (0..contents.len()).map(|i| format!("part-{i}.bin")).collect();
        // The files side by side (add_files), or one after the other (add_file); the second is
        // written as a step before the first, so the restore reads the side-by-side one.
        let write_checkpoint = |step: u64, side_by_side: bool| {
            drop_caches();
            let started = Instant::now();
            let mut writer = CheckpointWriter::begin(&checkpoints, step, 1, "bench").unwrap();
            if side_by_side {
                let files: Vec<(&str, &[u8])> = names
                    .iter()
                    .map(String::as_str)
                    .zip(contents.iter().map(Vec::as_slice))
                    .collect();
                writer.add_files(&files).unwrap();
            } else {
                for (name, data) in names.iter().zip(&contents) {
                    writer.add_file(name, data).unwrap();
                }
            }
            writer.commit().unwrap();
            started.elapsed().as_secs_f64()
        };
        let read_dd = || {
            drop_caches();
            dd(&[&dd_in_arg, "of=/dev/null", "bs=1M"])
        };
        let load_checkpoint = || {
            drop_caches();
            let started = Instant::now();
            let loaded = checkpoint::newest_loaded(&checkpoints).unwrap().unwrap();
            let secs = started.elapsed().as_secs_f64();
            assert_eq!(loaded.step(), step);
            assert_eq!(loaded.files.values().map(Vec::len).sum::<usize>(), bytes);
            secs
        };
        let two_pass = || {
            drop_caches();
            let started = Instant::now();
            let valid = checkpoint::newest_valid(&checkpoints).unwrap().unwrap();
            let names: Vec<String> = valid.file_names().map(str::to_string).collect();
            let read: usize = names.iter().map(|name| valid.read_file(name).unwrap().len()).sum();
            let secs = started.elapsed().as_secs_f64();
            assert_eq!(read, bytes);
            secs
        };
        // Alternate who goes first, so neither always meets the other's leftovers.
        if rep % 2 == 0 {
            dd_write.push(write_dd());
            ckpt_write_seq.push(write_checkpoint(step - 1, false));
            ckpt_write.push(write_checkpoint(step, true));
            dd_read.push(read_dd());
            ckpt_load.push(load_checkpoint());
            ckpt_two_pass.push(two_pass());
        } else {
            ckpt_write.push(write_checkpoint(step, true));
            ckpt_write_seq.push(write_checkpoint(step - 1, false));
            dd_write.push(write_dd());
            ckpt_two_pass.push(two_pass());
            ckpt_load.push(load_checkpoint());
            dd_read.push(read_dd());
        }
        // What the CPU alone costs: SHA-256 of the contents, in memory.
        let started = Instant::now();
        for data in &contents {
            std::hint::black_box(Sha256::digest(data));
        }
        hash_only.push(started.elapsed().as_secs_f64());
        let mbs = |secs: f64| bytes as f64 / secs / 1e6;
        eprintln!(
            "rep {}/{}: MB/s write dd {:.0} checkpoint {:.0} (one by one {:.0}) | read dd {:.0} load {:.0} two-pass {:.0} | sha256 in memory {:.0}",
            rep + 1,
            args.reps,
            mbs(dd_write[rep]),
            mbs(ckpt_write[rep]),
            mbs(ckpt_write_seq[rep]),
            mbs(dd_read[rep]),
            mbs(ckpt_load[rep]),
            mbs(ckpt_two_pass[rep]),
            mbs(hash_only[rep]),
        );
        fs::remove_file(&dd_file).unwrap();
        checkpoint::prune(&checkpoints, 1).unwrap();
    }
    fs::remove_dir_all(&checkpoints).unwrap();
    let cpu_after = machine_cpu();
    let busy = (cpu_after.0 - cpu_before.0) as f64 / (cpu_after.1 - cpu_before.1).max(1) as f64;

    let mbs =
        |series: &[f64]| bytes as f64 / median(series.iter().copied()).unwrap_or(f64::NAN) / 1e6;
    let (dd_w, ck_w, ck_ws, dd_r, ck_l, ck_2, sha) = (
        mbs(dd_write),
        mbs(ckpt_write),
        mbs(ckpt_write_seq),
        mbs(dd_read),
        mbs(ckpt_load),
        mbs(ckpt_two_pass),
        mbs(hash_only),
    );
    println!(
        "\n{} MiB in {} file(s), {filesystem}, page cache {}; medians of {} reps",
        args.mib,
        args.files,
        if cold { "dropped before each measurement" } else { "WARM" },
        args.reps
    );
    println!("| operation | dd MB/s | checkpoint MB/s | ratio |");
    println!("|---|---:|---:|---:|");
    println!(
        "| write + fsync (add_files: side by side) | {dd_w:.0} | {ck_w:.0} | {:.2} |",
        ck_w / dd_w
    );
    println!(
        "| write + fsync (add_file: one by one) | {dd_w:.0} | {ck_ws:.0} | {:.2} |",
        ck_ws / dd_w
    );
    println!("| restore (verify + read, one pass) | {dd_r:.0} | {ck_l:.0} | {:.2} |", ck_l / dd_r);
    println!(
        "| restore, two passes (verify, then read_file) | {dd_r:.0} | {ck_2:.0} | {:.2} |",
        ck_2 / dd_r
    );
    println!(
        "(SHA-256 of the same bytes in memory, one core: {sha:.0} MB/s; machine CPU busy over the \
         run: {:.0}% of {} cores)",
        busy * 100.0,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    if let Some(path) = &args.json {
        let seconds = |series: &[f64]| series.to_vec();
        let report = json!({
            "bench": "checkpoint_io",
            "mib": args.mib,
            "files": args.files,
            "reps": args.reps,
            "filesystem": filesystem,
            "cache_dropped": cold,
            "machine_cpu_busy": busy,
            "write_dd_mbs": dd_w,
            "write_checkpoint_mbs": ck_w,
            "write_ratio": ck_w / dd_w,
            "write_one_by_one_mbs": ck_ws,
            "write_one_by_one_ratio": ck_ws / dd_w,
            "read_dd_mbs": dd_r,
            "restore_load_mbs": ck_l,
            "restore_ratio": ck_l / dd_r,
            "restore_two_pass_mbs": ck_2,
            "restore_two_pass_ratio": ck_2 / dd_r,
            "sha256_in_memory_mbs": sha,
            "seconds": {
                "write_dd": seconds(dd_write),
                "write_checkpoint": seconds(ckpt_write),
                "write_checkpoint_one_by_one": seconds(ckpt_write_seq),
                "read_dd": seconds(dd_read),
                "restore_load": seconds(ckpt_load),
                "restore_two_pass": seconds(ckpt_two_pass),
                "sha256_in_memory": seconds(hash_only),
            },
        });
        fs::write(path, serde_json::to_vec_pretty(&report).unwrap()).unwrap();
    }
}
