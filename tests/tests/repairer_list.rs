//! The client verbs given several repairers: a dead one first in the list is passed over for a
//! real repairer that answers; when none answers, the error names every repairer tried; a list
//! naming one repairer twice is refused before anything is sent.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::Duration;

use fleetmend_tests::{fleetmend_bin, free_port, run_with_timeout};

const ADMIN: &str = "admin-secret";

fn cli(repairers: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let output = run_with_timeout(
        Command::new(fleetmend_bin())
            .args(args)
            .env("FLEETMEND_REPAIRER", repairers)
            .env("FLEETMEND_TOKEN", ADMIN)
            .env("USER", "alice"),
        Duration::from_secs(20),
    );
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_dead_repairer_first_in_the_list_is_passed_over() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, repairer) =
        fleetmend_tests::repairer_in(dir.path(), &format!("admin_token = \"{ADMIN}\"\n"));
    let dead = format!("http://127.0.0.1:{}", free_port());
    let list = format!("{dead},http://{addr}/");
    // The repairer may still be starting: the first answer within the deadline counts.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (code, out, err) = loop {
        let answer = cli(&list, &["nodes", "--output", "json"]);
        if answer.0 == Some(0) || std::time::Instant::now() >= deadline {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(code, Some(0), "{err}\n{}", repairer.stderr());
    let nodes: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(nodes.is_array(), "{out}");
    let (code, out, err) = cli(&list, &["breaker", "--output", "json"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(serde_json::from_str::<serde_json::Value>(&out).is_ok(), "{out}");
}

#[test]
fn when_no_repairer_answers_the_error_names_each() {
    let first = format!("http://127.0.0.1:{}", free_port());
    let second = format!("http://127.0.0.1:{}", free_port());
    let (code, out, err) = cli(&format!("{first},{second}"), &["nodes"]);
    assert_ne!(code, Some(0));
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("no repairer served it"), "{err}");
    assert!(err.contains(&format!("{first}/v1/nodes")), "{err}");
    assert!(err.contains(&format!("{second}/v1/nodes")), "{err}");

    let (code, _, err) = cli(&format!("{first},{first}/"), &["nodes"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("same repairer as entry 0"), "{err}");
}
