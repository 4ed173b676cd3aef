#!/usr/bin/env bash
# Install the haarvest edge agent on a Raspberry Pi (Raspberry Pi OS 64-bit, Debian bookworm) — idempotent.
#
#   sudo deploy/pi/install.sh --device-id pi-0001 --broker broker.lan \
#        --ca ca.crt --cert pi-0001.crt --key pi-0001.key --coordinator-pubkey coordinator.pub  [PACKAGE]
#
# PACKAGE is a haarvest wheel or source directory (default: the repository this script is in). The script
#   * creates the system user `haarvest` (no login, no home besides its state directory),
#   * creates /opt/haarvest/venv and pip-installs PACKAGE into it,
#   * creates the state directory /var/lib/haarvest (0700, owned by haarvest),
#   * writes /etc/haarvest/agent.toml from deploy/pi/agent.toml.example unless one exists (--force-config),
#   * places the TLS files (ca.crt, device.crt, device.key.pem) and the coordinator's public key in /etc/haarvest,
#   * runs `haarvest agent enroll` as the haarvest user (signing key + HMAC secret, 0600) and saves the
#     enrolment JSON to /etc/haarvest/enrollment.json — give it to the coordinator (`enroll-device --json`),
#   * installs deploy/systemd/haarvest-agent.service and enables it (--start also starts it now),
#   * ends with `haarvest agent check-config`.
# Running it again keeps the identity, the configuration and the ledger; it upgrades the package.
#
# Tests and image builds: --root DIR installs everything under DIR (the generated config and unit then refer
# to paths inside DIR), --no-useradd skips user creation and chown, --no-systemd skips systemctl.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/../.." && pwd)

usage() {
  cat <<'EOF'
usage: install.sh [options] [PACKAGE]

  PACKAGE                     haarvest wheel (.whl) or source directory (default: this repository)
  --device-id ID              device id = MQTT client id = certificate CN (default: existing config, else hostname)
  --broker HOST               MQTT broker host name or address (default: broker.example; edit the config later)
  --port N                    MQTT TLS port (default 8883)
  --ca FILE                   CA certificate (`haarvest pki init-ca`)          -> /etc/haarvest/ca.crt
  --cert FILE                 device certificate (`haarvest pki client --id ID`) -> /etc/haarvest/device.crt
  --key FILE                  device TLS private key                              -> /etc/haarvest/device.key.pem
  --coordinator-pubkey K      coordinator round-signing public key (base64, or a file holding it)
  --force-config              replace an existing agent.toml (the old one is kept as agent.toml.bak)
  --venv DIR                  virtual environment to use or create (default: ROOT/opt/haarvest/venv)
  --system-site-packages      create the venv with access to apt's Python packages
  --pip-option OPT            extra pip option, repeatable (e.g. --pip-option=--find-links=/media/wheels)
  --skip-pip                  do not install PACKAGE (the venv must already provide `haarvest`)
  --no-enroll                 do not create the device identity now
  --signature ALG             report key of a new identity: ed25519 (default) or hmac-sha256 (then the
                              enrolment JSON holds a secret: it is written 0600, give it to the coordinator privately)
  --root DIR                  install under DIR instead of / (implies --no-systemd unless DIR is /)
  --no-useradd                do not create the haarvest user and do not chown (tests, containers)
  --no-systemd                do not run systemctl (the unit file is still installed)
  --start                     start the agent now (default: enable only; start after enrolling the device)
  -h, --help                  this help
EOF
}

die() { echo "install.sh: error: $*" >&2; exit 1; }
say() { echo "install.sh: $*" >&2; }

ROOT=/ VENV='' PACKAGE='' DEVICE_ID='' BROKER='' PORT='' CA='' CERT='' KEY='' COORD_PUB=
FORCE_CONFIG=0 SYSTEM_SITE=0 SKIP_PIP=0 ENROLL=1 USERADD=1 SYSTEMD=1 START=0 SIGNATURE=ed25519
PIP_OPTS=()

need_arg() {
  if [ $# -lt 2 ] || [ -z "$2" ]; then usage >&2; echo "install.sh: error: $1 needs a value" >&2; exit 2; fi
}
while [ $# -gt 0 ]; do
  case "$1" in
    --root) need_arg "$@"; ROOT=$2; shift 2 ;;
    --venv) need_arg "$@"; VENV=$2; shift 2 ;;
    --device-id) need_arg "$@"; DEVICE_ID=$2; shift 2 ;;
    --broker) need_arg "$@"; BROKER=$2; shift 2 ;;
    --port) need_arg "$@"; PORT=$2; shift 2 ;;
    --ca) need_arg "$@"; CA=$2; shift 2 ;;
    --cert) need_arg "$@"; CERT=$2; shift 2 ;;
    --key) need_arg "$@"; KEY=$2; shift 2 ;;
    --coordinator-pubkey) need_arg "$@"; COORD_PUB=$2; shift 2 ;;
    --signature) need_arg "$@"; SIGNATURE=$2; shift 2 ;;
    --pip-option) need_arg "$@"; PIP_OPTS+=("$2"); shift 2 ;;
    --pip-option=*) PIP_OPTS+=("${1#--pip-option=}"); shift ;;
    --force-config) FORCE_CONFIG=1; shift ;;
    --system-site-packages) SYSTEM_SITE=1; shift ;;
    --skip-pip) SKIP_PIP=1; shift ;;
    --no-enroll) ENROLL=0; shift ;;
    --no-useradd) USERADD=0; shift ;;
    --no-systemd) SYSTEMD=0; shift ;;
    --start) START=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    -*) usage >&2; echo "install.sh: error: unknown option $1" >&2; exit 2 ;;
    *) [ -z "$PACKAGE" ] || die "more than one PACKAGE given"; PACKAGE=$1; shift ;;
  esac
done
if [ $# -gt 0 ]; then
  if [ -n "$PACKAGE" ] || [ $# -ne 1 ]; then die "more than one PACKAGE given"; fi
  PACKAGE=$1
fi

# --- paths ----------------------------------------------------------------------------------------------------
mkdir -p "$ROOT"
ROOT=$(cd "$ROOT" && pwd)
P=${ROOT%/}                                   # prefix: "" for /
ETC=$P/etc/haarvest
STATE=$P/var/lib/haarvest
OPT=$P/opt/haarvest
VENV=${VENV:-$OPT/venv}
CONF=$ETC/agent.toml
UNIT_DIR=$P/etc/systemd/system
UNIT=haarvest-agent.service
TEMPLATE=$SCRIPT_DIR/agent.toml.example
UNIT_SRC=$REPO_DIR/deploy/systemd/$UNIT
[ -f "$TEMPLATE" ] || die "missing $TEMPLATE"
[ -f "$UNIT_SRC" ] || die "missing $UNIT_SRC"
[ "$ROOT" = / ] || SYSTEMD=0
PACKAGE=${PACKAGE:-$REPO_DIR}
if [ "$SKIP_PIP" -eq 0 ]; then
  [ -e "$PACKAGE" ] || die "package $PACKAGE does not exist (a wheel or a source directory)"
  PACKAGE=$(cd "$(dirname "$PACKAGE")" && pwd)/$(basename "$PACKAGE")
fi
if [ "$USERADD" -eq 1 ] && [ "$(id -u)" -ne 0 ]; then
  die "run as root (sudo), or pass --no-useradd (and --root DIR) for an unprivileged install"
fi
if [ -n "$DEVICE_ID" ] && ! [[ "$DEVICE_ID" =~ ^[A-Za-z0-9_.:-]{1,64}$ ]]; then
  die "device id '$DEVICE_ID' must match [A-Za-z0-9_.:-]{1,64}"
fi
if [ -n "$BROKER" ] && ! [[ "$BROKER" =~ ^[A-Za-z0-9_.:-]+$ ]]; then
  die "broker '$BROKER' is not a host name or address"
fi
if [ -n "$PORT" ] && ! { [[ "$PORT" =~ ^[0-9]+$ ]] && [ "$PORT" -ge 1 ] && [ "$PORT" -le 65535 ]; }; then
  die "port '$PORT' is not in 1..65535"
fi
for f in "$CA" "$CERT" "$KEY"; do
  [ -z "$f" ] || [ -r "$f" ] || die "cannot read $f"
done
if { [ -n "$CERT" ] && [ -z "$KEY" ]; } || { [ -z "$CERT" ] && [ -n "$KEY" ]; }; then
  die "give --cert and --key together"
fi

umask 022
as_agent() {  # run a command as the haarvest user (or as ourselves without --useradd)
  if [ "$USERADD" -eq 1 ]; then (cd / && runuser -u haarvest -- "$@"); else "$@"; fi
}

# --- user -----------------------------------------------------------------------------------------------------
if [ "$USERADD" -eq 1 ]; then
  if ! id -u haarvest >/dev/null 2>&1; then
    say "creating system user haarvest"
    useradd --system --user-group --home-dir /var/lib/haarvest --no-create-home \
            --shell /usr/sbin/nologin --comment "haarvest edge agent" haarvest
  fi
fi
own() {  # own OWNER:GROUP MODE PATH...
  local owner=$1 mode=$2; shift 2
  chmod "$mode" "$@"
  if [ "$USERADD" -eq 1 ]; then chown "$owner" "$@"; fi
}

# --- directories ----------------------------------------------------------------------------------------------
mkdir -p "$ETC" "$STATE" "$OPT" "$UNIT_DIR"
own root:haarvest 0750 "$ETC"
own haarvest:haarvest 0700 "$STATE"

# --- virtual environment and package ---------------------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  command -v python3 >/dev/null || die "python3 not found (apt-get install python3)"
  if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    if [ "$ROOT" = / ] && command -v apt-get >/dev/null && [ "$(id -u)" -eq 0 ]; then
      say "installing python3-venv"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    else
      die "python3 cannot create virtual environments (apt-get install python3-venv)"
    fi
  fi
  say "creating $VENV"
  venv_opts=()
  [ "$SYSTEM_SITE" -eq 0 ] || venv_opts+=(--system-site-packages)
  python3 -m venv "${venv_opts[@]}" "$VENV"
fi
if [ "$SKIP_PIP" -eq 0 ]; then
  say "installing $PACKAGE into $VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check ${PIP_OPTS[@]+"${PIP_OPTS[@]}"} "$PACKAGE"
fi
VENV=$(cd "$VENV" && pwd)
HAARVEST=$VENV/bin/haarvest
[ -x "$HAARVEST" ] || die "$HAARVEST is missing: the package did not install a console script"
mkdir -p "$OPT/deploy"
[ ! -f "$REPO_DIR/deploy/README.md" ] || cp "$REPO_DIR/deploy/README.md" "$OPT/deploy/README.md"

# --- TLS files and the coordinator key ------------------------------------------------------------------------
if [ -n "$CA" ]; then install -m 0644 "$CA" "$ETC/ca.crt"; fi
if [ -n "$CERT" ]; then
  install -m 0644 "$CERT" "$ETC/device.crt"
  install -m 0600 "$KEY" "$ETC/device.key.pem"
  own haarvest:haarvest 0600 "$ETC/device.key.pem"
fi
if [ -n "$COORD_PUB" ]; then
  if [ -f "$COORD_PUB" ]; then key_text=$(tr -d ' \n\r\t' <"$COORD_PUB"); else key_text=$COORD_PUB; fi
  [[ "$key_text" =~ ^[A-Za-z0-9+/]{43}=$ ]] || die "coordinator public key must be 32 bytes in base64 (44 characters)"
  printf '%s\n' "$key_text" >"$ETC/coordinator.pub"
  chmod 0644 "$ETC/coordinator.pub"
fi

# --- configuration --------------------------------------------------------------------------------------------
thermal_zone_present() {
  local t
  for t in /sys/class/thermal/thermal_zone*/temp; do
    [ -r "$t" ] && cat "$t" >/dev/null 2>&1 && return 0
  done
  return 1
}
render_config() {  # template -> stdout, with the device id, broker and path prefix filled in
  local device=$1 host=$2 port=$3 drop_temp=$4
  # drop the temp dimension and stream on hardware without a thermal zone (the record would be invalid)
  awk -v drop="$drop_temp" '
    function flush() { if (buf != "" && !(drop == 1 && buf ~ /\nname = "temp"\n/)) printf "%s", buf; buf = "" }
    /^\[/ { flush() }
    { buf = buf $0 "\n" }
    END { flush() }' "$TEMPLATE" |
  sed -e "s|^device_id = \"[^\"]*\"|device_id = \"$device\"|" \
      -e "s|^host = \"[^\"]*\"|host = \"$host\"|" \
      -e "s|^port = [0-9]*|port = $port|" \
      -e "s|\"/etc/haarvest/|\"$ETC/|g" \
      -e "s|\"/var/lib/haarvest\"|\"$STATE\"|g"
}
if [ -f "$CONF" ] && [ "$FORCE_CONFIG" -eq 0 ]; then
  say "keeping the existing $CONF (--force-config replaces it)"
  existing_id=$(sed -n 's/^device_id = "\([^"]*\)".*/\1/p' "$CONF" | head -n 1)
  if [ -n "$DEVICE_ID" ] && [ "$DEVICE_ID" != "$existing_id" ]; then
    die "$CONF is for device '$existing_id', not '$DEVICE_ID' (use --force-config to replace it)"
  fi
  DEVICE_ID=$existing_id
else
  if [ -z "$DEVICE_ID" ]; then
    DEVICE_ID=$(hostname | tr -c 'A-Za-z0-9_.:\n-' '-' | cut -c1-64)
  fi
  drop_temp=0
  if ! thermal_zone_present; then
    say "no thermal zone on this machine: the temp dimension is left out of the configuration"
    drop_temp=1
  fi
  [ ! -f "$CONF" ] || cp -p "$CONF" "$CONF.bak"
  render_config "$DEVICE_ID" "${BROKER:-broker.example}" "${PORT:-8883}" "$drop_temp" >"$CONF.tmp"
  mv "$CONF.tmp" "$CONF"
  say "wrote $CONF for device $DEVICE_ID"
fi
own root:haarvest 0640 "$CONF"
if [ -n "$BROKER" ] || [ -n "$PORT" ]; then  # the broker may move: update it in a kept config too
  sed -i -e "${BROKER:+s|^host = \"[^\"]*\"|host = \"$BROKER\"|}" -e "${PORT:+s|^port = [0-9]*|port = $PORT|}" "$CONF"
fi

# --- identity -------------------------------------------------------------------------------------------------
if [ "$ENROLL" -eq 1 ]; then
  (umask 077 && : >"$ETC/enrollment.json.tmp")
  if ! as_agent "$HAARVEST" agent enroll --config "$CONF" --signature "$SIGNATURE" >"$ETC/enrollment.json.tmp"; then
    rm -f "$ETC/enrollment.json.tmp"
    die "haarvest agent enroll failed (is $HAARVEST usable by the haarvest user?)"
  fi
  mv "$ETC/enrollment.json.tmp" "$ETC/enrollment.json"
  if grep -q '"hmac-sha256:' "$ETC/enrollment.json"; then
    chmod 0600 "$ETC/enrollment.json"  # holds the device's HMAC report key
  else
    chmod 0644 "$ETC/enrollment.json"  # an Ed25519 public key
  fi
  say "device identity in $STATE; enrolment for the coordinator in $ETC/enrollment.json:"
  cat "$ETC/enrollment.json"
fi

# --- systemd unit ---------------------------------------------------------------------------------------------
sed -e "s|/opt/haarvest/venv/bin/haarvest|$HAARVEST|" \
    -e "s|--config /etc/haarvest/agent.toml|--config $CONF|" \
    -e "s|file:///opt/haarvest/deploy/README.md|file://$OPT/deploy/README.md|" \
    "$UNIT_SRC" >"$UNIT_DIR/$UNIT.tmp"
mv "$UNIT_DIR/$UNIT.tmp" "$UNIT_DIR/$UNIT"
chmod 0644 "$UNIT_DIR/$UNIT"
if [ "$SYSTEMD" -eq 1 ]; then
  systemctl daemon-reload
  systemctl enable "$UNIT"
  if [ "$START" -eq 1 ]; then systemctl restart "$UNIT"; fi
fi

# --- check ----------------------------------------------------------------------------------------------------
missing=()
for f in ca.crt device.crt device.key.pem coordinator.pub; do [ -f "$ETC/$f" ] || missing+=("$ETC/$f"); done
if [ -f "$ETC/coordinator.pub" ]; then
  as_agent "$HAARVEST" agent check-config --config "$CONF" >&2 ||
    die "haarvest agent check-config failed for $CONF (see the errors above)"
else
  say "skipping check-config: no coordinator public key yet (--coordinator-pubkey)"
fi
if [ ${#missing[@]} -gt 0 ]; then
  say "still missing (the agent cannot connect without them): ${missing[*]}"
fi
say "done. Next: enroll $ETC/enrollment.json on the coordinator, then: systemctl start $UNIT"
