//! Who this agent is: node name, boot id, version.

use std::path::Path;

use crate::config::HostPaths;

/// The identity an agent reports and exports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeIdentity {
    pub node: String,
    /// Changes on every boot; `unknown` when procfs does not say.
    pub boot_id: String,
    pub agent_version: String,
}

impl NodeIdentity {
    /// The configured node name (or the host name) and the boot id from `{procfs}/sys/kernel/random/boot_id`.
    pub fn discover(configured: Option<&str>, paths: &HostPaths) -> NodeIdentity {
        let node = match configured {
            Some(node) => node.to_owned(),
            None => nix::unistd::gethostname()
                .ok()
                .and_then(|name| name.into_string().ok())
                .filter(|name| !name.is_empty())
                .unwrap_or_else(|| "localhost".to_owned()),
        };
        NodeIdentity {
            node,
            boot_id: read_boot_id(&paths.procfs),
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }
}

fn read_boot_id(procfs: &Path) -> String {
    std::fs::read_to_string(procfs.join("sys/kernel/random/boot_id"))
        .ok()
        .map(|id| id.trim().to_owned())
        .filter(|id| !id.is_empty() && id.len() <= 64 && id.chars().all(|c| c.is_ascii_graphic()))
        .unwrap_or_else(|| "unknown".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_id_comes_from_procfs_and_garbage_is_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let paths = HostPaths { procfs: dir.path().to_owned(), ..HostPaths::default() };
        assert_eq!(NodeIdentity::discover(Some("n1"), &paths).boot_id, "unknown");
        std::fs::create_dir_all(dir.path().join("sys/kernel/random")).unwrap();
        std::fs::write(dir.path().join("sys/kernel/random/boot_id"), "abc-123\n").unwrap();
        let id = NodeIdentity::discover(Some("n1"), &paths);
        assert_eq!((id.node.as_str(), id.boot_id.as_str()), ("n1", "abc-123"));
        std::fs::write(dir.path().join("sys/kernel/random/boot_id"), [0xff, 0x00, b'\n']).unwrap();
        assert_eq!(NodeIdentity::discover(Some("n1"), &paths).boot_id, "unknown");
    }
}
