#!/usr/bin/env bash
# connection.sh FLWR_HOME CERTDIR ADDRESS [NAME] — write the `flwr` CLI's SuperLink connection (TLS, pinned CA).
set -euo pipefail
home=${1:?usage: connection.sh FLWR_HOME CERTDIR ADDRESS [NAME]}; certs=$(cd "${2:?}" && pwd); addr=${3:?}
name=${4:-haarvest}
mkdir -p "$home"
cat > "$home/config.toml" <<TOML
[superlink]
default = "$name"

[superlink.$name]
address = "$addr"
root-certificates = "$certs/ca.pem"
TOML
