//! The built-in Xid catalog: what each NVIDIA Xid code asks of the node.
//!
//! From the vendor's public Xid catalog and DCGM's health rules (see the project's notes). The
//! repairer's policy has the last word; this is the agent's recommendation and every entry can be
//! overridden for the gpu check's NVML events in config (`[checks.gpu.xid_actions]`); the kernel-log
//! `xid` rule is overridden as any rule is, by a user rule of its name.

use fleetmend_proto::{RecommendedAction, Status};

/// What the catalog says about one Xid code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidAdvice {
    pub status: Status,
    pub action: RecommendedAction,
    /// A few words on the code, for finding messages.
    pub meaning: &'static str,
}

/// The advice for `xid`. Codes the catalog does not name are a warning with no node action: a person
/// should look, but one unknown event does not take a node out.
pub fn advice(xid: u32) -> XidAdvice {
    use RecommendedAction::*;
    let (status, action, meaning) = match xid {
        79 => (Status::Fail, Reboot, "GPU has fallen off the bus"),
        151 => (Status::Fail, Reboot, "VM restart required"),
        48 => (Status::Fail, ResetGpu, "double-bit ECC error"),
        74 => (Status::Fail, ResetGpu, "NVLink error"),
        95 => (Status::Fail, ResetGpu, "uncontained ECC error"),
        119 | 120 => (Status::Fail, ResetGpu, "GSP error"),
        140 => (Status::Fail, ResetGpu, "unrecovered ECC error"),
        46 | 62 | 64 | 109 | 110 | 136 | 143 | 155 | 156 | 158 => {
            (Status::Fail, ResetGpu, "GPU reset required")
        }
        94 => (Status::Warn, RestartApp, "contained ECC error"),
        8 | 13 | 31 | 32 | 68 | 69 | 126 => (Status::Warn, RestartApp, "application fault"),
        54 => (Status::Warn, Drain, "check cables and seating"),
        78 => (Status::Warn, Drain, "update software or firmware"),
        45 => (Status::Ok, None, "preemptive cleanup"),
        43 | 63 | 92 | 121 | 137 | 157 => (Status::Ok, None, "informational"),
        // Informational: it names the recovery action of another Xid, which the recovery
        // action's own finding carries.
        154 => (Status::Ok, None, "recovery action changed"),
        // The line's own Fatal/Nonfatal word decides these (see `by_severity`); a line without it
        // is a warning for a person.
        144..=150 => (Status::Warn, None, "NVLink error"),
        _ => (Status::Warn, None, "not in the catalog"),
    };
    XidAdvice { status, action, meaning }
}

/// For the Xids whose line says itself how bad it is — the NVLink5 errors 144 to 150, printed
/// with `Fatal` or `Nonfatal` — the status and action that word means: fatal leaves the GPU's
/// links unusable until it is reset; non-fatal was corrected. `None` for other codes or words.
pub fn by_severity(xid: u32, word: &str) -> Option<(Status, RecommendedAction)> {
    if !(144..=150).contains(&xid) {
        return Option::None;
    }
    match word.to_ascii_lowercase().as_str() {
        "fatal" => Some((Status::Fail, RecommendedAction::ResetGpu)),
        "nonfatal" | "non-fatal" => Some((Status::Warn, RecommendedAction::None)),
        _ => Option::None,
    }
}

/// The action named by a driver's GPU recovery action (NVML field `GPU_RECOVERY_ACTION`, or Xid 154
/// in the kernel log): 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset.
pub fn recovery_action(code: u32) -> Option<(Status, RecommendedAction, &'static str)> {
    use RecommendedAction::*;
    match code {
        0 => Some((Status::Ok, None, "none")),
        1 => Some((Status::Fail, ResetGpu, "GPU reset")),
        2 => Some((Status::Fail, Reboot, "node reboot")),
        3 => Some((Status::Fail, Drain, "drain P2P")),
        4 => Some((Status::Fail, ResetGpu, "drain and reset")),
        _ => Option::None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_matches_the_vendor_table() {
        assert_eq!(advice(79).action, RecommendedAction::Reboot);
        assert_eq!(advice(48).action, RecommendedAction::ResetGpu);
        assert_eq!(advice(48).status, Status::Fail);
        assert_eq!(advice(13).action, RecommendedAction::RestartApp);
        assert_eq!(advice(63).status, Status::Ok);
        assert_eq!(advice(9999).status, Status::Warn);
        assert_eq!(recovery_action(2).map(|r| r.1), Some(RecommendedAction::Reboot));
        assert_eq!(recovery_action(9), Option::None);
        assert_eq!(by_severity(145, "Fatal"), Some((Status::Fail, RecommendedAction::ResetGpu)));
        assert_eq!(by_severity(150, "Nonfatal").map(|s| s.0), Some(Status::Warn));
        assert_eq!(by_severity(79, "Fatal"), Option::None);
    }
}
