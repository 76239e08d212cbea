//! A simulated node's host tree: the sysfs, procfs, root, kernel log and GPU fixture its agent
//! reads (`--path.sysfs`, `--path.procfs`, `--path.rootfs`, `--kmsg`, `--gpu fixture:`).
