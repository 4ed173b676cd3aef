#!/usr/bin/env bash
# Stop a stack started by deploy/stack/up.sh: agents first (SIGTERM: they drain their outbox and publish a clean
# "offline" status), then the coordinator (commits and acknowledges what it received), then mosquitto (saves its
# persistent sessions). Whatever does not stop within --timeout seconds is killed.
#
#   deploy/stack/down.sh --work /tmp/hv [--purge]
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: down.sh [--work DIR] [--timeout S] [--purge]

  --work DIR     the stack's work directory (default: ./haarvest-stack)
  --timeout S    seconds each group of processes gets to stop before SIGKILL (default 20)
  --purge        also delete the work directory (certificates, identities, ledgers, databases)
USAGE
}
WORK=./haarvest-stack TIMEOUT=20 PURGE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --work|--timeout)
      if [ $# -lt 2 ] || [ -z "$2" ]; then usage >&2; echo "down.sh: error: $1 needs a value" >&2; exit 2; fi
      if [ "$1" = --work ]; then WORK=$2; else TIMEOUT=$2; fi
      shift 2 ;;
    --purge) PURGE=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; echo "down.sh: error: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ "$TIMEOUT" =~ ^[0-9]+$ ]] || { echo "down.sh: error: --timeout must be whole seconds" >&2; exit 2; }
[ -f "$WORK/stack.env" ] || { echo "down.sh: error: no stack in $WORK (no stack.env)" >&2; exit 1; }
MOSQUITTO_PID='' COORDINATOR_PID='' AGENT_PIDS=''
# shellcheck disable=SC1091
. "$WORK/stack.env"

ours() {  # the pid is alive and still one of the stack's programs (not a recycled pid)
  local pid=$1 name=$2
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$name"
}
stop_group() {  # stop_group NAME PID...
  local name=$1 pid alive=() deadline; shift
  for pid in "$@"; do
    if ours "$pid" "$name"; then kill -TERM "$pid" 2>/dev/null && alive+=("$pid"); fi
  done
  [ ${#alive[@]} -gt 0 ] || return 0
  deadline=$((SECONDS + TIMEOUT))
  for pid in "${alive[@]}"; do
    while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "down.sh: $name (pid $pid) did not stop in ${TIMEOUT}s: killing it" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  echo "down.sh: stopped $name (${alive[*]})" >&2
}
read -r -a agent_pids <<<"$AGENT_PIDS"
stop_group haarvest ${agent_pids[@]+"${agent_pids[@]}"}
stop_group haarvest "$COORDINATOR_PID"
stop_group mosquitto "$MOSQUITTO_PID"
if [ "$PURGE" -eq 1 ]; then
  rm -rf -- "$WORK"
  echo "down.sh: removed $WORK" >&2
fi
