//! Fitting the connection cap and the process's descriptor limit to each other.
//!
//! Each connection holds a descriptor. systemd starts services with a soft limit of 1,024 (and a
//! hard one far above): a cap above the soft limit would let connections run the process out of
//! descriptors (the store, log files, subprocesses' pipes, its own outgoing requests) before the
//! cap sheds anything. So the soft limit is raised towards the hard one to fit the cap, and where
//! the hard limit does not allow it the cap is lowered, and the log says which setting to change.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Descriptors kept for everything but the listener's connections.
pub const RESERVED: u64 = 256;

/// The cap that fits: `wanted` when the descriptor limit holds it (after raising the soft limit
/// if needed), else what the limit leaves after [`RESERVED`] (at least 1).
pub fn fit(wanted: u32) -> u32 {
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return wanted;
    };
    let needed = u64::from(wanted) + RESERVED;
    let mut limit = soft;
    if soft < needed {
        let raised = needed.min(hard);
        match setrlimit(Resource::RLIMIT_NOFILE, raised, hard) {
            Ok(()) => limit = raised,
            Err(err) => {
                tracing::warn!(error = %err, soft, "raising the descriptor limit (RLIMIT_NOFILE) failed");
            }
        }
    }
    if limit >= needed {
        return wanted;
    }
    let fitted = u32::try_from(limit.saturating_sub(RESERVED).max(1)).unwrap_or(wanted);
    tracing::warn!(
        max_connections = wanted,
        fitted,
        descriptor_limit = limit,
        "the descriptor limit does not hold listener.max_connections: capped lower (raise LimitNOFILE= or lower the setting)"
    );
    fitted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cap_the_limit_holds_is_kept_and_leaves_the_limit_fitting_it() {
        assert_eq!(fit(16), 16);
        let (soft, _) = getrlimit(Resource::RLIMIT_NOFILE).unwrap_or((0, 0));
        assert!(soft >= 16 + RESERVED, "soft limit {soft}");
    }

    #[test]
    fn a_cap_past_the_hard_limit_is_lowered_to_fit() {
        let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else { return };
        if hard >= u64::from(u32::MAX) {
            return;
        }
        let fitted = fit(u32::MAX);
        assert!(u64::from(fitted) + RESERVED <= hard.max(RESERVED + 1), "{fitted} vs {hard}");
    }
}
