#!/usr/bin/env bash
# A complete haarvest deployment on one host: mosquitto with the shipped TLS config and ACL (certificates from
# `haarvest pki`), the coordinator, and N edge agents — each with its own client certificate, identity and state
# directory — all under one work directory. Stop it with deploy/stack/down.sh --work DIR.
#
#   deploy/stack/up.sh --work /tmp/hv --agents 3
#   . /tmp/hv/stack.env            # HAARVEST, COORD_CONF, DB, KEY, HTTP_PORT, ROUND_PARAMS, ...
#   $HAARVEST coordinator rounds open --config "$COORD_CONF" \
#       --id r1 --epsilon 3 --params @"$ROUND_PARAMS"
#   $HAARVEST coordinator estimate r1 --config "$COORD_CONF"
#
# Layout of the work directory (re-running up.sh reuses certificates, keys, identities and databases):
#   pki/            CA, broker certificate, clients/<cn>.{crt,key} (coordinator, dev-1 … dev-N)
#   mosquitto/      mosquitto.conf (deploy/mosquitto/haarvest.conf with local paths), haarvest.acl, data, log
#   coordinator/    coordinator.toml (its run config), coordinator.key (round signing), coordinator.pub,
#                   coordinator.db, devices.json, log
#   agents/dev-i/   agent.toml, state/ (ledger, outbox, signing key, HMAC secret), enrollment.json, log
#   round.json      round parameters matching the agents' streams; stack.env: ports, paths, pids
#
# Every client connects over TLS with its client certificate (use_identity_as_username + the shipped ACL): the
# devices, and the coordinator (CN "coordinator") — `coordinator run` and `coordinator rounds` read the same
# coordinator.toml. The broker has no anonymous listener.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/../.." && pwd)

usage() {
  cat <<'EOF'
usage: up.sh [options]

  --work DIR            work directory (default: ./haarvest-stack)
  --agents N            number of edge agents (default 3)
  --tls-port P          broker TLS port for the devices (default 8883)
  --http-port P         coordinator HTTP API and dashboard (default 8080)
  --bind ADDR           address of the devices' TLS listener (default 127.0.0.1)
  --http-bind ADDR      address of the coordinator's API and dashboard (default 127.0.0.1; it needs the token
                        in coordinator/api-token for everything but /healthz)
  --dynsec-plugin PATH  mosquitto's dynamic-security plugin (flood quarantine; default: found under /usr/lib)
  --broker-host HOST    name the agents connect to (default: the --bind address, 127.0.0.1 for 0.0.0.0;
                        it is also put in the broker certificate)
  --haarvest PATH       the haarvest command (default: haarvest on PATH, else <repo>/.venv/bin/haarvest)
  --mosquitto PATH      the mosquitto binary (default: on PATH or /usr/sbin/mosquitto)
  --epsilon E           ε per stream and report (default 1.0)
  --prepare-only        write certificates, configs and identities, enroll the devices; start nothing
  --timeout S           seconds to wait for each service (default 60)
  -h, --help            this help
EOF
}
die() { echo "up.sh: error: $*" >&2; exit 1; }
say() { echo "up.sh: $*" >&2; }

WORK=./haarvest-stack N=3 TLS_PORT=8883 HTTP_PORT=8080 BIND=127.0.0.1 BROKER_HOST=''
HAARVEST='' MOSQUITTO='' EPSILON=1.0 PREPARE_ONLY=0 TIMEOUT=60 DYNSEC='' HTTP_BIND=127.0.0.1
while [ $# -gt 0 ]; do
  case "$1" in
    --work|--agents|--tls-port|--http-port|--bind|--http-bind|--broker-host|--haarvest|--mosquitto|--epsilon|--timeout|--dynsec-plugin)
      if [ $# -lt 2 ] || [ -z "$2" ]; then usage >&2; echo "up.sh: error: $1 needs a value" >&2; exit 2; fi
      case "$1" in
        --work) WORK=$2 ;; --agents) N=$2 ;; --tls-port) TLS_PORT=$2 ;;
        --http-port) HTTP_PORT=$2 ;; --bind) BIND=$2 ;; --http-bind) HTTP_BIND=$2 ;; --broker-host) BROKER_HOST=$2 ;;
        --dynsec-plugin) DYNSEC=$2 ;;
        --haarvest) HAARVEST=$2 ;; --mosquitto) MOSQUITTO=$2 ;; --epsilon) EPSILON=$2 ;; --timeout) TIMEOUT=$2 ;;
      esac
      shift 2 ;;
    --prepare-only) PREPARE_ONLY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; echo "up.sh: error: unknown argument $1" >&2; exit 2 ;;
  esac
done
if ! [[ "$N" =~ ^[0-9]+$ ]] || [ "$N" -lt 1 ] || [ "$N" -gt 999 ]; then die "--agents must be 1..999"; fi
for p in "$TLS_PORT" "$HTTP_PORT"; do
  if ! [[ "$p" =~ ^[0-9]+$ ]] || [ "$p" -lt 1 ] || [ "$p" -gt 65535 ]; then die "port '$p' is not in 1..65535"; fi
done
[[ "$BIND" =~ ^[A-Za-z0-9_.:-]+$ ]] || die "--bind '$BIND' is not an address"
[[ "$HTTP_BIND" =~ ^[A-Za-z0-9_.:-]+$ ]] || die "--http-bind '$HTTP_BIND' is not an address"
if [ -z "$DYNSEC" ]; then
  for f in /usr/lib/*/mosquitto_dynamic_security.so /usr/lib/mosquitto_dynamic_security.so; do
    if [ -f "$f" ]; then DYNSEC=$f; break; fi
  done
  [ -n "$DYNSEC" ] || die "mosquitto's dynamic-security plugin not found (apt-get install mosquitto; or --dynsec-plugin PATH)"
fi
[[ "$EPSILON" =~ ^[0-9]*\.?[0-9]+$ ]] || die "--epsilon must be a positive number"
connect_host=$BIND                 # where local clients reach the TLS listener
[ "$BIND" != 0.0.0.0 ] || connect_host=127.0.0.1
http_connect=$HTTP_BIND            # ... and the dashboard
[ "$HTTP_BIND" != 0.0.0.0 ] || http_connect=127.0.0.1
BROKER_HOST=${BROKER_HOST:-$connect_host}
[[ "$BROKER_HOST" =~ ^[A-Za-z0-9_.:-]+$ ]] || die "--broker-host '$BROKER_HOST' is not a host name or address"

if [ -z "$HAARVEST" ]; then
  if command -v haarvest >/dev/null; then HAARVEST=$(command -v haarvest)
  elif [ -x "$REPO_DIR/.venv/bin/haarvest" ]; then HAARVEST=$REPO_DIR/.venv/bin/haarvest
  else die "haarvest not found: pass --haarvest PATH (or run make venv)"; fi
fi
[ -x "$HAARVEST" ] || die "$HAARVEST is not executable"
if [ "$PREPARE_ONLY" -eq 0 ]; then
  MOSQUITTO=${MOSQUITTO:-$(command -v mosquitto || echo /usr/sbin/mosquitto)}
  [ -x "$MOSQUITTO" ] || die "mosquitto not found (apt-get install mosquitto) — or pass --mosquitto PATH"
fi

mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
PKI=$WORK/pki BROKER_DIR=$WORK/mosquitto COORD_DIR=$WORK/coordinator
DB=$COORD_DIR/coordinator.db KEY=$COORD_DIR/coordinator.key ROUND_PARAMS=$WORK/round.json
COORD_CONF=$COORD_DIR/coordinator.toml
if [ -f "$WORK/stack.env" ] && [ "$PREPARE_ONLY" -eq 0 ]; then
  # shellcheck disable=SC1091
  old_pids=$(. "$WORK/stack.env"; echo "${MOSQUITTO_PID:-} ${COORDINATOR_PID:-} ${AGENT_PIDS:-}")
  for pid in $old_pids; do
    if kill -0 "$pid" 2>/dev/null; then die "the stack in $WORK is running (pid $pid): run down.sh --work $WORK first"; fi
  done
fi
umask 077
mkdir -p "$PKI" "$BROKER_DIR/data" "$COORD_DIR" "$WORK/agents"

# --- keys and certificates (kept across runs) ------------------------------------------------------------------
[ -f "$PKI/ca.key" ] || "$HAARVEST" pki init-ca --dir "$PKI" --name "haarvest stack CA" >/dev/null
hosts=(--host localhost --host 127.0.0.1)
[ "$BROKER_HOST" = localhost ] || [ "$BROKER_HOST" = 127.0.0.1 ] || hosts+=(--host "$BROKER_HOST")
[ "$connect_host" = 127.0.0.1 ] || [ "$connect_host" = "$BROKER_HOST" ] || hosts+=(--host "$connect_host")
[ -f "$PKI/broker.crt" ] || "$HAARVEST" pki broker --dir "$PKI" "${hosts[@]}" >/dev/null
DEVICES=()
for i in $(seq 1 "$N"); do DEVICES+=("dev-$i"); done
for cn in coordinator coordinator-rounds "${DEVICES[@]}"; do
  [ -f "$PKI/clients/$cn.crt" ] || "$HAARVEST" pki client --dir "$PKI" --id "$cn" >/dev/null
done
"$HAARVEST" pki coordinator-key --path "$KEY" |
  sed -n 's/.*"coordinator_public_key": *"\([^"]*\)".*/\1/p' >"$COORD_DIR/coordinator.pub"
[ -s "$COORD_DIR/coordinator.pub" ] || die "could not create the coordinator key"

# --- broker: the shipped config with this stack's paths --------------------------------------------------------
{
  echo "# generated by deploy/stack/up.sh from deploy/mosquitto/haarvest.conf — do not edit"
  if [ "$(id -u)" -eq 0 ]; then
    echo "# running as root: keep mosquitto from switching to the mosquitto user (it could not read $WORK)"
    echo "user root"
  fi
  sed -e "s|/etc/haarvest/pki|$PKI|g" \
      -e "s|/etc/mosquitto/haarvest.acl|$BROKER_DIR/haarvest.acl|" \
      -e "s|/var/lib/mosquitto/|$BROKER_DIR/data/|" \
      -e "s|^plugin /usr/lib/.*mosquitto_dynamic_security.so|plugin $DYNSEC|" \
      -e "s|^listener 8883.*|listener $TLS_PORT $BIND|" \
      "$REPO_DIR/deploy/mosquitto/haarvest.conf"
  cat <<EOF

# --- stack only -------------------------------------------------------------------------------------------------
persistence true
persistence_location $BROKER_DIR/data/
log_dest file $BROKER_DIR/mosquitto.log
log_type error
log_type warning
log_type notice
EOF
} >"$BROKER_DIR/mosquitto.conf"
cp "$REPO_DIR/deploy/mosquitto/haarvest.acl" "$BROKER_DIR/haarvest.acl"
mkdir -p "$BROKER_DIR/data"
# the plugin's state (it records quarantined devices there): start from the shipped one, keep it across restarts
[ -f "$BROKER_DIR/data/dynamic-security.json" ] ||
  cp "$REPO_DIR/deploy/mosquitto/dynamic-security.json" "$BROKER_DIR/data/dynamic-security.json"

# --- coordinator: its run config (TLS with its own client certificate) -----------------------------------------
cat >"$COORD_CONF" <<EOF
# generated by deploy/stack/up.sh — \`haarvest coordinator run|rounds|estimate --config $COORD_CONF\`
db = "$DB"
key = "$KEY"
mqtt_host = "$connect_host"
mqtt_port = $TLS_PORT
mqtt_ca = "$PKI/ca.crt"
mqtt_cert = "$PKI/clients/coordinator.crt"
mqtt_key = "$PKI/clients/coordinator.key"
rounds_cert = "$PKI/clients/coordinator-rounds.crt"
rounds_key = "$PKI/clients/coordinator-rounds.key"
http_host = "$HTTP_BIND"
http_port = $HTTP_PORT
api_tokens = "$COORD_DIR/api-token"
EOF
if [ ! -s "$COORD_DIR/api-token" ]; then
  (umask 077; head -c 24 /dev/urandom | base64 | tr '+/' '-_' >"$COORD_DIR/api-token")
fi

# --- agents: config, identity ---------------------------------------------------------------------------------
for dev in "${DEVICES[@]}"; do
  d=$WORK/agents/$dev
  mkdir -p "$d/state"
  cat >"$d/agent.toml" <<EOF
# generated by deploy/stack/up.sh (same dimensions as deploy/pi/agent.toml.example, without temp)
device_id = "$dev"
state_dir = "$d/state"
coordinator_public_key_file = "$COORD_DIR/coordinator.pub"
schedule = "rounds"
sample_interval_s = 5

[privacy]
epsilon = $EPSILON
max_round_epsilon = $(awk -v e="$EPSILON" 'BEGIN { print 3 * e }')

[ledger]
total_cap = 200.0
stream_cap = 50.0

[[dimensions]]
name = "cpu"
kind = "numeric"
lo = 0.0
hi = 100.0
source = "cpu_percent"

[[dimensions]]
name = "mem"
kind = "numeric"
lo = 0.0
hi = 100.0
source = "mem_percent"

[[dimensions]]
name = "load"
kind = "numeric"
lo = 0.0
hi = 8.0
source = "load1"

[[streams]]
name = "cpu"
dimensions = ["cpu"]
mechanism = "hybrid"

[[streams]]
name = "mem"
dimensions = ["mem"]
mechanism = "hybrid"

[[streams]]
name = "load"
dimensions = ["load"]
mechanism = "hybrid"

[[sources]]
kind = "system"

[mqtt]
host = "$BROKER_HOST"
port = $TLS_PORT
tls = true
ca_file = "$PKI/ca.crt"
cert_file = "$PKI/clients/$dev.crt"
key_file = "$PKI/clients/$dev.key"
reconnect_min_s = 1
reconnect_max_s = 5
EOF
  "$HAARVEST" agent enroll --config "$d/agent.toml" >"$d/enrollment.json"
done

# --- coordinator: device registry, round parameters ------------------------------------------------------------
{
  echo "["
  sep=""
  for dev in "${DEVICES[@]}"; do printf '%s' "$sep"; cat "$WORK/agents/$dev/enrollment.json"; sep=","; done
  echo "]"
} >"$COORD_DIR/devices.json"
"$HAARVEST" coordinator enroll-device --db "$DB" --json "$COORD_DIR/devices.json" >/dev/null
cat >"$ROUND_PARAMS" <<EOF
{"streams": {
  "cpu":  {"kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": $EPSILON}, "dims": ["cpu"], "bounds": [[0, 100]]},
  "mem":  {"kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": $EPSILON}, "dims": ["mem"], "bounds": [[0, 100]]},
  "load": {"kind": "numeric", "mechanism": "hybrid", "params": {"epsilon": $EPSILON}, "dims": ["load"], "bounds": [[0, 8]]}
}}
EOF
ROUND_EPSILON=$(awk -v e="$EPSILON" 'BEGIN { print 3 * e }')

write_env() {
  cat >"$WORK/stack.env" <<EOF
# generated by deploy/stack/up.sh — source it: . $WORK/stack.env
HAARVEST='$HAARVEST'
WORK='$WORK'
DB='$DB'
KEY='$KEY'
COORD_CONF='$COORD_CONF'
MQTT_HOST=$connect_host
TLS_PORT=$TLS_PORT
HTTP_PORT=$HTTP_PORT
HTTP_URL='http://$http_connect:$HTTP_PORT'
API_TOKEN_FILE='$COORD_DIR/api-token'
ROUND_PARAMS='$ROUND_PARAMS'
ROUND_EPSILON=$ROUND_EPSILON
AGENTS='${DEVICES[*]}'
MOSQUITTO_PID=${MOSQUITTO_PID:-}
COORDINATOR_PID=${COORDINATOR_PID:-}
AGENT_PIDS='${AGENT_PIDS:-}'
EOF
}
if [ "$PREPARE_ONLY" -eq 1 ]; then
  write_env
  say "prepared $WORK (nothing started)"
  exit 0
fi

# --- start ----------------------------------------------------------------------------------------------------
wait_for() {  # wait_for WHAT PID COMMAND...: until COMMAND succeeds, PID dies or the timeout passes
  local what=$1 pid=$2 deadline=$((SECONDS + TIMEOUT)); shift 2
  until "$@" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || die "$what exited during start-up (see its log in $WORK)"
    [ "$SECONDS" -lt "$deadline" ] || die "$what not ready after ${TIMEOUT}s (see its log in $WORK)"
    sleep 0.2
  done
}
port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }
log_has() { grep -q "$2" "$1"; }
AGENT_PIDS='' pids=()

"$MOSQUITTO" -c "$BROKER_DIR/mosquitto.conf" >>"$BROKER_DIR/mosquitto.out" 2>&1 </dev/null &
MOSQUITTO_PID=$!
write_env
wait_for mosquitto "$MOSQUITTO_PID" port_open "$connect_host" "$TLS_PORT"
say "mosquitto (pid $MOSQUITTO_PID): TLS with client certificates on $BIND:$TLS_PORT"

: >"$COORD_DIR/coordinator.log"
"$HAARVEST" coordinator run --config "$COORD_CONF" >>"$COORD_DIR/coordinator.log" 2>&1 </dev/null &
COORDINATOR_PID=$!
write_env
wait_for coordinator "$COORDINATOR_PID" log_has "$COORD_DIR/coordinator.log" '"status": "ready"'
say "coordinator (pid $COORDINATOR_PID): dashboard http://$http_connect:$HTTP_PORT/?token=<$COORD_DIR/api-token>"

for dev in "${DEVICES[@]}"; do
  d=$WORK/agents/$dev
  : >"$d/agent.log"
  "$HAARVEST" agent run --config "$d/agent.toml" >>"$d/agent.log" 2>&1 </dev/null &
  pids+=("$!")
  AGENT_PIDS="${pids[*]}"
done
write_env
for i in "${!DEVICES[@]}"; do
  wait_for "agent ${DEVICES[$i]}" "${pids[$i]}" log_has "$WORK/agents/${DEVICES[$i]}/agent.log" '"event":"mqtt_connected"'
done
say "$N agents connected over TLS (pids $AGENT_PIDS)"
cat >&2 <<EOF
up.sh: the stack is up. Open a round, read its estimates, stop everything:
  . $WORK/stack.env
  \$HAARVEST coordinator rounds open --config "\$COORD_CONF" --id r1 --epsilon \$ROUND_EPSILON --params @"\$ROUND_PARAMS"
  \$HAARVEST coordinator estimate r1 --config "\$COORD_CONF"   # or \$HTTP_URL/?token=\$(cat \$API_TOKEN_FILE)
  $SCRIPT_DIR/down.sh --work $WORK
EOF
