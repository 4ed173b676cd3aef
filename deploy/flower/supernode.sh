#!/usr/bin/env bash
# supernode.sh CERTDIR NODE_KEY SUPERLINK AGENT_TOML[,AGENT_TOML...] [RUNTIME_PORT] — a SuperNode hosting the
# haarvest device(s) of the given agent configs (the same TOML, state, ledger and identity as the MQTT agent).
set -euo pipefail
. "$(dirname "$0")/env.sh"
certs=${1:?usage: supernode.sh CERTDIR NODE_KEY SUPERLINK AGENT_TOML [RUNTIME_PORT]}; key=${2:?}; link=${3:?}
agents=${4:?}; port=${5:-9094}
exec flower-supernode --superlink "$link" --root-certificates "$certs/ca.pem" \
  --auth-supernode-private-key "$key" --port "$port" --node-config "agent-config='$agents'" \
  ${SUPERNODE_MAX_WAIT:+--max-wait-time "$SUPERNODE_MAX_WAIT"} ${SUPERNODE_MAX_RETRIES:+--max-retries "$SUPERNODE_MAX_RETRIES"}
