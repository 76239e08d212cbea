//! Where the store lives: a SQLite file (the embedded default) or a PostgreSQL database, chosen
//! by the form of `store` in the config (or `fleetmend repairer --store`).
//!
//! A PostgreSQL location may carry a password; it is shown everywhere (logs, errors, `Debug`) as
//! the redacted form `postgres://USER@HOST:PORT/DB`, rebuilt from the parsed connection settings,
//! so the password cannot leak through any of them.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::Deserialize;

/// The store's location.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum StoreLocation {
    /// One SQLite file (created if missing); serves one repairer.
    Sqlite(PathBuf),
    /// A PostgreSQL database, shared by every repairer that names it.
    Postgres(PostgresLocation),
}

/// A PostgreSQL connection string (`postgres://`, `postgresql://` or key=value conninfo).
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresLocation {
    /// The string as written, password included: only ever handed to the driver.
    conninfo: String,
    /// `postgres://USER@HOST:PORT/DB`, without the password.
    redacted: String,
}

/// The keys of a key=value conninfo that make a `store` value a PostgreSQL location rather than
/// a file name.
const CONNINFO_KEYS: &[&str] =
    &["host", "hostaddr", "port", "dbname", "user", "password", "sslmode", "connect_timeout"];

/// A `store` value that names PostgreSQL but cannot be parsed.
#[derive(Debug, thiserror::Error)]
#[error("store: not a valid PostgreSQL connection string ({reason})")]
pub struct LocationError {
    reason: String,
}

impl StoreLocation {
    /// The SQLite file, when that is the backend.
    pub fn sqlite_path(&self) -> Option<&Path> {
        match self {
            StoreLocation::Sqlite(path) => Some(path),
            StoreLocation::Postgres(_) => None,
        }
    }
}

impl PostgresLocation {
    /// Parses a connection string; the password never appears in the error.
    pub fn parse(conninfo: &str) -> Result<PostgresLocation, LocationError> {
        let config = postgres::Config::from_str(conninfo)
            .map_err(|err| LocationError { reason: redact(&err.to_string(), conninfo) })?;
        Ok(PostgresLocation { conninfo: conninfo.to_owned(), redacted: describe(&config) })
    }

    /// The driver's connection settings (with the password).
    pub(crate) fn config(&self) -> Result<postgres::Config, LocationError> {
        postgres::Config::from_str(&self.conninfo)
            .map_err(|err| LocationError { reason: redact(&err.to_string(), &self.conninfo) })
    }

    /// The password, if the string carries one (to scrub it from driver errors).
    pub(crate) fn password(&self) -> Option<String> {
        let config = self.config().ok()?;
        config.get_password().map(|p| String::from_utf8_lossy(p).into_owned())
    }

    /// `postgres://USER@HOST:PORT/DB`.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }
}

/// Rebuilds a URL from the parsed settings, leaving the password out.
fn describe(config: &postgres::Config) -> String {
    let user = config.get_user().map(|u| format!("{u}@")).unwrap_or_default();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let name = match host {
                postgres::config::Host::Tcp(name) => name.clone(),
                postgres::config::Host::Unix(path) => path.display().to_string(),
            };
            let port = config.get_ports().get(i).or(config.get_ports().first());
            match port {
                Some(port) => format!("{name}:{port}"),
                None => name,
            }
        })
        .collect();
    let db = config.get_dbname().map(|d| format!("/{d}")).unwrap_or_default();
    format!("postgres://{user}{}{db}", hosts.join(","))
}

/// `text` with every occurrence of the password in `conninfo` replaced.
fn redact(text: &str, conninfo: &str) -> String {
    match postgres::Config::from_str(conninfo)
        .ok()
        .and_then(|c| c.get_password().map(<[u8]>::to_vec))
    {
        Some(password) if !password.is_empty() => {
            text.replace(&*String::from_utf8_lossy(&password), "***")
        }
        _ => text.to_owned(),
    }
}

/// Whether `value` names PostgreSQL: a `postgres://` or `postgresql://` URL, or a key=value
/// conninfo whose first key is one of libpq's.
fn names_postgres(value: &str) -> bool {
    let value = value.trim_start();
    if value.starts_with("postgres://") || value.starts_with("postgresql://") {
        return true;
    }
    let first = value.split_whitespace().next().unwrap_or_default();
    first.split_once('=').is_some_and(|(key, _)| CONNINFO_KEYS.contains(&key.trim()))
}

impl FromStr for StoreLocation {
    type Err = LocationError;

    fn from_str(value: &str) -> Result<StoreLocation, LocationError> {
        if names_postgres(value) {
            Ok(StoreLocation::Postgres(PostgresLocation::parse(value)?))
        } else {
            Ok(StoreLocation::Sqlite(PathBuf::from(value)))
        }
    }
}

impl TryFrom<String> for StoreLocation {
    type Error = LocationError;

    fn try_from(value: String) -> Result<StoreLocation, LocationError> {
        value.parse()
    }
}

impl From<PathBuf> for StoreLocation {
    fn from(path: PathBuf) -> StoreLocation {
        StoreLocation::Sqlite(path)
    }
}

impl From<&Path> for StoreLocation {
    fn from(path: &Path) -> StoreLocation {
        StoreLocation::Sqlite(path.to_owned())
    }
}

impl fmt::Display for StoreLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreLocation::Sqlite(path) => write!(f, "{}", path.display()),
            StoreLocation::Postgres(pg) => f.write_str(pg.redacted()),
        }
    }
}

impl fmt::Debug for StoreLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreLocation::Sqlite(path) => f.debug_tuple("Sqlite").field(path).finish(),
            StoreLocation::Postgres(pg) => f.debug_tuple("Postgres").field(pg).finish(),
        }
    }
}

impl fmt::Display for PostgresLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl fmt::Debug for PostgresLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_conninfo_name_postgres_and_anything_else_is_a_file() {
        for value in [
            "postgres://fm@db:5432/fleet",
            "postgresql://fm@db/fleet",
            "host=db port=5432 dbname=fleet user=fm",
        ] {
            assert!(matches!(value.parse(), Ok(StoreLocation::Postgres(_))), "{value}");
        }
        for value in ["/var/lib/fleetmend/repairer.db", "repairer.db", "./a=b.db"] {
            assert_eq!(
                value.parse::<StoreLocation>().unwrap(),
                StoreLocation::Sqlite(value.into())
            );
        }
        assert!("postgres://fm@db:notaport/fleet".parse::<StoreLocation>().is_err());
    }

    #[test]
    fn the_password_is_never_shown() {
        for value in [
            "postgres://fm:hunter2secret@db:5433/fleet",
            "host=db port=5433 dbname=fleet user=fm password=hunter2secret",
        ] {
            let location: StoreLocation = value.parse().unwrap();
            assert_eq!(location.to_string(), "postgres://fm@db:5433/fleet");
            assert!(!format!("{location:?}").contains("hunter2secret"));
        }
        let bad = "postgres://fm:hunter2secret@db:notaport/fleet".parse::<StoreLocation>();
        let err = bad.unwrap_err();
        assert!(!format!("{err} {err:?}").contains("hunter2secret"), "{err}");
    }
}
