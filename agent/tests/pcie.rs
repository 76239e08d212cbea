//! The pcie check against fixture sysfs trees (and, lightly, this machine's real /sys).
//!
//! A fixture case holds the device tree as the kernel lays it out (`sys/devices/pci0000:00/
//! 0000:00:01.0/0000:01:00.0/...`); [`Host::new`] copies it into a temporary directory and links
//! every device into `sys/bus/pci/devices`, as the kernel does, so the fixtures stay free of
//! symlinks.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use fleetmend_agent::checks::pcie::{GpuSpeed, PcieCheck, PcieConfig};
use fleetmend_agent::checks::{Mode, Observation};
use fleetmend_agent::config::{AgentConfig, HostPaths};
use fleetmend_agent::metrics;
use fleetmend_proto::{RecommendedAction, Status};
use support::{assert_finding, build_context, copy_case, find, not_ok, run, run_at, sample};

const GPU: &str = "0000:01:00.0";
const NVME: &str = "0000:02:00.0";
const IB_NIC: &str = "0000:3b:00.0";
const ETH_NIC: &str = "0000:5d:00.0";

/// A writable copy of a fixture case with `sys/bus/pci/devices` linked, and a check on it.
struct Host {
    /// Kept for its lifetime: the tree is removed when the host is dropped.
    _dir: tempfile::TempDir,
    paths: HostPaths,
    check: PcieCheck,
    now: SystemTime,
}

impl Host {
    fn new(case: &str, config: &PcieConfig) -> Host {
        let dir = copy_case(case);
        let sys = dir.path().join("sys");
        std::fs::create_dir_all(sys.join("bus/pci/devices")).unwrap();
        link_devices(&sys, &sys.join("devices"));
        let paths = HostPaths::tree(dir.path());
        let check = PcieCheck::new(config, build_context(&paths, Mode::Daemon));
        Host {
            _dir: dir,
            paths,
            check,
            now: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        }
    }

    fn run(&mut self) -> Observation {
        self.now += Duration::from_secs(30);
        run_at(&mut self.check, &self.paths, self.now)
    }

    /// The real directory of the device at `address`.
    fn device(&self, address: &str) -> PathBuf {
        let link = self.paths.sysfs.join("bus/pci/devices").join(address);
        std::fs::canonicalize(link).unwrap()
    }

    fn write(&self, address: &str, file: &str, text: &str) {
        std::fs::write(self.device(address).join(file), format!("{text}\n")).unwrap();
    }
}

/// Whether `name` is a PCI address (`0000:3b:00.0`).
fn is_pci_address(name: &str) -> bool {
    let bytes = name.as_bytes();
    bytes.len() == 12
        && bytes[4] == b':'
        && bytes[7] == b':'
        && bytes[10] == b'.'
        && name.chars().enumerate().all(|(i, c)| [4, 7, 10].contains(&i) || c.is_ascii_hexdigit())
}

/// Links every PCI device below `dir` as `sys/bus/pci/devices/<address>` ->
/// `../../../devices/...`, as sysfs does.
fn link_devices(sys: &Path, dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if !entry.file_type().unwrap().is_dir() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        if is_pci_address(&name) && entry.path().join("class").exists() {
            let relative = entry.path().strip_prefix(sys).unwrap().to_owned();
            let link = sys.join("bus/pci/devices").join(&name);
            std::os::unix::fs::symlink(Path::new("../../..").join(relative), link).unwrap();
        }
        link_devices(sys, &entry.path());
    }
}

fn pcie_findings<'a>(obs: &'a Observation, subject: &str) -> Vec<&'a str> {
    obs.findings.iter().filter(|f| f.subject == subject).map(|f| f.finding.as_str()).collect()
}

#[test]
fn a_gpu_trained_at_x8_of_x16_fails_with_reboot_after_the_debounce() {
    let mut host = Host::new("pcie_gpu_downtrained", &PcieConfig::default());
    let obs = host.run();
    let width = find(&obs, "pcie_width", GPU);
    assert_finding(width, Status::Warn, RecommendedAction::None);
    assert!(width.message.contains("x8 of x16"), "{}", width.message);
    assert!(width.message.contains("1 of 2 runs"), "{}", width.message);

    let obs = host.run();
    let width = find(&obs, "pcie_width", GPU);
    assert_finding(width, Status::Fail, RecommendedAction::Reboot);
    assert!(width.message.starts_with("PCIe link trained at x8 of x16"), "{}", width.message);
    assert_eq!(width.value, Some(8.0));
    for (key, value) in [
        ("kind", "gpu"),
        ("current_width", "8"),
        ("max_width", "16"),
        ("current_speed", "16"),
        ("max_speed", "32"),
    ] {
        assert_eq!(width.labels.get(key).map(String::as_str), Some(value), "{key}: {width:#?}");
    }
    // Gen4 of Gen5 on a GPU: reported, not judged (idle GPUs drop to Gen1).
    let speed = find(&obs, "pcie_speed", GPU);
    assert_finding(speed, Status::Ok, RecommendedAction::None);
    assert!(speed.message.contains("16 GT/s of 32 GT/s"), "{}", speed.message);
    assert_eq!(find(&obs, "pcie_unreadable", GPU).status, Status::Ok);
    assert_eq!(not_ok(&obs).len(), 1, "{:#?}", not_ok(&obs));

    // The NVMe drive (class 0x010802) and the bridges are not looked at.
    for ignored in [NVME, "0000:00:01.0", "0000:00:02.0"] {
        assert!(pcie_findings(&obs, ignored).is_empty(), "{ignored}: {:#?}", obs.findings);
    }
    let gpu = [("device", GPU), ("kind", "gpu")];
    assert_eq!(sample(&obs, metrics::PCIE_LINK_WIDTH.name, &gpu), Some(8.0));
    assert_eq!(sample(&obs, metrics::PCIE_LINK_WIDTH_MAX.name, &gpu), Some(16.0));
    assert_eq!(sample(&obs, metrics::PCIE_LINK_SPEED.name, &gpu), Some(16.0));
    assert_eq!(sample(&obs, metrics::PCIE_LINK_SPEED_MAX.name, &gpu), Some(32.0));
    assert_eq!(sample(&obs, metrics::PCIE_LINK_WIDTH.name, &[("device", NVME)]), None);
}

#[test]
fn a_link_that_retrains_clears_and_the_debounce_starts_over() {
    let mut host = Host::new("pcie_gpu_downtrained", &PcieConfig::default());
    assert_eq!(find(&host.run(), "pcie_width", GPU).status, Status::Warn);
    host.write(GPU, "current_link_width", "16");
    let width = find(&host.run(), "pcie_width", GPU).clone();
    assert_finding(&width, Status::Ok, RecommendedAction::None);
    assert_eq!(width.message, "PCIe link x16 of x16");
    host.write(GPU, "current_link_width", "8");
    assert_eq!(find(&host.run(), "pcie_width", GPU).status, Status::Warn);
    assert_eq!(find(&host.run(), "pcie_width", GPU).status, Status::Fail);
}

#[test]
fn gpu_speed_judge_warns_without_an_action() {
    let config = PcieConfig { gpu_speed: GpuSpeed::Judge, debounce: 1, ..PcieConfig::default() };
    let mut host = Host::new("pcie_gpu_downtrained", &config);
    let obs = host.run();
    assert_finding(find(&obs, "pcie_width", GPU), Status::Fail, RecommendedAction::Reboot);
    let speed = find(&obs, "pcie_speed", GPU);
    assert_finding(speed, Status::Warn, RecommendedAction::None);
    assert!(speed.message.contains("16 GT/s of 32 GT/s"), "{}", speed.message);
    // Still a warning on later runs: a GPU's speed never fails.
    assert_eq!(find(&host.run(), "pcie_speed", GPU).status, Status::Warn);
}

#[test]
fn a_nic_at_gen3_of_gen5_fails_speed_with_reboot() {
    let mut host = Host::new("pcie_nic_gen3", &PcieConfig::default());
    let obs = host.run();
    assert_finding(find(&obs, "pcie_speed", IB_NIC), Status::Warn, RecommendedAction::None);
    let obs = host.run();
    let speed = find(&obs, "pcie_speed", IB_NIC);
    assert_finding(speed, Status::Fail, RecommendedAction::Reboot);
    assert!(speed.message.contains("8 GT/s of 32 GT/s"), "{}", speed.message);
    assert_eq!(speed.value, Some(8.0));
    for (key, value) in [
        ("kind", "nic"),
        ("current_speed", "8"),
        ("max_speed", "32"),
        ("netdev", "ib0"),
        ("ib_device", "mlx5_0"),
    ] {
        assert_eq!(speed.labels.get(key).map(String::as_str), Some(value), "{key}: {speed:#?}");
    }
    assert_eq!(find(&obs, "pcie_width", IB_NIC).status, Status::Ok);
    assert_eq!(not_ok(&obs).len(), 1, "{:#?}", not_ok(&obs));
    let nic = [("device", IB_NIC), ("kind", "nic")];
    assert_eq!(sample(&obs, metrics::PCIE_LINK_SPEED.name, &nic), Some(8.0));
}

#[test]
fn a_virtual_function_is_not_looked_at() {
    let mut host = Host::new("pcie_nic_gen3", &PcieConfig::default());
    // A VF of the NIC: no link of its own (the kernel shows zeros and Unknown).
    let pf = host.device(IB_NIC);
    let vf = pf.parent().unwrap().join("0000:3b:00.1");
    std::fs::create_dir(&vf).unwrap();
    for (file, text) in [
        ("class", "0x020700"),
        ("vendor", "0x15b3"),
        ("current_link_width", "0"),
        ("max_link_width", "0"),
        ("current_link_speed", "Unknown"),
        ("max_link_speed", "Unknown"),
    ] {
        std::fs::write(vf.join(file), text).unwrap();
    }
    std::os::unix::fs::symlink("../0000:3b:00.0", vf.join("physfn")).unwrap();
    let devices = host.paths.sysfs.join("bus/pci/devices");
    std::os::unix::fs::symlink(
        "../../../devices/pci0000:3a/0000:3a:01.0/0000:3b:00.1",
        devices.join("0000:3b:00.1"),
    )
    .unwrap();
    let obs = host.run();
    assert!(pcie_findings(&obs, "0000:3b:00.1").is_empty(), "{:#?}", obs.findings);
    assert!(!pcie_findings(&obs, IB_NIC).is_empty());
}

#[test]
fn a_nic_without_link_files_is_not_pcie_and_not_looked_at() {
    let all = PcieConfig { nic_vendors: vec!["*".into()], ..PcieConfig::default() };
    let mut host = Host::new("pcie_nic_gen3", &all);
    // A virtio NIC, as in a VM: conventional PCI, no link files at all.
    for file in ["current_link_width", "max_link_width", "current_link_speed", "max_link_speed"] {
        std::fs::remove_file(host.device(IB_NIC).join(file)).unwrap();
    }
    host.write(IB_NIC, "vendor", "0x1af4");
    host.write(IB_NIC, "class", "0x020000");
    assert!(host.run().findings.is_empty());
    // Only some of them missing is unusable.
    host.write(IB_NIC, "current_link_width", "16");
    let unreadable = find(&host.run(), "pcie_unreadable", IB_NIC).clone();
    assert_eq!(unreadable.status, Status::Unknown);
    assert!(unreadable.message.contains("max_link_width: missing"), "{}", unreadable.message);
}

#[test]
fn nic_vendors_choose_the_nics_looked_at() {
    let none = PcieConfig { nic_vendors: Vec::new(), ..PcieConfig::default() };
    let mut host = Host::new("pcie_nic_gen3", &none);
    assert!(host.run().findings.is_empty());

    let intel_only = PcieConfig { nic_vendors: vec!["0x8086".into()], ..PcieConfig::default() };
    let mut host = Host::new("pcie_nic_gen3", &intel_only);
    assert!(host.run().findings.is_empty());
    host.write(IB_NIC, "vendor", "0x8086");
    assert_eq!(find(&host.run(), "pcie_speed", IB_NIC).status, Status::Warn);

    let all = PcieConfig { nic_vendors: vec!["*".into()], ..PcieConfig::default() };
    let mut host = Host::new("pcie_nic_gen3", &all);
    host.write(IB_NIC, "vendor", "0x14e4");
    assert_eq!(find(&host.run(), "pcie_speed", IB_NIC).status, Status::Warn);
}

#[test]
fn a_x16_nic_in_a_x8_slot_is_ok() {
    let mut host = Host::new("pcie_nic_x8_slot", &PcieConfig::default());
    for _ in 0..3 {
        let obs = host.run();
        assert!(not_ok(&obs).is_empty(), "{:#?}", not_ok(&obs));
        let width = find(&obs, "pcie_width", ETH_NIC);
        assert_eq!(width.labels["max_width"], "8");
        assert_eq!(width.labels["netdev"], "ens5f0np0");
        assert!(!width.labels.contains_key("ib_device"), "{width:#?}");
        assert_eq!(
            width.message, "PCIe link x8 of x8 (the card can do x16, port 0000:5c:01.0 x8)",
            "{width:#?}"
        );
        // Gen4 card under a Gen5 port: Gen4 is its maximum.
        let speed = find(&obs, "pcie_speed", ETH_NIC);
        assert_eq!(speed.labels["max_speed"], "16");
        let nic = [("device", ETH_NIC)];
        assert_eq!(sample(&obs, metrics::PCIE_LINK_WIDTH_MAX.name, &nic), Some(8.0));
        assert_eq!(sample(&obs, metrics::PCIE_LINK_SPEED_MAX.name, &nic), Some(16.0));
    }
    // The port is the limit: a slower port lowers the maximum speed as well.
    host.write("0000:5c:01.0", "max_link_speed", "8.0 GT/s PCIe");
    host.write(ETH_NIC, "current_link_speed", "8.0 GT/s PCIe");
    let obs = host.run();
    assert!(not_ok(&obs).is_empty(), "{:#?}", not_ok(&obs));
    assert_eq!(find(&obs, "pcie_speed", ETH_NIC).labels["max_speed"], "8");
}

#[test]
fn garbage_and_missing_files_are_unknown_never_a_panic() {
    let mut host = Host::new("pcie_garbage", &PcieConfig::default());
    let gpu = "0000:04:00.0";
    let obs = host.run();
    let unreadable = find(&obs, "pcie_unreadable", gpu);
    assert_finding(unreadable, Status::Unknown, RecommendedAction::None);
    assert!(unreadable.message.contains("current_link_width"), "{}", unreadable.message);
    assert_eq!(find(&obs, "pcie_width", gpu).status, Status::Unknown);
    assert_eq!(find(&obs, "pcie_speed", gpu).status, Status::Ok, "not judged for GPUs");
    assert!(obs.findings.iter().all(|f| f.status != Status::Fail), "{:#?}", obs.findings);
    assert_eq!(sample(&obs, metrics::PCIE_LINK_WIDTH.name, &[("device", gpu)]), None);
    assert_eq!(sample(&obs, metrics::PCIE_LINK_WIDTH_MAX.name, &[("device", gpu)]), Some(16.0));

    // A missing file and a garbage port file are named too; the speed then cannot be judged.
    host.write(gpu, "current_link_width", "16");
    std::fs::remove_file(host.device(gpu).join("max_link_speed")).unwrap();
    host.write("0000:00:04.0", "max_link_width", "");
    let config = PcieConfig { gpu_speed: GpuSpeed::Judge, ..PcieConfig::default() };
    host.check = PcieCheck::new(&config, build_context(&host.paths, Mode::Daemon));
    let obs = host.run();
    let unreadable = find(&obs, "pcie_unreadable", gpu);
    assert!(unreadable.message.contains("max_link_speed: missing"), "{}", unreadable.message);
    assert!(
        unreadable.message.contains("port 0000:00:04.0: max_link_width: empty"),
        "{}",
        unreadable.message
    );
    assert_eq!(find(&obs, "pcie_width", gpu).status, Status::Unknown);
    assert_eq!(find(&obs, "pcie_speed", gpu).status, Status::Unknown);

    // A class that is not hex: the device is unknown, whatever it is.
    host.write(gpu, "class", "three-d");
    let obs = host.run();
    let unreadable = find(&obs, "pcie_unreadable", gpu);
    assert_eq!(unreadable.status, Status::Unknown);
    assert!(unreadable.message.contains("class"), "{}", unreadable.message);
}

#[test]
fn unknown_speeds_are_not_judged() {
    let mut host = Host::new("pcie_nic_gen3", &PcieConfig::default());
    host.write(IB_NIC, "current_link_speed", "Unknown");
    let obs = host.run();
    let speed = find(&obs, "pcie_speed", IB_NIC);
    assert_eq!(speed.status, Status::Unknown, "{speed:#?}");
    assert_eq!(speed.labels["current_speed"], "unknown");
    assert_eq!(find(&obs, "pcie_unreadable", IB_NIC).status, Status::Ok);
    assert_eq!(sample(&obs, metrics::PCIE_LINK_SPEED.name, &[("device", IB_NIC)]), None);
}

#[test]
fn no_pci_bus_reports_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let paths = HostPaths::tree(dir.path());
    let mut check = PcieCheck::new(&PcieConfig::default(), build_context(&paths, Mode::Once));
    assert_eq!(run(&mut check, &paths), Observation::default());
}

/// This machine's /sys: whatever is there, the check neither panics nor reports another check.
#[test]
fn real_sysfs_never_panics() {
    let paths = HostPaths::default();
    let all = PcieConfig { nic_vendors: vec!["*".into()], ..PcieConfig::default() };
    let mut check = PcieCheck::new(&all, build_context(&paths, Mode::Once));
    let obs = run(&mut check, &paths);
    assert!(obs.findings.iter().all(|f| f.check == "pcie"), "{:#?}", obs.findings);
    assert!(obs.findings.iter().all(|f| f.status != Status::Fail), "{:#?}", obs.findings);
}

#[test]
fn config_reads_from_toml_and_bad_values_name_their_fields() {
    let config = AgentConfig::parse(
        "[checks.pcie]\ninterval = \"1m\"\nnic_vendors = [\"0x15b3\", \"0x14e4\"]\n\
         gpu_speed = \"judge\"\ndebounce = 3\n",
    )
    .unwrap();
    assert!(config.validate().is_empty(), "{}", config.validate());
    let pcie = &config.checks.pcie;
    assert_eq!(pcie.interval, Duration::from_secs(60));
    assert_eq!(pcie.gpu_speed, GpuSpeed::Judge);
    assert_eq!(pcie.debounce, 3);

    let defaults = AgentConfig::parse("").unwrap().checks.pcie;
    assert!(defaults.enabled);
    assert_eq!(defaults.nic_vendors, ["0x15b3"]);
    assert_eq!(defaults.gpu_speed, GpuSpeed::Ignore);
    assert_eq!(defaults.debounce, 2);

    let err = AgentConfig::parse("[checks.pcie]\ngpu_speed = \"maybe\"\n").unwrap_err();
    assert!(err.contains("maybe"), "{err}");
    let bad = AgentConfig::parse(
        "[checks.pcie]\ntimeout = \"0s\"\nnic_vendors = [\"mellanox\"]\ndebounce = 0\n",
    )
    .unwrap();
    let problems = bad.validate();
    let fields: Vec<&str> = problems.0.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        ["checks.pcie.timeout", "checks.pcie.nic_vendors[0]", "checks.pcie.debounce"],
        "{problems}"
    );
}
