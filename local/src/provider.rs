//! The `local` provider: reboot and replace for the nodes `fleetmend up` simulates.
