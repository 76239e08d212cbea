#!/bin/sh
# Slurm Prolog: before a job runs on this node, runs fleetmend's checks once; an unhealthy node is
# drained with a reason the repairer owns ("fleetmend: ...") and the job does not start here.
# Install as /usr/local/sbin/fleetmend-prolog (`Prolog=` in slurm.conf). It delays every job's
# start by one agent run (well under 10 s).
#
# A non-zero Prolog exit makes Slurm drain the node (its own reason "Prolog error", which does not
# replace a drain that is already there) and requeue the job, held unless slurm.conf has
# `SchedulerParameters=nohold_on_prolog_fail`. So:
#   agent 0 (healthy)                      -> 0: the job runs
#   agent 1 (unhealthy, drained)           -> 1: the job is requeued; the node keeps fleetmend's reason
#   agent 3 (unhealthy, the drain failed)  -> 1: Slurm drains the node itself ("Prolog error")
#   agent 2 (checks could not run), or the agent timed out -> 0: the job runs, logged to syslog;
#       a broken fleetmend install must not drain every node and bounce every job
#
# slurmd sets SLURMD_NODENAME and SLURM_CONF but no PATH. Settings, as in healthcheck.sh:
#   FLEETMEND=/usr/local/bin/fleetmend  FLEETMEND_AGENT_CONFIG=/etc/fleetmend/agent.toml
#   FLEETMEND_AGENT_ARGS=""  FLEETMEND_PROLOG_TIMEOUT=30 (seconds)
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
FLEETMEND="${FLEETMEND:-/usr/local/bin/fleetmend}"
CONFIG="${FLEETMEND_AGENT_CONFIG:-/etc/fleetmend/agent.toml}"

# shellcheck disable=SC2086
msg="$(timeout "${FLEETMEND_PROLOG_TIMEOUT:-30}" "$FLEETMEND" agent --once --slurm-drain \
  --config "$CONFIG" ${FLEETMEND_AGENT_ARGS:-} 2>&1 >/dev/null)"
rc=$?
case "$rc" in
  0) exit 0 ;;
  1 | 3)
    logger -t fleetmend-prolog "job ${SLURM_JOB_ID:-?} not started on ${SLURMD_NODENAME:-?}: $msg" \
      2>/dev/null || true
    exit 1
    ;;
  *)
    logger -t fleetmend-prolog "checks could not run (exit $rc), job ${SLURM_JOB_ID:-?} runs: $msg" \
      2>/dev/null || true
    exit 0
    ;;
esac
