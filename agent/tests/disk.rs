//! The disk check against fixture mount tables, temp-dir root filesystems, a FIFO that blocks the
//! probe for real, and real tmpfs mounts (those tests need root, as in CI).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use fleetmend_agent::checks::disk::{DiskCheck, DiskConfig, MountConfig, findings};
use fleetmend_agent::checks::{Check, Mode, Observation, RunContext};
use fleetmend_agent::config::HostPaths;
use fleetmend_proto::{RecommendedAction, Status};
use support::{assert_finding, build_context, eventually, find, fixture, run, sample};

fn host_paths(procfs: PathBuf, sysfs: PathBuf, rootfs: &Path) -> HostPaths {
    HostPaths { procfs, sysfs, rootfs: rootfs.to_owned(), ..HostPaths::default() }
}

fn mount(path: &str) -> MountConfig {
    MountConfig { path: PathBuf::from(path), ..MountConfig::default() }
}

fn config(mounts: Vec<MountConfig>) -> DiskConfig {
    DiskConfig { mounts, ..DiskConfig::default() }
}

fn build(config: &DiskConfig, paths: &HostPaths) -> DiskCheck {
    DiskCheck::new(config, build_context(paths, Mode::Once))
}

/// The file the probe of this test's checks writes: node `node1`, this process.
fn probe_name() -> String {
    format!(".fleetmend-probe.node1.{}", std::process::id())
}

fn has(obs: &Observation, id: &str, subject: &str) -> bool {
    obs.findings.iter().any(|f| f.finding == id && f.subject == subject)
}

/// A tmpfs mounted for one test, unmounted when dropped (before its temp dir goes).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, options: &str) -> Tmpfs {
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(dir)
            .output()
            .expect("running mount(8)");
        assert!(
            output.status.success(),
            "this test needs root (CI runs it as root): mounting a tmpfs at {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
        Tmpfs(dir.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount").arg(&self.0).status().is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

#[test]
fn healthy_mounts_are_ok_with_a_latency_sample() {
    let root = tempfile::tempdir().unwrap();
    fs::create_dir(root.path().join("scratch")).unwrap();
    let paths = host_paths(fixture("healthy/proc"), fixture("healthy/sys"), root.path());
    // The temp dir's real free space is this machine's business, not the fixture's: thresholds
    // off here (the tmpfs test below covers them).
    let mounts = ["/", "/scratch"]
        .map(|path| MountConfig {
            min_free_ratio: 0.0,
            warn_free_ratio: 0.0,
            min_free_inodes_ratio: 0.0,
            ..mount(path)
        })
        .to_vec();
    let mut check = build(&config(mounts), &paths);
    let obs = run(&mut check, &paths);

    for f in &obs.findings {
        assert_eq!(f.status, Status::Ok, "{f:#?}");
    }
    for subject in ["/", "/scratch"] {
        for id in [
            findings::MOUNT,
            findings::FULL,
            findings::INODES_FULL,
            findings::READONLY,
            findings::PROBE,
            findings::HUNG,
        ] {
            find(&obs, id, subject);
        }
        let latency = sample(&obs, "fleetmend_disk_probe_latency_seconds", &[("mount", subject)])
            .expect("latency sample");
        assert!(latency > 0.0 && latency < 5.0, "{latency}");
        assert_eq!(find(&obs, findings::PROBE, subject).value, Some(latency));
        assert_eq!(sample(&obs, "fleetmend_disk_readonly", &[("mount", subject)]), Some(0.0));
        assert!(sample(&obs, "fleetmend_disk_size_bytes", &[("mount", subject)]).unwrap() > 0.0);
        let ratio = sample(&obs, "fleetmend_disk_free_ratio", &[("mount", subject)]).unwrap();
        assert!((0.0..=1.0).contains(&ratio), "{ratio}");
    }
    assert!(!root.path().join(probe_name()).exists(), "probe file left behind");
    assert!(!root.path().join("scratch").join(probe_name()).exists(), "probe file left behind");
    // sda counts errors; loop0 is virtual and nvme0n1, md0 have no counter: skipped.
    find(&obs, findings::IO_ERRORS, "sda");
    assert_eq!(sample(&obs, "fleetmend_disk_io_errors_total", &[("device", "sda")]), Some(0.0));
    for device in ["loop0", "nvme0n1", "md0"] {
        assert!(!has(&obs, findings::IO_ERRORS, device), "{device}");
    }
    assert_eq!(check.probe_threads_started(), 2);
    assert_eq!(check.probes_stuck(), 0);
}

#[test]
fn read_only_remount_fails_with_reboot() {
    let root = tempfile::tempdir().unwrap();
    fs::create_dir(root.path().join("scratch")).unwrap();
    let paths = host_paths(fixture("disk_readonly/proc"), fixture("healthy/sys"), root.path());
    let mut check = build(&config(vec![mount("/"), mount("/scratch")]), &paths);
    let obs = run(&mut check, &paths);

    let readonly = find(&obs, findings::READONLY, "/scratch");
    assert_finding(readonly, Status::Fail, RecommendedAction::Reboot);
    assert!(readonly.message.contains("/dev/md0"), "{}", readonly.message);
    assert_eq!(sample(&obs, "fleetmend_disk_readonly", &[("mount", "/scratch")]), Some(1.0));
    assert_finding(find(&obs, findings::READONLY, "/"), Status::Ok, RecommendedAction::None);
    // A read-only mount is not write-probed (it would only fail again with EROFS).
    assert_eq!(find(&obs, findings::PROBE, "/scratch").status, Status::Unknown);
    assert!(!root.path().join("scratch").join(probe_name()).exists());
    assert_eq!(find(&obs, findings::PROBE, "/").status, Status::Ok);
}

#[test]
fn hung_mount_fails_on_time_without_piling_up_threads_and_recovers() {
    let root = tempfile::tempdir().unwrap();
    let shared = root.path().join("shared");
    fs::create_dir(&shared).unwrap();
    // open(O_WRONLY) of a FIFO blocks until a reader comes: a probe stuck in the kernel for real.
    let fifo = shared.join(probe_name());
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let paths = host_paths(fixture("disk_hung/proc"), fixture("healthy/sys"), root.path());
    let probe_timeout = Duration::from_millis(300);
    let config = DiskConfig {
        probe_timeout,
        mounts: vec![mount("/shared"), mount("/")],
        ..DiskConfig::default()
    };
    let mut check = build(&config, &paths);

    let started = Instant::now();
    let obs = run(&mut check, &paths);
    let took = started.elapsed();
    assert!(took >= probe_timeout && took < Duration::from_secs(2), "first run took {took:?}");
    let hung = find(&obs, findings::HUNG, "/shared");
    assert_finding(hung, Status::Fail, RecommendedAction::Reboot);
    assert!(hung.message.contains("hung"), "{}", hung.message);
    // The other mount is not held up by the hung one.
    assert_finding(find(&obs, findings::HUNG, "/"), Status::Ok, RecommendedAction::None);
    assert_eq!(find(&obs, findings::PROBE, "/").status, Status::Ok);
    assert_eq!(check.probe_threads_started(), 2);
    assert_eq!(check.probes_stuck(), 1);

    // Still stuck: reported hung again, and no second thread for it.
    let started = Instant::now();
    let obs = run(&mut check, &paths);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "second run took {took:?}");
    assert_finding(find(&obs, findings::HUNG, "/shared"), Status::Fail, RecommendedAction::Reboot);
    assert!(find(&obs, findings::HUNG, "/shared").value.unwrap() >= 0.3);
    assert_eq!(check.probe_threads_started(), 3, "only / was probed again");
    assert_eq!(check.probes_stuck(), 1);

    // Release the stuck open() with a reader and take the FIFO away: the thread returns (its
    // fsync on a pipe fails) and the mount is probed normally again.
    let reader = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .expect("opening the FIFO for reading");
    // The released probe may remove it first (a failed probe cleans up after itself).
    if let Err(err) = fs::remove_file(&fifo) {
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{err}");
    }
    let recovered = eventually(Duration::from_secs(10), || {
        let obs = run(&mut check, &paths);
        find(&obs, findings::HUNG, "/shared").status == Status::Ok
            && find(&obs, findings::PROBE, "/shared").status == Status::Ok
    });
    assert!(recovered, "/shared did not recover: {:#?}", run(&mut check, &paths).findings);
    drop(reader);
    assert_eq!(check.probes_stuck(), 0);
    assert!(check.probe_threads_started() >= 5);
    assert!(!fifo.exists());
}

#[test]
fn full_tmpfs_fails_with_drain_and_the_free_ratio() {
    let root = tempfile::tempdir().unwrap();
    let scratch = root.path().join("scratch");
    fs::create_dir(&scratch).unwrap();
    let _tmpfs = Tmpfs::mount(&scratch, "size=1m");
    let mut filler = fs::File::create(scratch.join("filler")).unwrap();
    let chunk = vec![0xa5u8; 64 * 1024];
    loop {
        match filler.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(err) if err.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(err) => panic!("filling the tmpfs: {err}"),
        }
    }
    drop(filler);
    let paths = host_paths(fixture("disk_full/proc"), fixture("healthy/sys"), root.path());
    let mut check = build(&config(vec![mount("/scratch")]), &paths);
    let obs = run(&mut check, &paths);

    let full = find(&obs, findings::FULL, "/scratch");
    assert_finding(full, Status::Fail, RecommendedAction::Drain);
    let ratio = sample(&obs, "fleetmend_disk_free_ratio", &[("mount", "/scratch")]).unwrap();
    assert_eq!(full.value, Some(ratio));
    assert!(ratio < 0.05, "{ratio}");
    let size = sample(&obs, "fleetmend_disk_size_bytes", &[("mount", "/scratch")]).unwrap();
    assert_eq!(size, 1024.0 * 1024.0);
    // The probe cannot write either, and says why; a reboot would not help.
    let probe = find(&obs, findings::PROBE, "/scratch");
    assert_finding(probe, Status::Fail, RecommendedAction::Drain);
    assert!(probe.message.contains("ENOSPC"), "{}", probe.message);
    assert!(!scratch.join(probe_name()).exists(), "failed probe left its file");

    // Space freed: the condition clears.
    fs::remove_file(scratch.join("filler")).unwrap();
    let obs = run(&mut check, &paths);
    assert_finding(find(&obs, findings::FULL, "/scratch"), Status::Ok, RecommendedAction::None);
    assert_eq!(find(&obs, findings::PROBE, "/scratch").status, Status::Ok);
}

#[test]
fn eio_kind_is_kept_and_a_read_only_view_of_a_rw_mount_is_not_a_disk_fault() {
    let root = tempfile::tempdir().unwrap();
    let scratch = root.path().join("scratch");
    fs::create_dir(&scratch).unwrap();
    let _tmpfs = Tmpfs::mount(&scratch, "ro,size=1m");
    // The host's table says rw (as for a container given the root filesystem read-only).
    let procfs = tempfile::tempdir().unwrap();
    fs::write(procfs.path().join("mounts"), "tmpfs /scratch tmpfs rw,size=1024k 0 0\n").unwrap();
    let paths = host_paths(procfs.path().to_owned(), fixture("healthy/sys"), root.path());
    let mut check = build(&config(vec![mount("/scratch")]), &paths);
    let obs = run(&mut check, &paths);

    let probe = find(&obs, findings::PROBE, "/scratch");
    assert_finding(probe, Status::Unknown, RecommendedAction::None);
    assert!(probe.message.contains("EROFS"), "{}", probe.message);
    assert_eq!(find(&obs, findings::READONLY, "/scratch").status, Status::Ok);
}

#[test]
fn absent_mount_is_unknown_not_failed() {
    let root = tempfile::tempdir().unwrap();
    let paths = host_paths(fixture("healthy/proc"), fixture("healthy/sys"), root.path());
    let mut check = build(&config(vec![mount("/nope")]), &paths);
    let obs = run(&mut check, &paths);

    let absent = find(&obs, findings::MOUNT, "/nope");
    assert_finding(absent, Status::Unknown, RecommendedAction::None);
    assert!(absent.message.contains("mount absent"), "{}", absent.message);
    assert!(obs.findings.iter().all(|f| f.status != Status::Fail), "{:#?}", obs.findings);
    assert!(!root.path().join("nope").exists());
}

#[test]
fn unreadable_mount_table_is_unknown() {
    let root = tempfile::tempdir().unwrap();
    let procfs = tempfile::tempdir().unwrap();
    let paths = host_paths(procfs.path().to_owned(), fixture("healthy/sys"), root.path());
    let mut check = build(&config(vec![mount("/")]), &paths);
    let obs = run(&mut check, &paths);
    let readonly = find(&obs, findings::READONLY, "/");
    assert_eq!(readonly.status, Status::Unknown);
    assert!(readonly.message.contains("mounts"), "{}", readonly.message);
}

#[test]
fn rising_io_error_counter_warns_once() {
    let sysfs = tempfile::tempdir().unwrap();
    let block = sysfs.path().join("block");
    for device in ["sda", "loop0", "zram0", "dm-0"] {
        fs::create_dir_all(block.join(device).join("device")).unwrap();
        fs::write(block.join(device).join("device/ioerr_cnt"), "0x1\n").unwrap();
    }
    fs::create_dir_all(block.join("nvme0n1")).unwrap();
    let root = tempfile::tempdir().unwrap();
    let paths = host_paths(fixture("healthy/proc"), sysfs.path().to_owned(), root.path());
    let mut check = build(&config(Vec::new()), &paths);

    let obs = run(&mut check, &paths);
    assert_finding(find(&obs, findings::IO_ERRORS, "sda"), Status::Ok, RecommendedAction::None);
    for device in ["loop0", "zram0", "dm-0", "nvme0n1"] {
        assert!(!has(&obs, findings::IO_ERRORS, device), "{device}");
    }

    fs::write(block.join("sda/device/ioerr_cnt"), "0x1c\n").unwrap();
    let obs = run(&mut check, &paths);
    let rise = find(&obs, findings::IO_ERRORS, "sda");
    assert_finding(rise, Status::Warn, RecommendedAction::None);
    assert_eq!(rise.value, Some(27.0));
    assert_eq!(sample(&obs, "fleetmend_disk_io_errors_total", &[("device", "sda")]), Some(28.0));

    let obs = run(&mut check, &paths);
    assert_eq!(find(&obs, findings::IO_ERRORS, "sda").status, Status::Ok);

    fs::write(block.join("sda/device/ioerr_cnt"), "zz\n").unwrap();
    let obs = run(&mut check, &paths);
    let garbage = find(&obs, findings::IO_ERRORS, "sda");
    assert_eq!(garbage.status, Status::Unknown);
    assert!(garbage.message.contains("ioerr_cnt"), "{}", garbage.message);

    // A device named in the config must have a counter.
    let config = DiskConfig { devices: vec!["nvme0n1".to_owned()], ..config(Vec::new()) };
    let mut check = build(&config, &paths);
    let obs = run(&mut check, &paths);
    let missing = find(&obs, findings::IO_ERRORS, "nvme0n1");
    assert_eq!(missing.status, Status::Unknown);
    assert!(missing.message.contains("ENOENT"), "{}", missing.message);
    assert!(!has(&obs, findings::IO_ERRORS, "sda"));
}

#[test]
fn run_never_waits_past_its_deadline() {
    let root = tempfile::tempdir().unwrap();
    let fifo = root.path().join(probe_name());
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let paths = host_paths(fixture("healthy/proc"), fixture("healthy/sys"), root.path());
    // probe_timeout 5 s, but the runner gives this run 400 ms.
    let mut check = build(&config(vec![mount("/")]), &paths);
    let started = Instant::now();
    let ctx = RunContext {
        paths: &paths,
        now: SystemTime::now(),
        deadline: started + Duration::from_millis(400),
    };
    let obs = check.run(&ctx);
    assert!(started.elapsed() < Duration::from_millis(400), "{:?}", started.elapsed());
    assert_finding(find(&obs, findings::HUNG, "/"), Status::Fail, RecommendedAction::Reboot);
    // Let the stuck thread go.
    let _reader = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .expect("opening the FIFO for reading");
}
