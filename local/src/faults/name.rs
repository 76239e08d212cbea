//! A fault's name: how `fleetmend inject`, scenarios and `node.json` spell it, both ways.

use std::fmt;
use std::str::FromStr;

use super::{FAULT_NAMES, Fault};

/// The most digits an Xid code has in the driver's kernel-log line.
const MAX_XID: u32 = 99_999;

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::GpuXid(code) => write!(f, "gpu-xid:{code}"),
            Fault::GpuMissing => f.write_str("gpu-missing"),
            Fault::RowRemapFailure => f.write_str("row-remap-failure"),
            Fault::NvlinkDown => f.write_str("nvlink-down"),
            Fault::NicDown => f.write_str("nic-down"),
            Fault::IbPortDown => f.write_str("ib-port-down"),
            Fault::PcieDowntrained => f.write_str("pcie-downtrained"),
            Fault::GpuThrottle => f.write_str("gpu-throttle"),
            Fault::NvswitchFatal => f.write_str("nvswitch-fatal"),
            Fault::Mlx5Health => f.write_str("mlx5-health"),
            Fault::NicPcieDowntrained => f.write_str("nic-pcie-downtrained"),
            Fault::GpuLost => f.write_str("gpu-lost"),
            Fault::XidBurst => f.write_str("xid-burst"),
            Fault::GspTimeout => f.write_str("gsp-timeout"),
            Fault::DiskFull => f.write_str("disk-full"),
            Fault::DiskReadonly => f.write_str("disk-readonly"),
            Fault::KernelMce => f.write_str("kernel-mce"),
            Fault::AgentKill => f.write_str("agent-kill"),
            Fault::Hang => f.write_str("hang"),
            Fault::Nan => f.write_str("nan"),
            Fault::Slow(percent) => write!(f, "slow:{percent}"),
        }
    }
}

/// A fault name that is not one of [`FAULT_NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a fault: {reason} (valid faults: {})", FAULT_NAMES.join(", "))]
pub struct FaultParseError {
    pub text: String,
    pub reason: String,
}

impl FromStr for Fault {
    type Err = FaultParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = |reason: String| FaultParseError { text: text.to_owned(), reason };
        if let Some(percent) = text.strip_prefix("slow:") {
            return match percent.trim_end_matches('%').parse::<u32>() {
                Ok(percent) if (1..=99).contains(&percent) => Ok(Fault::Slow(percent)),
                _ => Err(error(
                    "the percentage of its CPU a rank keeps must be 1 to 99, e.g. slow:50"
                        .to_owned(),
                )),
            };
        }
        if text == "slow" {
            return Err(error("slow needs a percentage, e.g. slow:50".to_owned()));
        }
        if let Some(code) = text.strip_prefix("gpu-xid:") {
            return match code.parse::<u32>() {
                Ok(code) if (1..=MAX_XID).contains(&code) => Ok(Fault::GpuXid(code)),
                _ => Err(error(format!(
                    "the Xid code must be a number from 1 to {MAX_XID}, e.g. gpu-xid:79"
                ))),
            };
        }
        Ok(match text {
            "gpu-xid" => return Err(error("gpu-xid needs a code, e.g. gpu-xid:79".to_owned())),
            "gpu-missing" => Fault::GpuMissing,
            "row-remap-failure" => Fault::RowRemapFailure,
            "nvlink-down" => Fault::NvlinkDown,
            "nic-down" => Fault::NicDown,
            "ib-port-down" => Fault::IbPortDown,
            "pcie-downtrained" => Fault::PcieDowntrained,
            "gpu-throttle" => Fault::GpuThrottle,
            "nvswitch-fatal" => Fault::NvswitchFatal,
            "mlx5-health" => Fault::Mlx5Health,
            "nic-pcie-downtrained" => Fault::NicPcieDowntrained,
            "gpu-lost" => Fault::GpuLost,
            "xid-burst" => Fault::XidBurst,
            "gsp-timeout" => Fault::GspTimeout,
            "disk-full" => Fault::DiskFull,
            "disk-readonly" => Fault::DiskReadonly,
            "kernel-mce" => Fault::KernelMce,
            "agent-kill" => Fault::AgentKill,
            "hang" => Fault::Hang,
            "nan" => Fault::Nan,
            _ => return Err(error("unknown name".to_owned())),
        })
    }
}

impl TryFrom<String> for Fault {
    type Error = FaultParseError;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        text.parse()
    }
}

impl From<Fault> for String {
    fn from(fault: Fault) -> String {
        fault.to_string()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_ones_list_the_valid_faults() {
        for name in [
            "gpu-xid:79",
            "gpu-xid:48",
            "gpu-missing",
            "row-remap-failure",
            "nvlink-down",
            "nic-down",
            "ib-port-down",
            "pcie-downtrained",
            "gpu-throttle",
            "nvswitch-fatal",
            "mlx5-health",
            "disk-full",
            "disk-readonly",
            "kernel-mce",
            "agent-kill",
        ] {
            let fault: Fault = name.parse().unwrap();
            assert_eq!(fault.to_string(), name);
        }
        assert_eq!("gpu-xid:79".parse::<Fault>().unwrap(), Fault::GpuXid(79));
        for bad in ["gpu-xid", "gpu-xid:", "gpu-xid:0", "gpu-xid:x", "gpu-xid:100000", "melt", ""] {
            let err = bad.parse::<Fault>().unwrap_err();
            let text = err.to_string();
            assert!(text.contains("gpu-missing") && text.contains("agent-kill"), "{text}");
        }
        let json = serde_json::to_string(&Fault::GpuXid(48)).unwrap();
        assert_eq!(json, "\"gpu-xid:48\"");
        assert_eq!(serde_json::from_str::<Fault>(&json).unwrap(), Fault::GpuXid(48));
        assert!(serde_json::from_str::<Fault>("\"melt\"").is_err());
    }
}
