#!/usr/bin/env bash
# register.sh NODE_PUBLIC_KEY [CONNECTION] — register a SuperNode's public key (OpenSSH ECDSA) with the SuperLink.
# Uses $FLWR_HOME/config.toml (connection.sh). Unregistered keys are refused at SuperNode activation.
set -euo pipefail
. "$(dirname "$0")/env.sh"
exec flwr supernode register "${1:?usage: register.sh NODE_PUBLIC_KEY [CONNECTION]}" "${2:-haarvest}"
