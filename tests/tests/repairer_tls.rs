//! TLS on the repairer's listener with the real binaries and certificates made here with
//! openssl: an agent and the CLI that trust the repairer's CA are heard; a wrong CA is refused
//! with an error that names the certificate; plain HTTP to the TLS port gets a 400 saying to use
//! https; a new certificate is served after SIGHUP without a restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use fleetmend_tests::{
    Running, fixture, fixture_flags, fleetmend_bin, free_port, http_get, poll_until,
    run_with_timeout, start_agent,
};

const AGENT_TOKEN: &str = "agent-secret";
const ADMIN_TOKEN: &str = "admin-secret";

fn openssl(dir: &Path, args: &[&str]) {
    let output = run_with_timeout(
        Command::new("openssl").args(args).current_dir(dir),
        Duration::from_secs(30),
    );
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A CA named `name` (`name.pem`, `name.key`) and a server certificate it signs for 127.0.0.1
/// and localhost (`name-server.pem`, `name-server.key`).
fn ca_and_server(dir: &Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let (ca, ca_key) = (format!("{name}.pem"), format!("{name}.key"));
    let (cert, key, csr) =
        (format!("{name}-server.pem"), format!("{name}-server.key"), format!("{name}.csr"));
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &ca_key,
            "-out",
            &ca,
            "-days",
            "2",
            "-subj",
            &format!("/CN={name} test CA"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            "/CN=repairer",
        ],
    );
    let extensions = dir.join(format!("{name}.ext"));
    std::fs::write(
        &extensions,
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &cert,
            "-days",
            "2",
            "-extfile",
            extensions.to_str().unwrap(),
        ],
    );
    (dir.join(ca), dir.join(cert), dir.join(key))
}

/// `fleetmend nodes` against `url` trusting `ca`.
fn cli_nodes(url: &str, ca: &Path, token_file: &Path) -> Output {
    run_with_timeout(
        Command::new(fleetmend_bin())
            .args(["nodes", "--output", "json", "--repairer", url, "--ca-file"])
            .arg(ca)
            .arg("--token-file")
            .arg(token_file),
        Duration::from_secs(30),
    )
}

fn node_names(output: &Output) -> Vec<String> {
    let nodes: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
    nodes
        .as_array()
        .map(|n| n.iter().filter_map(|n| n["name"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

fn agent(dir: &Path, url: &str, node: &str, ca: &Path) -> Running {
    let case = fixture("healthy");
    let config = dir.join(format!("agent-{node}.toml"));
    std::fs::write(
        &config,
        format!(
            "{}\n[report]\nrepairer = \"{url}\"\ntoken = \"{AGENT_TOKEN}\"\nca_file = \"{}\"\n\
             interval = \"200ms\"\nbackoff_initial = \"100ms\"\nbackoff_max = \"500ms\"\n\
             [commands]\nreboot = []\n",
            std::fs::read_to_string(case.join("agent.toml")).unwrap(),
            ca.display()
        ),
    )
    .unwrap();
    let mut flags = fixture_flags(&case);
    flags.push(format!("--config={}", config.display()));
    flags.push(format!("--node={node}"));
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    start_agent(dir, SocketAddr::from(([127, 0, 0, 1], free_port())), &args)
}

fn hangup(process: &Running) {
    let status = run_with_timeout(
        Command::new("kill").args(["-HUP", &process.child.id().to_string()]),
        Duration::from_secs(10),
    );
    assert!(status.status.success());
}

#[test]
fn agents_and_the_cli_speak_tls_to_the_repairer_and_a_wrong_ca_or_plain_http_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = ca_and_server(dir.path(), "good");
    let (wrong_ca, other_cert, other_key) = ca_and_server(dir.path(), "other");
    let served_cert = dir.path().join("served.pem");
    let served_key = dir.path().join("served.key");
    std::fs::copy(&cert, &served_cert).unwrap();
    std::fs::copy(&key, &served_key).unwrap();

    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let config = dir.path().join("repairer.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"{listen}\"\nstore = \"{}\"\nagent_token = \"{AGENT_TOKEN}\"\n\
             admin_token = \"{ADMIN_TOKEN}\"\n[tls]\ncert = \"{}\"\nkey = \"{}\"\n",
            dir.path().join("repairer.db").display(),
            served_cert.display(),
            served_key.display()
        ),
    )
    .unwrap();
    let stderr_path = dir.path().join("repairer.stderr");
    let child = Command::new(fleetmend_bin())
        .args(["repairer", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let repairer = Running { child, stderr_path };

    // Plain HTTP to the TLS port: a 400 that says why, once the listener is up.
    let mut plain = None;
    let answered = poll_until(Duration::from_secs(20), || {
        plain = http_get(listen, "/healthz");
        plain.is_some()
    });
    assert!(answered, "no answer on {listen}:\n{}", repairer.stderr());
    let (status, body) = plain.unwrap();
    assert_eq!((status, body.contains("speaks TLS")), (400, true), "{body}");
    assert!(
        repairer.stderr().contains("scheme=\"https\"")
            || repairer.stderr().contains("scheme=https"),
        "{}",
        repairer.stderr()
    );

    let url = format!("https://127.0.0.1:{}", listen.port());
    let admin_file = dir.path().join("admin.token");
    std::fs::write(&admin_file, ADMIN_TOKEN).unwrap();

    // An agent that trusts the CA is heard over TLS.
    let _trusting = agent(dir.path(), &url, "tls-node-1", &ca);
    assert!(
        poll_until(Duration::from_secs(20), || {
            node_names(&cli_nodes(&url, &ca, &admin_file)) == ["tls-node-1"]
        }),
        "{}",
        repairer.stderr()
    );

    // One that trusts another CA never is, and says it is the certificate.
    let mut mistrusting = agent(dir.path(), &url, "tls-node-2", &wrong_ca);
    assert!(
        poll_until(Duration::from_secs(20), || {
            let log = mistrusting.stderr();
            log.contains("UnknownIssuer") || log.contains("certificate")
        }),
        "the agent does not say why:\n{}",
        mistrusting.stderr()
    );
    assert_eq!(node_names(&cli_nodes(&url, &ca, &admin_file)), ["tls-node-1"]);
    // Stopped before the certificate below changes to the one its CA signed.
    mistrusting.terminate(Duration::from_secs(10));

    // The CLI with the wrong CA fails, naming the certificate.
    let refused = cli_nodes(&url, &wrong_ca, &admin_file);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_ne!(refused.status.code(), Some(0));
    assert!(stderr.contains("certificate") || stderr.contains("UnknownIssuer"), "{stderr}");

    // A new certificate (the other CA's) is served after SIGHUP, without a restart.
    std::fs::copy(&other_cert, &served_cert).unwrap();
    std::fs::copy(&other_key, &served_key).unwrap();
    hangup(&repairer);
    assert!(
        poll_until(Duration::from_secs(20), || {
            node_names(&cli_nodes(&url, &wrong_ca, &admin_file)) == ["tls-node-1"]
        }),
        "the new certificate is not served:\n{}",
        repairer.stderr()
    );
    assert!(repairer.stderr().contains("TLS certificate read again"), "{}", repairer.stderr());
    let old = cli_nodes(&url, &ca, &admin_file);
    assert_ne!(old.status.code(), Some(0), "the old CA no longer verifies it");

    // A key that does not match is not served: the pair before stays.
    std::fs::copy(&key, &served_key).unwrap();
    hangup(&repairer);
    assert!(
        poll_until(Duration::from_secs(20), || repairer.stderr().contains("not read again")),
        "{}",
        repairer.stderr()
    );
    assert_eq!(node_names(&cli_nodes(&url, &wrong_ca, &admin_file)), ["tls-node-1"]);
}

#[test]
fn a_non_loopback_listener_without_tls_is_refused_unless_insecure() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("repairer.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"0.0.0.0:{}\"\nstore = \"{}\"\nagent_token = \"a\"\nadmin_token = \"b\"\n",
            free_port(),
            dir.path().join("repairer.db").display()
        ),
    )
    .unwrap();
    let output = run_with_timeout(
        Command::new(fleetmend_bin()).args(["repairer", "--check-config"]).arg(&config),
        Duration::from_secs(20),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("needs TLS") && stderr.contains("--insecure"), "{stderr}");
}
