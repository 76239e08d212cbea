#!/bin/sh
# Slurm RebootProgram for `scontrol reboot ASAP nextstate=RESUME reason="fleetmend: ..." NODE`.
# slurmd runs it as root on the node; the node returns to service when slurmd registers after the
# boot. Install as /usr/local/sbin/fleetmend-reboot.
exec /sbin/reboot
