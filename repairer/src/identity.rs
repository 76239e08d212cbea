//! Per-node identity: every node's agent presents a token of its own, and the repairer accepts a
//! report for node X only with X's. The repairer keeps no token, only each one's SHA-256, in a
//! file of `NODE = "HEX"` lines (`node_tokens_file`), read again when it changes: a node added to
//! the file can report at once, a node taken out is refused at once. `fleetmend token issue`
//! writes both sides: the nodes' token files and their lines in the hashes file.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use sha2::{Digest, Sha256};

/// The hashes file is looked at (one `stat`) at most this often.
const RECHECK: Duration = Duration::from_secs(1);

/// Bytes of randomness in an issued token (64 hex digits).
const TOKEN_BYTES: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{0:?} is not a node name (letters, digits, - . _; at most 253)")]
    BadNode(String),
    #[error("{0:?} is not a credential name (1 to 64 of A-Z a-z 0-9 . _ - @)")]
    BadName(String),
}

/// Whether `name` is a node name the repairer accepts in a report.
pub fn is_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
}

/// Whether `name` can name a person's or tool's credential (`[[credentials]]`).
pub fn is_credential_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'))
}

/// The SHA-256 of `token`, in lower-case hex: what the hashes file holds.
pub fn hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.trim().as_bytes()))
}

/// Parses a hashes file: a TOML table of node name to hash.
pub fn parse(text: &str) -> Result<BTreeMap<String, String>, String> {
    let table: BTreeMap<String, String> =
        toml::from_str(text).map_err(|err| err.to_string().trim_end().to_owned())?;
    let mut seen: HashMap<&str, &str> = HashMap::new();
    for (node, digest) in &table {
        if !is_node_name(node) {
            return Err(format!("{node:?} is not a node name (letters, digits, - . _)"));
        }
        if digest.len() != 64 || !digest.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(format!("{node}: {digest:?} is not a SHA-256 in hex (64 digits)"));
        }
        if let Some(other) = seen.insert(digest.as_str(), node.as_str()) {
            return Err(format!("{node} and {other} have the same token"));
        }
    }
    Ok(table)
}

/// The nodes' token hashes, from `node_tokens_file`.
#[derive(Debug)]
pub struct NodeTokens {
    path: PathBuf,
    loaded: Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    modified: Option<SystemTime>,
    checked: Instant,
    /// Hash to node.
    nodes: HashMap<String, String>,
}

impl NodeTokens {
    /// Reads the file; a missing or malformed one is an error (the repairer does not start).
    pub fn load(path: &Path) -> Result<NodeTokens, IdentityError> {
        let (modified, nodes) = read(path)?;
        let loaded = Loaded { modified, checked: Instant::now(), nodes };
        Ok(NodeTokens { path: path.to_owned(), loaded: Mutex::new(loaded) })
    }

    /// The node whose token `token` is, if any. Reads the file again when it changed; a file
    /// that became unreadable or malformed keeps the nodes read before (and says so).
    pub fn node_of(&self, token: &str) -> Option<String> {
        let digest = hash(token);
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if loaded.checked.elapsed() >= RECHECK {
            loaded.checked = Instant::now();
            let modified = std::fs::metadata(&self.path).and_then(|m| m.modified()).ok();
            if modified != loaded.modified {
                match read(&self.path) {
                    Ok((modified, nodes)) => {
                        tracing::info!(path = %self.path.display(), nodes = nodes.len(), "node tokens read again");
                        loaded.modified = modified;
                        loaded.nodes = nodes;
                    }
                    Err(err) => {
                        loaded.modified = modified;
                        tracing::error!(error = %err, "node tokens not read again: the ones read before stay");
                    }
                }
            }
        }
        loaded.nodes.get(&digest).cloned()
    }
}

fn read(path: &Path) -> Result<(Option<SystemTime>, HashMap<String, String>), IdentityError> {
    let read_err = |source| IdentityError::Read { path: path.to_owned(), source };
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).map_err(read_err)?;
    let text = std::fs::read_to_string(path).map_err(read_err)?;
    let table =
        parse(&text).map_err(|message| IdentityError::Parse { path: path.to_owned(), message })?;
    Ok((Some(modified), table.into_iter().map(|(node, digest)| (digest, node)).collect()))
}

/// Issues a new token to each of `nodes`: writes `<dir>/<node>.token` (mode 0600; the agent's
/// `[report] token_file`) and sets the node's line in `hashes` (created if missing; written to a
/// temporary file and renamed, so the repairer never reads half of it). A node issued again gets
/// a new token and its old one stops working. Returns the token files written.
pub fn issue(dir: &Path, hashes: &Path, nodes: &[String]) -> Result<Vec<PathBuf>, IdentityError> {
    if let Some(bad) = nodes.iter().find(|n| !is_node_name(n)) {
        return Err(IdentityError::BadNode(bad.clone()));
    }
    let mut table = match std::fs::read_to_string(hashes) {
        Ok(text) => parse(&text)
            .map_err(|message| IdentityError::Parse { path: hashes.to_owned(), message })?,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
        Err(source) => return Err(IdentityError::Read { path: hashes.to_owned(), source }),
    };
    std::fs::create_dir_all(dir)
        .map_err(|source| IdentityError::Write { path: dir.to_owned(), source })?;
    let mut written = Vec::new();
    for node in nodes {
        let token = random_token()?;
        let path = dir.join(format!("{node}.token"));
        write_private(&path, format!("{token}\n").as_bytes())?;
        table.insert(node.clone(), hash(&token));
        written.push(path);
    }
    let mut text = String::from(
        "# SHA-256 of each node's token (fleetmend token issue): the repairer's node_tokens_file.\n",
    );
    for (node, digest) in &table {
        text.push_str(&format!("{node:?} = \"{digest}\"\n"));
    }
    let temporary = hashes.with_extension("tmp");
    write_private(&temporary, text.as_bytes())?;
    std::fs::rename(&temporary, hashes)
        .map_err(|source| IdentityError::Write { path: hashes.to_owned(), source })?;
    Ok(written)
}

/// Issues a person's or tool's token: writes `<dir>/<name>.token` (mode 0600) and returns the
/// file and the token's SHA-256, for the repairer's `[[credentials]]` entry.
pub fn issue_credential(dir: &Path, name: &str) -> Result<(PathBuf, String), IdentityError> {
    if !is_credential_name(name) {
        return Err(IdentityError::BadName(name.to_owned()));
    }
    std::fs::create_dir_all(dir)
        .map_err(|source| IdentityError::Write { path: dir.to_owned(), source })?;
    let token = random_token()?;
    let path = dir.join(format!("{name}.token"));
    write_private(&path, format!("{token}\n").as_bytes())?;
    Ok((path, hash(&token)))
}

/// A token from the kernel's random source; none is issued without it.
fn random_token() -> Result<String, IdentityError> {
    let path = Path::new("/dev/urandom");
    let mut bytes = [0u8; TOKEN_BYTES];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|source| IdentityError::Read { path: path.to_owned(), source })?;
    Ok(hex::encode(bytes))
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), IdentityError> {
    let write_err = |source| IdentityError::Write { path: path.to_owned(), source };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(write_err)?;
    file.write_all(bytes).and_then(|()| file.sync_all()).map_err(write_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_tokens_are_known_by_their_node_only_and_a_reissue_revokes_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        let hashes = dir.path().join("node-tokens");
        let nodes = ["n1".to_owned(), "n2".to_owned()];
        let files = issue(&dir.path().join("tokens"), &hashes, &nodes).unwrap();
        let token = |i: usize| std::fs::read_to_string(&files[i]).unwrap();
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&files[0]).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        let tokens = NodeTokens::load(&hashes).unwrap();
        assert_eq!(tokens.node_of(&token(0)).as_deref(), Some("n1"));
        assert_eq!(tokens.node_of(&token(1)).as_deref(), Some("n2"));
        assert_eq!(tokens.node_of("not-a-token"), None);
        assert!(!std::fs::read_to_string(&hashes).unwrap().contains(token(0).trim()));

        // n1 again: a new token; the old one is refused once the file is read again.
        let old = token(0);
        issue(&dir.path().join("tokens"), &hashes, &nodes[..1]).unwrap();
        let later = NodeTokens::load(&hashes).unwrap();
        assert_eq!(later.node_of(&old), None);
        assert_eq!(later.node_of(&token(0)).as_deref(), Some("n1"));
        assert_eq!(later.node_of(&token(1)).as_deref(), Some("n2"), "n2 keeps its token");
    }

    #[test]
    fn bad_hashes_files_and_names_are_refused_with_the_reason() {
        let a = "a".repeat(64);
        let b = "b".repeat(64);
        let cases: Vec<(String, &str)> = vec![
            ("n1 = \"abc\"".to_owned(), "not a SHA-256"),
            (format!("\"n 1\" = \"{a}\""), "not a node name"),
            (format!("n1 = \"{b}\"\nn2 = \"{b}\""), "the same token"),
            ("n1 = 3".to_owned(), "invalid type"),
        ];
        for (text, why) in cases {
            let err = parse(&text).unwrap_err();
            assert!(err.contains(why), "{text:?}: {err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let err = issue(dir.path(), &dir.path().join("h"), &["a/b".to_owned()]).unwrap_err();
        assert!(matches!(err, IdentityError::BadNode(_)), "{err}");
        assert!(matches!(
            NodeTokens::load(&dir.path().join("missing")),
            Err(IdentityError::Read { .. })
        ));
    }
}
