//! The `redfish` provider against a real Redfish service: sushy-tools' emulator with its fake
//! driver (power changes land 1–11 s after a reset, as on a slow BMC), Basic auth from an htpasswd
//! file, names redirecting to UUID paths. `scripts/test` installs sushy-tools into a venv;
//! `SUSHY_EMULATOR` names another program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleetmend_repairer::commands::CommandQueue;
use fleetmend_repairer::provider::redfish::{RedfishProvider, RedfishProviderConfig, Secret};
use fleetmend_repairer::provider::{
    PowerState, Provider, ProviderConfig, ProviderDeps, ProviderError, build,
};

const USER: &str = "admin";
const PASSWORD: &str = "secret";
/// `admin:secret`, bcrypt with cost 4 (the emulator checks the hash on every request: a low cost
/// keeps polling cheap).
const HTPASSWD: &str = "admin:$2b$04$aC8iGwZfSyBDXzbquggMVeybyUs/5OSiTw6N7j6231Qzhe8FFEFyK\n";

/// One fake system: (uuid, name, initial power state).
type FakeSystem = (&'static str, &'static str, &'static str);

/// Power states the emulator announced, per system name, in order.
type Notifications = Arc<Mutex<Vec<(String, String)>>>;

/// Receives the fake driver's external notifications: it PUTs a system's record on every change,
/// which shows the Off → On sequence however briefly Off lasted.
async fn start_notification_receiver() -> (String, Notifications) {
    let notifications = Notifications::default();
    let recorded = notifications.clone();
    let app = axum::Router::new().route(
        "/notify",
        axum::routing::put(move |axum::Json(system): axum::Json<serde_json::Value>| {
            let recorded = recorded.clone();
            async move {
                let field = |name: &str| system[name].as_str().unwrap_or_default().to_owned();
                recorded.lock().unwrap().push((field("name"), field("power_state")));
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/notify", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, notifications)
}

/// `SUSHY_EMULATOR`, else the venv scripts/test installs, else `sushy-emulator` on PATH.
fn emulator_program() -> String {
    if let Ok(program) = std::env::var("SUSHY_EMULATOR") {
        return program;
    }
    let venv = std::env::var_os("HOME")
        .map(|home| PathBuf::from(home).join(".cache/fleetmend-sushy-tools/bin/sushy-emulator"));
    match venv {
        Some(path) if path.is_file() => path.display().to_string(),
        _ => "sushy-emulator".to_owned(),
    }
}

/// A running sushy-emulator, killed with its process group on drop.
struct Emulator {
    child: Child,
    port: u16,
    log: PathBuf,
    dir: tempfile::TempDir,
}

impl Emulator {
    async fn start(systems: &[FakeSystem], notify_url: &str) -> Emulator {
        let program = emulator_program();
        // The port is free when asked; another process may take it before the emulator binds, so
        // a start that dies early is tried again on a new port.
        let mut last_log = String::new();
        for _attempt in 0..3 {
            let dir = tempfile::tempdir().unwrap();
            let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let state = dir.path().join("state");
            std::fs::create_dir(&state).unwrap();
            let htpasswd = dir.path().join("htpasswd");
            std::fs::write(&htpasswd, HTPASSWD).unwrap();
            let systems: Vec<String> = systems
                .iter()
                .map(|(uuid, name, power)| {
                    format!(
                        "{{'uuid': '{uuid}', 'name': '{name}', 'power_state': '{power}', \
                         'external_notifier': True}}"
                    )
                })
                .collect();
            let config = dir.path().join("emulator.conf");
            std::fs::write(
                &config,
                format!(
                    "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\n\
                     SUSHY_EMULATOR_LISTEN_PORT = {port}\n\
                     SUSHY_EMULATOR_FAKE_DRIVER = True\n\
                     SUSHY_EMULATOR_STATE_DIR = '{}'\n\
                     SUSHY_EMULATOR_AUTH_FILE = '{}'\n\
                     EXTERNAL_NOTIFICATION_URL = '{notify_url}'\n\
                     SUSHY_EMULATOR_FAKE_SYSTEMS = [{}]\n",
                    state.display(),
                    htpasswd.display(),
                    systems.join(", ")
                ),
            )
            .unwrap();
            let log = dir.path().join("emulator.log");
            let log_file = std::fs::File::create(&log).unwrap();
            let child = Command::new(&program)
                .arg("--config")
                .arg(&config)
                .env("NO_PROXY", "127.0.0.1")
                .stdin(Stdio::null())
                .stdout(log_file.try_clone().unwrap())
                .stderr(log_file)
                .process_group(0)
                .spawn()
                .unwrap_or_else(|error| {
                    panic!(
                        "starting {program:?} failed ({error}): run scripts/test, which installs \
                         sushy-tools, or set SUSHY_EMULATOR"
                    )
                });
            let mut emulator = Emulator { child, port, log, dir };
            if emulator.wait_ready().await {
                return emulator;
            }
            last_log = emulator.log();
        }
        panic!("sushy-emulator did not start; its last log:\n{last_log}");
    }

    /// Polls the service root until it answers; false when the emulator exited.
    async fn wait_ready(&mut self) -> bool {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.child.try_wait().unwrap().is_some() {
                return false;
            }
            let answered = client
                .get(self.url("/redfish/v1/"))
                .basic_auth(USER, Some(PASSWORD))
                .send()
                .await
                .is_ok_and(|response| response.status().is_success());
            if answered {
                return true;
            }
            assert!(Instant::now() < deadline, "sushy-emulator not ready in 30 s:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// The emulator's log, without the colours werkzeug may add to request lines.
    fn log(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        regex::Regex::new("\x1b\\[[0-9;]*m").unwrap().replace_all(&log, "").into_owned()
    }

    /// A provider config for this emulator: nodes are system names (they redirect to UUIDs).
    fn config(&self, password: &str) -> RedfishProviderConfig {
        let mut config = RedfishProviderConfig::new(self.url("/redfish/v1/Systems/{node}"));
        config.user = USER.to_owned();
        config.password = Some(Secret::new(password));
        config.poll_interval = Duration::from_millis(200);
        config.reboot_timeout = Duration::from_secs(40);
        config.timeout = Duration::from_secs(5);
        config
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        if let Ok(pgid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pgid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.child.wait();
    }
}

const NODE1_UUID: &str = "3c1a0f4e-1d2b-4c6e-9a7f-000000000001";
const NODE2_UUID: &str = "3c1a0f4e-1d2b-4c6e-9a7f-000000000002";

#[tokio::test]
async fn reboot_resets_the_system_and_returns_once_it_reads_on_again() {
    let (notify_url, notifications) = start_notification_receiver().await;
    let emulator =
        Emulator::start(&[(NODE1_UUID, "node1", "On"), (NODE2_UUID, "node2", "Off")], &notify_url)
            .await;
    // Through the config path the repairer uses, with the password in a file.
    let password_file = emulator.dir.path().join("bmc-password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    let config: ProviderConfig = toml::from_str(&format!(
        "kind = \"redfish\"\n\
         system_url = \"{}\"\n\
         user = \"{USER}\"\n\
         password_file = \"{}\"\n\
         poll_interval = \"200ms\"\n\
         reboot_timeout = \"40s\"\n\
         timeout = \"5s\"",
        emulator.url("/redfish/v1/Systems/{node}"),
        password_file.display()
    ))
    .unwrap();
    let provider = build(&config, &ProviderDeps::new(Arc::new(CommandQueue::new()))).unwrap();
    assert_eq!(provider.power_state("node1").await.unwrap(), PowerState::On);
    assert_eq!(provider.power_state("node2").await.unwrap(), PowerState::Off);

    // node1 is on: ForceRestart. node2 is off: it is powered on instead.
    let (node1, node2) = tokio::join!(provider.reboot("node1"), provider.reboot("node2"));
    node1.unwrap();
    node2.unwrap();

    // reboot returned only once the BMC read On.
    assert_eq!(provider.power_state("node1").await.unwrap(), PowerState::On);
    assert_eq!(provider.power_state("node2").await.unwrap(), PowerState::On);
    let log = emulator.log();
    for uuid in [NODE1_UUID, NODE2_UUID] {
        let reset = format!(
            "\"POST /redfish/v1/Systems/{uuid}/Actions/ComputerSystem.Reset HTTP/1.1\" 204"
        );
        assert_eq!(log.matches(&reset).count(), 1, "no single reset for {uuid} in:\n{log}");
    }
    // The emulator's own record: node1 went Off at the reset, then On; node2 came On.
    let seen = |name: &str| -> Vec<String> {
        notifications
            .lock()
            .unwrap()
            .iter()
            .filter(|(system, _)| system == name)
            .map(|(_, power)| power.clone())
            .collect()
    };
    for node in ["node1", "node2"] {
        let seen = seen(node);
        assert_eq!(seen.first().map(String::as_str), Some("Off"), "{node}: {seen:?}");
        assert_eq!(seen.last().map(String::as_str), Some("On"), "{node}: {seen:?}");
    }
}

#[tokio::test]
async fn a_wrong_password_is_a_clear_401_and_resets_nothing() {
    let (notify_url, notifications) = start_notification_receiver().await;
    let emulator = Emulator::start(&[(NODE1_UUID, "node1", "On")], &notify_url).await;
    let provider = RedfishProvider::new(emulator.config("not-the-password")).unwrap();

    let error = provider.reboot("node1").await.unwrap_err();
    assert!(matches!(error, ProviderError::Failed { operation: "reboot", .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("HTTP 401"), "{message}");
    assert!(message.contains("refused the credentials of user \"admin\""), "{message}");
    assert!(message.contains("Incorrect username or password"), "{message}");
    assert!(!message.contains("not-the-password"), "the password leaked: {message}");
    assert!(!emulator.log().contains("POST"), "a reset was sent:\n{}", emulator.log());
    assert!(notifications.lock().unwrap().is_empty());

    let message = provider.power_state("node1").await.unwrap_err().to_string();
    assert!(message.contains("HTTP 401"), "{message}");
}

#[tokio::test]
async fn power_state_reads_the_bmc_and_replace_is_unsupported() {
    let (notify_url, _notifications) = start_notification_receiver().await;
    let emulator = Emulator::start(&[(NODE2_UUID, "node2", "Off")], &notify_url).await;
    let provider = RedfishProvider::new(emulator.config(PASSWORD)).unwrap();

    assert_eq!(provider.power_state("node2").await.unwrap(), PowerState::Off);
    // The UUID path works as well as the name that redirects to it.
    assert_eq!(provider.power_state(NODE2_UUID).await.unwrap(), PowerState::Off);
    let system = provider.read_system("node2").await.unwrap();
    assert!(system.url.path().ends_with(NODE2_UUID), "{}", system.url);
    assert_eq!(
        system.reset_target.path(),
        format!("/redfish/v1/Systems/{NODE2_UUID}/Actions/ComputerSystem.Reset")
    );

    let message = provider.power_state("node9").await.unwrap_err().to_string();
    assert!(message.contains("404"), "{message}");
    assert!(matches!(
        provider.replace("node2").await,
        Err(ProviderError::Unsupported { provider: "redfish", operation: "replace", .. })
    ));
}
