#!/usr/bin/env bash
# certs.sh DIR [HOST...] — a private CA, the SuperLink's TLS certificate (SANs: the given hosts, default 127.0.0.1
# and localhost) and one ECDSA P-384 OpenSSH key pair per SuperNode name in $NODES (default "node1 node2").
set -euo pipefail
dir=${1:?usage: certs.sh DIR [HOST...]}; shift || true
hosts=("${@:-127.0.0.1}"); [ $# -eq 0 ] && hosts=(127.0.0.1 localhost)
mkdir -p "$dir" && cd "$dir" && umask 077
san=""
for h in "${hosts[@]}"; do
  if [[ $h =~ ^[0-9.]+$ || $h == *:* ]]; then san+="IP:$h,"; else san+="DNS:$h,"; fi
done
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out ca.pem -days 825 \
  -subj "/CN=haarvest-flower-ca" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout superlink.key -out superlink.csr \
  -subj "/CN=${hosts[0]}" 2>/dev/null
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "${san%,}" > superlink.ext
openssl x509 -req -in superlink.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out superlink.pem -days 825 \
  -extfile superlink.ext 2>/dev/null
rm -f superlink.csr superlink.ext
for n in ${NODES:-node1 node2}; do
  [ -f "$n.key" ] || ssh-keygen -q -t ecdsa -b 384 -N "" -C "haarvest-$n" -f "$n.key"
done
echo "CA: $dir/ca.pem  SuperLink: $dir/superlink.pem  node keys: $(ls "$dir"/*.key.pub | tr '\n' ' ')"
