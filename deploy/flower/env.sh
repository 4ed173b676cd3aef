# Sourced by the scripts: offline Flower, the haarvest venv first on PATH (SuperLink/SuperNode spawn flower-superexec).
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
HAARVEST_VENV="${HAARVEST_VENV:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.venv}"
export PATH="$HAARVEST_VENV/bin:$PATH"
