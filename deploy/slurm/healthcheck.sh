#!/bin/sh
# Slurm HealthCheckProgram: runs fleetmend's checks once and drains this node when it is unhealthy,
# with a reason the repairer owns ("fleetmend: ..."). A node already drained (by fleetmend or by an
# admin) keeps its reason. Install as /usr/local/sbin/fleetmend-healthcheck.
#   FLEETMEND=/usr/local/bin/fleetmend  FLEETMEND_AGENT_CONFIG=/etc/fleetmend/agent.toml
FLEETMEND="${FLEETMEND:-/usr/local/bin/fleetmend}"
CONFIG="${FLEETMEND_AGENT_CONFIG:-/etc/fleetmend/agent.toml}"
NODE="${SLURMD_NODENAME:-$(hostname -s)}"

# Slurm kills the health check at 60 s: never come near it.
timeout 45 "$FLEETMEND" agent --once --config "$CONFIG" >/dev/null 2>&1
rc=$?
# 0 healthy; 1 unhealthy; anything else: the check could not run (not a reason to drain).
[ "$rc" -eq 1 ] || exit 0
state="$(timeout 10 scontrol show node "$NODE" | sed -n 's/.*State=\([^ ]*\).*/\1/p' | head -n 1)"
case "$state" in
  *DRAIN*) exit 0 ;;
esac
exec timeout 10 scontrol update NodeName="$NODE" State=DRAIN \
  Reason="fleetmend: health check failed (fleetmend agent --once)"
