#!/bin/sh
# Slurm HealthCheckProgram: runs fleetmend's checks once and, when the node is unhealthy, drains it
# with a reason the repairer owns ("fleetmend: xid 79 on GPU 3; ..."). A node already drained (by
# fleetmend or by an admin) keeps its reason. Install as /usr/local/sbin/fleetmend-healthcheck.
#
# slurmd runs it with SLURMD_NODENAME as its only variable: no PATH, no SLURM_CONF. Set here what
# differs from these defaults:
#   FLEETMEND=/usr/local/bin/fleetmend  FLEETMEND_AGENT_CONFIG=/etc/fleetmend/agent.toml
#   FLEETMEND_AGENT_ARGS=""  (more `fleetmend agent` flags, split on spaces, e.g. "--gpu=nvml")
#   SLURM_CONF               (only when slurm.conf is not where Slurm's commands look by default)
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
FLEETMEND="${FLEETMEND:-/usr/local/bin/fleetmend}"
CONFIG="${FLEETMEND_AGENT_CONFIG:-/etc/fleetmend/agent.toml}"

# Slurm kills the health check at 60 s: never come near it (the agent's own run, drain included,
# stays under 10 s). Exit codes (Slurm ignores them; they go to syslog with the agent's line):
#   0 healthy; 1 unhealthy, node drained (now or before); 2 the checks could not run;
#   3 unhealthy but the drain failed; 124 the agent took longer than 45 s.
# shellcheck disable=SC2086
msg="$(timeout 45 "$FLEETMEND" agent --once --slurm-drain --config "$CONFIG" \
  ${FLEETMEND_AGENT_ARGS:-} 2>&1 >/dev/null)"
rc=$?
if [ "$rc" -ne 0 ]; then
  logger -t fleetmend-healthcheck "exit $rc: $msg" 2>/dev/null || true
fi
exit "$rc"
