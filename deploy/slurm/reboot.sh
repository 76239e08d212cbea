#!/bin/sh
# Slurm RebootProgram for fleetmend's `[provider] kind = "slurm"`, which runs
#   scontrol reboot ASAP nextstate=DOWN reason="fleetmend: ..." NODE
# slurmd runs it as root on the node. After the boot slurmd registers and Slurm keeps the node
# DOWN with fleetmend's reason (nextstate=DOWN: RESUME would return it to service before
# fleetmend validated it); fleetmend undrains it once its deep check passed.
# Install as /usr/local/sbin/fleetmend-reboot.
exec /sbin/reboot
