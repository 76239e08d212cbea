#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;

use super::*;
use crate::metrics::RepairerMetrics;
use crate::store::Store;

fn events(dir: &Path) -> Arc<EventLog> {
    let store = Arc::new(Store::open(&dir.join("r.db")).unwrap());
    Arc::new(EventLog::new(store, Arc::new(RepairerMetrics::new())))
}

fn config(text: &str) -> InventoryConfig {
    toml::from_str(text).unwrap()
}

fn sorted(inventory: &Inventory) -> Vec<String> {
    let mut names: Vec<String> = inventory.current().iter().cloned().collect();
    names.sort();
    names
}

/// A fake `scontrol` in `dir` that prints `dir/listing` (exit 0) or, when `dir/down` exists,
/// Slurm's "cannot reach the controller" (exit 1).
fn fake_scontrol(dir: &Path) -> SlurmConfig {
    let script = dir.join("scontrol");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nif [ -e {d}/down ]; then echo 'slurm_load_node error: Unable to contact slurm controller (connect failure)' >&2; exit 1; fi\ncat {d}/listing\n",
            d = dir.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    SlurmConfig { bin_dir: Some(dir.to_owned()), ..SlurmConfig::default() }
}

#[test]
fn the_config_names_every_problem_by_its_field() {
    let cases: &[(&str, &str, bool, &[&str])] = &[
        ("a list alone is enough", "nodes = [\"gpu-[001-004]\"]", false, &[]),
        ("no source", "unknown_nodes = \"admit\"", false, &["inventory.nodes"]),
        ("a bad pattern", "nodes = [\"ok\", \"gpu-[1-\"]", false, &["inventory.nodes[1]"]),
        ("slurm without the slurm scheduler", "slurm = true", false, &["inventory.slurm"]),
        ("slurm with it", "slurm = true", true, &[]),
        (
            "zero durations",
            "file = \"/x\"\nfile_recheck = \"0s\"\nslurm_refresh = \"0s\"\nslurm_timeout = \"0s\"",
            false,
            &["inventory.file_recheck", "inventory.slurm_refresh", "inventory.slurm_timeout"],
        ),
        (
            "admit with no room",
            "nodes = [\"a\"]\nunknown_nodes = \"admit\"\nmax_unknown = 0",
            false,
            &["inventory.max_unknown"],
        ),
    ];
    for (case, text, slurm_scheduler, want) in cases {
        let fields: Vec<String> =
            config(text).problems("inventory", *slurm_scheduler).into_iter().map(|p| p.0).collect();
        assert_eq!(fields, *want, "{case}");
    }
    let err = toml::from_str::<InventoryConfig>("nodez = []").unwrap_err();
    assert!(err.to_string().contains("nodez"), "{err}");
    let err = toml::from_str::<InventoryConfig>("unknown_nodes = \"ignore\"").unwrap_err();
    assert!(err.to_string().contains("ignore"), "{err}");
}

#[test]
fn an_inventory_file_is_names_and_patterns_a_line_with_comments() {
    let text =
        "# the training fleet\ngpu-[001-003]\n\n  cpu1   # a head node\nrack[1-2]-n[1-2],spare-9\n";
    let mut names: Vec<String> = parse_file(text).unwrap().into_iter().collect();
    names.sort();
    assert_eq!(
        names,
        [
            "cpu1", "gpu-001", "gpu-002", "gpu-003", "rack1-n1", "rack1-n2", "rack2-n1",
            "rack2-n2", "spare-9"
        ]
    );
    let (line, err) = parse_file("gpu-001\n\ngpu-[001-\n").unwrap_err();
    assert_eq!(line, 3);
    assert_eq!(err.position, 5, "{err}");
}

#[tokio::test]
async fn membership_follows_the_mode_and_the_union_of_the_sources() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nodes");
    std::fs::write(&file, "file-[1-2]\n").unwrap();
    let text = format!("nodes = [\"gpu-[01-02],cpu1\"]\nfile = \"{}\"", file.display());
    let inventory =
        Inventory::load(&config(&text), &SlurmConfig::default(), events(dir.path())).await.unwrap();
    assert_eq!(sorted(&inventory), ["cpu1", "file-1", "file-2", "gpu-01", "gpu-02"]);
    assert_eq!(inventory.membership("gpu-02"), Membership::Inventoried);
    assert_eq!(inventory.membership("gpu-03"), Membership::Refused);
    let admit = format!("{text}\nunknown_nodes = \"admit\"");
    let inventory = Inventory::load(&config(&admit), &SlurmConfig::default(), events(dir.path()))
        .await
        .unwrap();
    assert_eq!(inventory.membership("file-1"), Membership::Inventoried);
    assert_eq!(inventory.membership("gpu-03"), Membership::Unknown);

    let err = Inventory::load(
        &config("file = \"/nonexistent/nodes\""),
        &SlurmConfig::default(),
        events(dir.path()),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, InventoryError::ReadFile { .. }), "{err}");
}

#[tokio::test]
async fn a_changed_file_is_read_again_and_a_bad_one_keeps_the_names_before() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nodes");
    std::fs::write(&file, "n[1-2]\n").unwrap();
    let text = format!("file = \"{}\"", file.display());
    let inventory =
        Inventory::load(&config(&text), &SlurmConfig::default(), events(dir.path())).await.unwrap();
    assert!(!inventory.reread_file().unwrap(), "unchanged: not read again");
    let touch = |content: &str, seconds: u64| {
        std::fs::write(&file, content).unwrap();
        // The modification time is what says "changed": set it apart from the one read before.
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + seconds);
        std::fs::File::options().write(true).open(&file).unwrap().set_modified(at).unwrap();
    };
    touch("n[1-3]\n", 1);
    assert!(inventory.reread_file().unwrap());
    assert_eq!(sorted(&inventory), ["n1", "n2", "n3"]);
    touch("n[1-\n", 2);
    let err = inventory.reread_file().unwrap_err();
    assert!(matches!(err, InventoryError::ParseFile { line: 1, .. }), "{err}");
    assert_eq!(sorted(&inventory), ["n1", "n2", "n3"], "a bad file keeps the names before");
    assert!(!inventory.reread_file().unwrap(), "not tried again until it changes");
    touch("n1\n", 3);
    assert!(inventory.reread_file().unwrap());
    assert_eq!(sorted(&inventory), ["n1"]);
    let figures = inventory.figures();
    assert_eq!(figures.nodes, 1);
    assert_eq!(figures.refreshes, [("file", "error", 1), ("file", "ok", 2)]);
}

#[tokio::test]
async fn slurms_list_is_refreshed_and_a_failed_read_keeps_the_last_one_also_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let slurm = fake_scontrol(dir.path());
    std::fs::write(
        dir.path().join("listing"),
        "NodeName=node1 State=IDLE\nNodeName=node2 State=IDLE\n",
    )
    .unwrap();
    let slurm =
        SlurmConfig { node_names: [("gpu-b".to_owned(), "node2".to_owned())].into(), ..slurm };
    let text = "slurm = true";
    let log = events(dir.path());
    let inventory = Inventory::load(&config(text), &slurm, log.clone()).await.unwrap();
    assert_eq!(sorted(&inventory), ["gpu-b", "node1"], "Slurm's names mapped to fleetmend's");

    std::fs::write(
        dir.path().join("listing"),
        "NodeName=node1 State=IDLE\nNodeName=node3 State=IDLE\n",
    )
    .unwrap();
    assert!(inventory.refresh_slurm().await.unwrap());
    assert_eq!(sorted(&inventory), ["node1", "node3"]);
    assert!(!inventory.refresh_slurm().await.unwrap(), "the same list changes nothing");

    std::fs::write(dir.path().join("down"), "").unwrap();
    let err = inventory.refresh_slurm().await.unwrap_err();
    assert!(err.to_string().contains("Unable to contact slurm controller"), "{err}");
    assert_eq!(sorted(&inventory), ["node1", "node3"], "a failed read keeps the last list");
    assert_eq!(
        inventory.figures().refreshes,
        [("slurm", "error", 1), ("slurm", "ok", 3)],
        "reads counted by outcome"
    );

    // A restart while slurmctld is down starts from the list kept in the store.
    let restarted = Inventory::load(&config(text), &slurm, log).await.unwrap();
    assert_eq!(sorted(&restarted), ["node1", "node3"]);
    assert_eq!(restarted.figures().refreshes, [("slurm", "error", 1), ("slurm", "ok", 0)]);
    // With nothing kept, it does not start with an empty inventory.
    std::fs::create_dir(dir.path().join("fresh")).unwrap();
    let err = Inventory::load(&config(text), &slurm, events(&dir.path().join("fresh")))
        .await
        .unwrap_err();
    assert!(matches!(err, InventoryError::NoSlurmList { .. }), "{err}");
}

#[tokio::test]
async fn a_slurm_read_that_hangs_is_cut_at_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("scontrol");
    std::fs::write(&script, "#!/bin/sh\nexec sleep 30\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let slurm = SlurmConfig { bin_dir: Some(dir.path().to_owned()), ..SlurmConfig::default() };
    let started = std::time::Instant::now();
    let err = Inventory::load(
        &config("slurm = true\nslurm_timeout = \"300ms\""),
        &slurm,
        events(dir.path()),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, InventoryError::NoSlurmList { .. }), "{err}");
    assert!(err.to_string().contains("timed out") || err.to_string().contains("timeout"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
}
