#!/usr/bin/env bash
# run.sh PARAMS_JSON DB KEY_FILE DEVICES_JSON OUT_JSON [key=value ...] — submit the haarvest rounds (ServerApp
# coordinator.flower_app:app) to the SuperLink of $FLWR_HOME/config.toml and stream its logs until it ends.
set -euo pipefail
. "$(dirname "$0")/env.sh"
params=${1:?usage: run.sh PARAMS_JSON DB KEY_FILE DEVICES_JSON OUT_JSON [key=value ...]}; db=${2:?}; key=${3:?}
devices=${4:?}; out=${5:?}; shift 5
exec flwr run "${FLOWER_APP:-$(dirname "$0")/app}" "${CONNECTION:-haarvest}" --stream \
  --run-config "params-file='$params' db='$db' key-file='$key' devices-file='$devices' out='$out' $*"
