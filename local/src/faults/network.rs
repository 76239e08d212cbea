//! Network faults: an Ethernet link or an InfiniBand port down, as sysfs and the kernel log show
//! them.

use std::fs;

use super::{DOWN_IB, DOWN_NIC, DOWNTRAINED_NIC, InjectError};
use crate::tree::{self, NodeTree, TreeError, TreeMeta};

pub(super) fn nic_down(tree: &NodeTree, meta: &TreeMeta) -> Result<(), InjectError> {
    let dir = tree.dir().join("sys/class/net").join(DOWN_NIC);
    let changes_path = dir.join("carrier_changes");
    let changes: u64 = fs::read_to_string(&changes_path)
        .map_err(|source| TreeError::Read { path: changes_path.clone(), source })?
        .trim()
        .parse()
        .unwrap_or(0);
    // Only a change of state counts as a carrier change: a second nic-down changes nothing.
    let carrier_path = dir.join("carrier");
    let was_up = fs::read_to_string(&carrier_path).map(|c| c.trim() == "1").unwrap_or(true);
    tree::write_atomic(&dir.join("operstate"), b"down\n")?;
    tree::write_atomic(&carrier_path, b"0\n")?;
    // The kernel has no speed for a link that is down.
    tree::write_atomic(&dir.join("speed"), b"-1\n")?;
    if was_up {
        tree::write_atomic(&changes_path, format!("{}\n", changes + 1).as_bytes())?;
    }
    tree.append_kmsg(meta, &[(6, format!("mlx5_core 0000:0c:00.0 {DOWN_NIC}: Link is Down"))])?;
    Ok(())
}

/// The port as the mlx5 driver shows a link with no partner (a pulled cable, a dead switch port):
/// `1: DOWN` / `2: Polling`, one more `link_downed` on the way down; IPoIB drops the carrier of
/// the port's interface with it.
pub(super) fn ib_port_down(tree: &NodeTree) -> Result<(), InjectError> {
    let (device, port, netdev) = DOWN_IB;
    let dir =
        tree.dir().join("sys/class/infiniband").join(device).join("ports").join(port.to_string());
    let state_path = dir.join("state");
    let was_up = fs::read_to_string(&state_path).map(|s| s.contains("ACTIVE")).unwrap_or(true);
    tree::write_atomic(&state_path, b"1: DOWN\n")?;
    tree::write_atomic(&dir.join("phys_state"), b"2: Polling\n")?;
    let netdev_dir = tree.dir().join("sys/class/net").join(netdev);
    tree::write_atomic(&netdev_dir.join("operstate"), b"down\n")?;
    tree::write_atomic(&netdev_dir.join("carrier"), b"0\n")?;
    if was_up {
        for path in [dir.join("counters/link_downed"), netdev_dir.join("carrier_changes")] {
            let count: u64 = fs::read_to_string(&path)
                .map_err(|source| TreeError::Read { path: path.clone(), source })?
                .trim()
                .parse()
                .unwrap_or(0);
            tree::write_atomic(&path, format!("{}\n", count + 1).as_bytes())?;
        }
    }
    Ok(())
}

/// `nic-pcie-downtrained`: NIC [`DOWNTRAINED_NIC`]'s link at Gen3 speed in sysfs.
pub(super) fn nic_pcie_downtrained(tree: &NodeTree) -> Result<(), InjectError> {
    let path = tree.dir().join("sys/bus/pci/devices").join(DOWNTRAINED_NIC);
    tree::write_atomic(&path.join("current_link_speed"), b"8.0 GT/s PCIe\n")
        .map_err(InjectError::from)
}
