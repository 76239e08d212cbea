#!/usr/bin/env bash
# A Slurm dev/test cluster on one host: munged, slurmctld and four slurmd (node1..node4), each
# node with eight fake GPUs (`gpu:8`, files that point at /dev/null). Everything lives under DIR.
#
#   deploy/slurm/dev-cluster.sh start  [DIR]   start it afresh; waits until the 4 nodes are idle
#   deploy/slurm/dev-cluster.sh stop   [DIR]   stop everything it runs in DIR (idempotent)
#   deploy/slurm/dev-cluster.sh status [DIR]   sinfo of the cluster, exit 1 when it is not up
#   deploy/slurm/dev-cluster.sh stop-controller  [DIR]   stop slurmctld only (slurmd, jobs stay)
#   deploy/slurm/dev-cluster.sh start-controller [DIR]   start slurmctld on its kept state; waits
#                                                        until `scontrol ping` says UP
#
# DIR defaults to /tmp/fleetmend-slurm. Clients find the cluster with
#   export SLURM_CONF=DIR/slurm.conf
# Reboots (`scontrol reboot ... NODE`) run DIR/reboot-program.sh: it writes a fresh boot id to
# DIR/nodes/NODE/boot_id (what a test agent reads as its boot_id) and restarts that node's slurmd
# with -b (registers as rebooted); what it did is in DIR/log/reboot-NODE.log.
# Needs root and Debian's `slurm-wlm munge` (apt-get install slurm-wlm munge).
# Ports: FLEETMEND_SLURM_CTLD_PORT (default 16817) for slurmctld, FLEETMEND_SLURM_NODE_PORT
# (default 17001) and the three after it for the slurmd of node1..node4.
# FLEETMEND_SLURM_START_TIMEOUT (seconds, default 30) bounds the wait for idle nodes and for
# start-controller's `scontrol ping`.
set -euo pipefail

cmd="${1:-}"
dir="${2:-/tmp/fleetmend-slurm}"
ctld_port="${FLEETMEND_SLURM_CTLD_PORT:-16817}"
node_port="${FLEETMEND_SLURM_NODE_PORT:-17001}"
start_timeout="${FLEETMEND_SLURM_START_TIMEOUT:-30}"
nodes=(node1 node2 node3 node4)

usage() {
  sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

die() {
  echo "dev-cluster: $*" >&2
  exit 1
}

# The pid in FILE when that process is alive.
live_pid() {
  local file="$1" pid
  [ -s "$file" ] || return 1
  pid="$(tr -dc '0-9' <"$file")"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

# Waits (bounded) for PID to exit; SIGKILL when it does not.
stop_pid() {
  local pid="$1" name="$2" i
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  echo "dev-cluster: $name ($pid) ignored SIGTERM for 10 s: SIGKILL" >&2
  kill -KILL "$pid" 2>/dev/null || true
}

write_config() {
  local host
  host="$(hostname -s)"
  # A fresh cluster every start: no jobs, drains or spooled steps from an earlier run in DIR.
  rm -rf "$dir/state" "$dir/spool"
  mkdir -p "$dir"/{state,log,run,munge,dev}
  for n in "${nodes[@]}"; do mkdir -p "$dir/spool/$n"; done
  for i in 0 1 2 3 4 5 6 7; do ln -sfn /dev/null "$dir/dev/gpu$i"; done
  chmod 700 "$dir/munge"
  if [ ! -s "$dir/munge/munge.key" ]; then
    # A key of the cluster's own, so the host's munge setup is neither needed nor touched.
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$dir/munge/munge.key"
  fi
  # Never more CPUs than the host has: slurmd marks such a node invalid.
  local cpus=2
  [ "$(nproc)" -ge 2 ] || cpus=1
  cat >"$dir/slurm.conf" <<CONF
# Written by deploy/slurm/dev-cluster.sh: a dev/test cluster on one host.
ClusterName=fleetmend-dev
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups or systemd on these hosts.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=1
# The fake reboot (reboot-program.sh) brings slurmd back in seconds; a node not back within
# ResumeTimeout is set DOWN.
RebootProgram=$dir/reboot-program.sh
ResumeTimeout=60
SlurmdTimeout=10
SlurmctldTimeout=10
InactiveLimit=0
KillWait=5
MinJobAge=60
SchedulerType=sched/backfill
GresTypes=gpu
NodeName=node[1-4] NodeHostname=localhost NodeAddr=127.0.0.1 Port=$node_port-$((node_port + 3)) CPUs=$cpus RealMemory=512 Gres=gpu:8 State=UNKNOWN
PartitionName=dev Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
  write_reboot_program
  for n in "${nodes[@]}"; do
    mkdir -p "$dir/nodes/$n"
    cat /proc/sys/kernel/random/uuid >"$dir/nodes/$n/boot_id"
  done
  cat >"$dir/gres.conf" <<CONF
# Fake GPUs: a count-only gres.conf makes the nodes invalid, files are required.
AutoDetect=off
NodeName=node[1-4] Name=gpu File=$dir/dev/gpu[0-7]
CONF
}

# DIR/reboot-program.sh, the cluster's RebootProgram. slurmd runs it for `scontrol reboot`; it
# finds the node it serves (SLURMD_NODENAME, else the `-N` of the slurmd above it), writes a new
# boot id to DIR/nodes/NODE/boot_id, and in its own session (so that stopping slurmd does not stop
# it) stops the node's slurmd and starts `slurmd -b` (the node registers as rebooted).
write_reboot_program() {
  local slurmd_bin
  slurmd_bin="$(command -v slurmd || echo /usr/sbin/slurmd)"
  {
    echo '#!/usr/bin/env bash'
    echo '# Written by deploy/slurm/dev-cluster.sh: the dev cluster'"'"'s fake RebootProgram.'
    echo 'set -u'
    printf 'dir=%q\nslurmd_bin=%q\n' "$dir" "$slurmd_bin"
    cat <<'PROG'
restart() {
  local node="$1" program_pid="$2" pidfile="$dir/run/slurmd-$1.pid" old="" i
  echo $$ >"$dir/run/reboot-$node.pid"
  # Let slurmd answer the reboot request (its program has returned) before it goes away.
  for i in $(seq 1 50); do
    kill -0 "$program_pid" 2>/dev/null || break
    sleep 0.1
  done
  [ -s "$pidfile" ] && old="$(tr -dc '0-9' <"$pidfile")"
  if [ -n "$old" ] && kill -TERM "$old" 2>/dev/null; then
    echo "$(date -Is) stopping slurmd $node ($old)"
    for i in $(seq 1 100); do
      kill -0 "$old" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$old" 2>/dev/null && echo "$(date -Is) slurmd $node ($old) ignored SIGTERM: SIGKILL"
  fi
  if "$slurmd_bin" -b -f "$dir/slurm.conf" -N "$node"; then
    echo "$(date -Is) started slurmd -b $node"
  else
    echo "$(date -Is) slurmd -b $node did not start"
  fi
  rm -f "$dir/run/reboot-$node.pid"
}

if [ "${1:-}" = --restart ]; then
  restart "$2" "$3"
  exit 0
fi

# The node: SLURMD_NODENAME, else the -N of the slurmd this runs under.
node="${SLURMD_NODENAME:-}"
pid=$PPID
while [ -z "$node" ] && [ "${pid:-1}" -gt 1 ]; do
  if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = slurmd ]; then
    mapfile -d '' args <"/proc/$pid/cmdline"
    for ((i = 0; i < ${#args[@]}; i++)); do
      case "${args[i]}" in
        -N) node="${args[i + 1]:-}" ;;
        -N?*) node="${args[i]#-N}" ;;
      esac
    done
    break
  fi
  pid="$(awk '/^PPid:/ {print $2}' "/proc/$pid/status" 2>/dev/null)"
done
if [ -z "$node" ] || [ ! -d "$dir/nodes/$node" ]; then
  echo "$(date -Is) reboot-program: cannot tell which node to reboot (node ${node:-unknown})" \
    >>"$dir/log/reboot-unknown.log"
  exit 1
fi
exec >>"$dir/log/reboot-$node.log" 2>&1
boot_id="$(cat /proc/sys/kernel/random/uuid)"
echo "$boot_id" >"$dir/nodes/$node/boot_id.new"
mv -f "$dir/nodes/$node/boot_id.new" "$dir/nodes/$node/boot_id"
echo "$(date -Is) reboot of $node: boot id $boot_id"
setsid "$0" --restart "$node" $$ </dev/null >>"$dir/log/reboot-$node.log" 2>&1 &
PROG
  } >"$dir/reboot-program.sh"
  chmod 755 "$dir/reboot-program.sh"
}

# The last lines of every log, for a start that failed.
log_tails() {
  local f
  for f in "$dir"/log/*.log; do
    [ -e "$f" ] || continue
    echo "---- $f" >&2
    tail -n 15 "$f" >&2
  done
}

start() {
  [ "$(id -u)" -eq 0 ] || die "needs root (slurmd runs jobs as their users)"
  local bin
  for bin in munged slurmctld slurmd sinfo; do
    command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] ||
      die "$bin is missing: apt-get install slurm-wlm munge"
  done
  export PATH="$PATH:/usr/sbin"
  if live_pid "$dir/run/slurmctld.pid" >/dev/null; then
    die "a cluster is already running in $dir (stop it first)"
  fi
  write_config
  export SLURM_CONF="$dir/slurm.conf"
  if ! live_pid "$dir/run/munged.pid" >/dev/null; then
    # --force: munged refuses root and group-writable paths (/tmp) otherwise.
    munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
      --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" \
      --seed-file="$dir/munge/munge.seed" || { log_tails; die "munged did not start"; }
  fi
  slurmctld -f "$dir/slurm.conf" || { log_tails; die "slurmctld did not start"; }
  local n
  for n in "${nodes[@]}"; do
    slurmd -f "$dir/slurm.conf" -N "$n" || { log_tails; die "slurmd $n did not start"; }
  done
  local deadline=$((SECONDS + start_timeout)) idle=""
  while [ "$SECONDS" -lt "$deadline" ]; do
    idle="$(timeout 5 sinfo -h -N -o '%N %T' 2>/dev/null | awk '$2 == "idle"' | wc -l || true)"
    [ "$idle" = "${#nodes[@]}" ] && break
    sleep 0.2
  done
  if [ "$idle" != "${#nodes[@]}" ]; then
    echo "dev-cluster: the nodes are not idle after ${start_timeout} s:" >&2
    timeout 5 sinfo -N -o '%N %T %E' >&2 || true
    log_tails
    exit 1
  fi
  echo "dev-cluster: ${#nodes[@]} nodes idle; export SLURM_CONF=$dir/slurm.conf"
}

# PID's children, grandchildren...
descendants() {
  local child
  for child in $(pgrep -P "$1" || true); do
    echo "$child"
    descendants "$child"
  done
}

# The slurmstepd of this cluster's jobs (they hold its slurmd log open) and what they run: they
# outlive slurmd, so stopping the daemons alone would leave the jobs running.
stop_steps() {
  local stepd pids=() pid i
  for stepd in $(pgrep -x slurmstepd || true); do
    if ls -l "/proc/$stepd/fd" 2>/dev/null | grep -qF -- "-> $dir/log/"; then
      pids+=("$stepd" $(descendants "$stepd"))
    fi
  done
  [ "${#pids[@]}" -gt 0 ] || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for i in $(seq 1 50); do
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && break; done
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

stop() {
  local file pid
  # Jobs first, through Slurm while it is up (bounded), then whatever of them is left.
  if [ -s "$dir/slurm.conf" ] && live_pid "$dir/run/slurmctld.pid" >/dev/null; then
    SLURM_CONF="$dir/slurm.conf" timeout 5 scancel --full --user=root >/dev/null 2>&1 || true
  fi
  stop_steps
  # A fake reboot in progress would start its slurmd again: stop those first.
  for file in "$dir"/run/reboot-*.pid; do
    [ -e "$file" ] || continue
    if pid="$(live_pid "$file")"; then
      stop_pid "$pid" "$(basename "$file" .pid)"
    fi
    rm -f "$file"
  done
  # slurmd first (their jobs go with them), then slurmctld, munged last.
  for file in "$dir"/run/slurmd-*.pid "$dir/run/slurmctld.pid" "$dir/run/munged.pid"; do
    [ -e "$file" ] || continue
    if pid="$(live_pid "$file")"; then
      stop_pid "$pid" "$(basename "$file" .pid)"
    fi
    rm -f "$file"
  done
  # A slurmd that a fake reboot started just before it was stopped may not have written its pid
  # file yet: any slurmd left that runs on this DIR's config.
  for pid in $(pgrep -x slurmd || true); do
    if tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF -- "-f $dir/slurm.conf "; then
      stop_pid "$pid" slurmd
    fi
  done
}

stop_controller() {
  local pid
  if pid="$(live_pid "$dir/run/slurmctld.pid")"; then
    stop_pid "$pid" slurmctld
  fi
  rm -f "$dir/run/slurmctld.pid"
}

# slurmctld again on the state it saved in DIR/state (jobs, drains, reboots pending): no -c, and
# the config is not rewritten.
start_controller() {
  [ "$(id -u)" -eq 0 ] || die "needs root"
  [ -s "$dir/slurm.conf" ] || die "no cluster in $dir (start it first)"
  export PATH="$PATH:/usr/sbin" SLURM_CONF="$dir/slurm.conf"
  live_pid "$dir/run/munged.pid" >/dev/null || die "munged is not running in $dir (start it first)"
  if ! live_pid "$dir/run/slurmctld.pid" >/dev/null; then
    slurmctld -f "$dir/slurm.conf" || { log_tails; die "slurmctld did not start"; }
  fi
  local deadline=$((SECONDS + start_timeout))
  while [ "$SECONDS" -lt "$deadline" ]; do
    if timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP'; then
      echo "dev-cluster: slurmctld is UP"
      return 0
    fi
    sleep 0.2
  done
  timeout 5 scontrol ping >&2 || true
  log_tails
  die "slurmctld is not UP after ${start_timeout} s"
}

status() {
  [ -s "$dir/slurm.conf" ] || die "no cluster in $dir"
  live_pid "$dir/run/slurmctld.pid" >/dev/null || die "slurmctld is not running ($dir)"
  SLURM_CONF="$dir/slurm.conf" timeout 10 sinfo -N -o '%N %T %G %E'
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  stop-controller) stop_controller ;;
  start-controller) start_controller ;;
  *) usage ;;
esac
