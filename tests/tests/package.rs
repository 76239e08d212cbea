//! The Debian package: `scripts/package` over the binaries this test runs with, unpacked with
//! `dpkg -x` into a fresh root. Every file is where it belongs, the unpacked binaries run and
//! accept the unpacked configs, `lintian` reports no error and `systemd-analyze verify` accepts
//! both units against the unpacked root (so their ExecStart binaries are the package's).
//!
//! Needs Debian's `dpkg`, `lintian` and `systemd` (scripts/test installs what is missing); a
//! missing tool is a failure, not a skip. Root is not needed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use fleetmend_tests::{fleetmend_bin, run_with_timeout, workspace_root};

// Within nextest's 120 s for a test (.config/nextest.toml). Packaging strips and compresses ~60 MB
// of debug binaries (~10 s on 2 cores), lintian takes as long.
const PACKAGE_LIMIT: Duration = Duration::from_secs(90);
const LINTIAN_LIMIT: Duration = Duration::from_secs(90);
const TOOL_LIMIT: Duration = Duration::from_secs(30);

const UNITS: [&str; 2] = ["fleetmend-agent.service", "fleetmend-repairer.service"];

/// The directories the package may put files in; anything else is a stray file.
const PACKAGE_DIRS: [&str; 5] = [
    "etc/fleetmend/",
    "lib/systemd/system/",
    "usr/bin/",
    "usr/share/doc/fleetmend/",
    "usr/share/lintian/overrides/",
];

fn text(output: &Output) -> String {
    format!(
        "exit: {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `program` from PATH, or a failure naming who installs it.
fn tool(program: &str) -> Command {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()));
    assert!(found, "{program} is not installed (scripts/test installs it)");
    Command::new(program)
}

fn succeed(command: &mut Command, limit: Duration) -> Output {
    let output = run_with_timeout(command, limit);
    assert!(output.status.success(), "{command:?} failed:\n{}", text(&output));
    output
}

/// Runs scripts/package over the directory of the binary under test; returns the .deb it names on
/// its last line.
fn build_package(out: &Path) -> PathBuf {
    let bin_dir = fleetmend_bin().parent().unwrap().to_owned();
    // gzip: xz takes three times as long on debug binaries; Debian 12's lintian refuses zstd.
    let output = succeed(
        Command::new(workspace_root().join("scripts/package"))
            .arg("--bin-dir")
            .arg(&bin_dir)
            .arg("--out")
            .arg(out)
            .args(["--compress", "gzip"]),
        PACKAGE_LIMIT,
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let deb = PathBuf::from(stdout.lines().last().unwrap_or_default());
    assert!(
        deb.is_file() && deb.starts_with(out),
        "the last line of stdout is not the .deb under {}:\n{}",
        out.display(),
        text(&output)
    );
    deb
}

/// The package's version for the workspace's: a Cargo pre-release becomes a Debian `~` one.
fn expected_version() -> String {
    format!("{}-1", env!("CARGO_PKG_VERSION").replacen('-', "~", 1))
}

fn files_under(root: &Path) -> Vec<String> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() && !path.is_symlink() {
                dirs.push(path);
            } else {
                files.push(path.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    files.sort();
    files
}

fn assert_files_in_place(root: &Path) {
    let files = files_under(root);
    let stray: Vec<&String> =
        files.iter().filter(|f| !PACKAGE_DIRS.iter().any(|dir| f.starts_with(dir))).collect();
    assert!(stray.is_empty(), "files outside the package's directories: {stray:?}");

    let mode = |path: &str| fs::metadata(root.join(path)).map(|m| m.permissions().mode() & 0o7777);
    for bin in ["usr/bin/fleetmend", "usr/bin/fleetmend-agent"] {
        assert_eq!(mode(bin).ok(), Some(0o755), "{bin}: {files:#?}");
    }
    for unit in UNITS {
        let path = format!("lib/systemd/system/{unit}");
        assert_eq!(mode(&path).ok(), Some(0o644), "{path}: {files:#?}");
        let shipped = fs::read(workspace_root().join("deploy/systemd").join(unit)).unwrap();
        assert_eq!(
            fs::read(root.join(&path)).unwrap(),
            shipped,
            "{path} differs from deploy/systemd"
        );
    }
    for config in ["agent.toml", "repairer.toml"] {
        let path = format!("etc/fleetmend/{config}");
        assert_eq!(mode(&path).ok(), Some(0o644), "{path}: {files:#?}");
        let shipped = fs::read(workspace_root().join("deploy").join(config)).unwrap();
        assert_eq!(fs::read(root.join(&path)).unwrap(), shipped, "{path} differs from deploy/");
    }
    for doc in [
        "usr/share/doc/fleetmend/copyright",
        "usr/share/doc/fleetmend/changelog.Debian.gz",
        "usr/share/doc/fleetmend/README.md.gz",
        "usr/share/doc/fleetmend/docs/detection.md.gz",
        "usr/share/doc/fleetmend/examples/slurm/healthcheck.sh",
        "usr/share/doc/fleetmend/examples/prometheus/rules/fleetmend.rules.yml",
        "usr/share/lintian/overrides/fleetmend",
    ] {
        assert!(files.iter().any(|f| f == doc), "{doc} is missing: {files:#?}");
    }
}

fn assert_control(deb: &Path, control: &Path) {
    let field = |name: &str| {
        let output = succeed(tool("dpkg-deb").arg("--field").arg(deb).arg(name), TOOL_LIMIT);
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    };
    assert_eq!(field("Package"), "fleetmend");
    assert_eq!(field("Version"), expected_version());
    let arch = succeed(tool("dpkg").arg("--print-architecture"), TOOL_LIMIT);
    assert_eq!(field("Architecture"), String::from_utf8_lossy(&arch.stdout).trim());
    let depends = field("Depends");
    for package in ["adduser", "libc6", "libgcc-s1"] {
        assert!(depends.split(", ").any(|d| d.starts_with(package)), "Depends: {depends}");
    }

    succeed(tool("dpkg-deb").arg("--control").arg(deb).arg(control), TOOL_LIMIT);
    let conffiles = fs::read_to_string(control.join("conffiles")).unwrap();
    assert_eq!(
        conffiles.lines().collect::<Vec<_>>(),
        ["/etc/fleetmend/agent.toml", "/etc/fleetmend/repairer.toml"]
    );
    for script in ["postinst", "prerm", "postrm"] {
        succeed(Command::new("sh").arg("-n").arg(control.join(script)), TOOL_LIMIT);
    }
}

fn assert_binaries_run(root: &Path) {
    let fleetmend = root.join("usr/bin/fleetmend");
    let agent = root.join("usr/bin/fleetmend-agent");
    let version = succeed(Command::new(&fleetmend).arg("--version"), TOOL_LIMIT);
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("fleetmend {}", env!("CARGO_PKG_VERSION"))
    );
    let help = succeed(Command::new(&agent).arg("--help"), TOOL_LIMIT);
    assert!(String::from_utf8_lossy(&help.stdout).contains("--check-config"), "{}", text(&help));

    let agent_toml = root.join("etc/fleetmend/agent.toml");
    let repairer_toml = root.join("etc/fleetmend/repairer.toml");
    succeed(Command::new(&agent).arg("--check-config").arg(&agent_toml), TOOL_LIMIT);
    succeed(
        Command::new(&fleetmend).args(["agent", "--check-config"]).arg(&agent_toml),
        TOOL_LIMIT,
    );
    succeed(
        Command::new(&fleetmend).args(["repairer", "--check-config"]).arg(&repairer_toml),
        TOOL_LIMIT,
    );
}

/// Each unit's ExecStart names a binary and a --config file the package installs.
fn assert_units_name_packaged_files(root: &Path) {
    for unit in UNITS {
        let unit_text = fs::read_to_string(root.join("lib/systemd/system").join(unit)).unwrap();
        let exec: Vec<&str> = unit_text
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .unwrap_or_else(|| panic!("{unit} has no ExecStart"))
            .split_whitespace()
            .collect();
        let config = exec
            .windows(2)
            .find(|pair| pair[0] == "--config")
            .map(|pair| pair[1])
            .unwrap_or_else(|| panic!("{unit}'s ExecStart names no --config: {exec:?}"));
        for path in [exec[0], config] {
            assert!(
                root.join(path.trim_start_matches('/')).is_file(),
                "{unit} names {path}, which the package does not install"
            );
        }
    }
}

/// Copies the host's unit tree (targets the units depend on, sysinit.target and the rest) without
/// any fleetmend unit an installed package left there.
fn copy_units(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name.to_string_lossy().starts_with("fleetmend") {
            continue;
        }
        let (source, target) = (entry.path(), to.join(&name));
        let kind = entry.file_type().unwrap();
        if kind.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(&source).unwrap(), &target).unwrap();
        } else if kind.is_dir() {
            copy_units(&source, &target);
        } else {
            fs::copy(&source, &target).unwrap();
        }
    }
}

/// `systemd-analyze verify --root=ROOT` (systemd 252 checks ExecStart binaries under ROOT, and
/// loads every unit from ROOT too: the host's units go to ROOT/usr/local/lib/systemd/system, where
/// no package installs). Problems with the units given make it exit non-zero; any line that names
/// them, a warning included, fails as well.
fn systemd_verify(root: &Path) -> Result<(), String> {
    let host_units = ["/usr/lib/systemd/system", "/lib/systemd/system"]
        .into_iter()
        .map(Path::new)
        .find(|dir| dir.join("sysinit.target").is_file())
        .expect("the host has no systemd unit directory with sysinit.target");
    copy_units(host_units, &root.join("usr/local/lib/systemd/system"));
    let output = run_with_timeout(
        tool("systemd-analyze").arg("verify").arg(format!("--root={}", root.display())).args(UNITS),
        TOOL_LIMIT,
    );
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let about_ours =
        all.lines().any(|l| l.contains("fleetmend-agent") || l.contains("fleetmend-repairer"));
    if output.status.success() && !about_ours {
        Ok(())
    } else {
        Err(format!("systemd-analyze verify --root={}:\n{}", root.display(), text(&output)))
    }
}

/// `lintian` on the .deb: any E: line (or a run that failed) is a failure, with the whole output.
fn lintian(deb: &Path) -> Result<String, String> {
    let output = run_with_timeout(
        tool("lintian").args(["--display-info", "--pedantic"]).arg(deb),
        LINTIAN_LIMIT,
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let errors = stdout.lines().any(|l| l.starts_with("E:"));
    if output.status.success() && !errors {
        Ok(stdout.into_owned())
    } else {
        Err(format!("lintian {}:\n{}", deb.display(), text(&output)))
    }
}

#[test]
fn the_package_unpacks_into_place_and_passes_lintian_and_systemd_analyze() {
    let dir = tempfile::tempdir().unwrap();
    let deb = build_package(&dir.path().join("out"));
    std::thread::scope(|scope| {
        // lintian takes the longest: it runs beside the other checks.
        let lintian = scope.spawn(|| lintian(&deb));

        let root = dir.path().join("root");
        fs::create_dir(&root).unwrap();
        succeed(tool("dpkg").arg("-x").arg(&deb).arg(&root), TOOL_LIMIT);
        assert_files_in_place(&root);
        assert_control(&deb, &dir.path().join("control"));
        assert_binaries_run(&root);
        assert_units_name_packaged_files(&root);
        let verify = systemd_verify(&root);

        let lintian = lintian.join().unwrap();
        if let Ok(report) = &lintian {
            eprintln!("lintian: no errors\n{report}");
        }
        let problems: Vec<String> = [lintian.err(), verify.err()].into_iter().flatten().collect();
        assert!(problems.is_empty(), "{}", problems.join("\n\n"));
    });
}
