#!/usr/bin/env bash
# superlink.sh CERTDIR [HOST] [PORT] — SuperLink with TLS on ONE HTTP port (Fleet, Control and Runtime APIs;
# Flower 1.41) and SuperNode authentication: only nodes registered with register.sh may connect.
set -euo pipefail
. "$(dirname "$0")/env.sh"
certs=${1:?usage: superlink.sh CERTDIR [HOST] [PORT]}; host=${2:-127.0.0.1}; port=${3:-9093}
exec flower-superlink \
  --ssl-ca-certfile "$certs/ca.pem" --ssl-certfile "$certs/superlink.pem" --ssl-keyfile "$certs/superlink.key" \
  --enable-supernode-auth --disable-runtime-dependency-installation \
  --host "$host" --port "$port" ${SUPERLINK_DATABASE:+--database "$SUPERLINK_DATABASE"}
