"""Key provisioning (``haarvest pki``): a private CA, the broker's TLS certificate, per-device client certificates
and the coordinator's round-signing key.

TLS uses ECDSA P-256 certificates (supported by mosquitto/OpenSSL and paho on every Raspberry Pi OS release).
A device certificate's common name is its device id, so mosquitto's ``use_identity_as_username true`` plus an ACL
pattern ``pattern write haarvest/v1/reports/%u`` confines each device to its own topics. Report *signatures* use
a separate Ed25519 key that ``haarvest agent enroll`` creates on the device (the private key never leaves it);
the coordinator's registry holds the public half. Private keys are written with mode 0600.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import json
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from protocols import wire

__all__ = ["init_ca", "issue_certificate", "load_ca", "coordinator_key", "register"]

CA_CERT, CA_KEY = "ca.crt", "ca.key"


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "haarvest"), x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    )


def init_ca(directory: Path, name: str = "haarvest CA", days: int = 3650, overwrite: bool = False) -> Path:
    """Create ``ca.key``/``ca.crt`` in ``directory``; refuses to overwrite an existing CA unless asked."""
    directory = Path(directory)
    if (directory / CA_KEY).exists() and not overwrite:
        raise FileExistsError(f"a CA already exists in {directory} (use --overwrite to replace it)")
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(key, hashes.SHA256())
    )
    _write_private(directory / CA_KEY, _key_pem(key))
    (directory / CA_CERT).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return directory / CA_CERT


def load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    directory = Path(directory)
    try:
        cert = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
        key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), password=None)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"no CA in {directory}: run `haarvest pki init-ca --dir {directory}` first") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{directory / CA_KEY} is not an EC private key")
    return cert, key


def issue_certificate(
    ca_dir: Path,
    common_name: str,
    out_dir: Path,
    *,
    server: bool = False,
    hosts: list[str] | None = None,
    days: int = 825,
) -> tuple[Path, Path]:
    """Issue a client (device, coordinator) or server (broker) certificate signed by the CA in ``ca_dir``.

    Writes ``<cn>.crt`` and ``<cn>.key`` to ``out_dir`` and returns their paths. Server certificates carry the
    given host names / IP addresses as subjectAltName.
    """
    if not common_name or "/" in common_name or "+" in common_name or "#" in common_name:
        raise ValueError(f"invalid common name {common_name!r}: it becomes an MQTT user name and topic segment")
    ca_cert, ca_key = load_ca(ca_dir)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
    )
    if server:
        names: list[x509.GeneralName] = []
        for host in hosts or ["localhost", "127.0.0.1"]:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    crt_path, key_path = out_dir / f"{common_name}.crt", out_dir / f"{common_name}.key"
    _write_private(key_path, _key_pem(key))
    crt_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return crt_path, key_path


def coordinator_key(path: Path, overwrite: bool = False) -> str:
    """Create the coordinator's Ed25519 round-signing key at ``path`` (base64 raw, 0600); returns the public key."""
    path = Path(path)
    if path.exists() and not overwrite:
        return wire.public_key_b64(wire.load_private_key(path.read_text()))
    key = wire.generate_signing_key()
    _write_private(path, wire.private_key_b64(key).encode() + b"\n")
    return wire.public_key_b64(key)


# --- CLI ------------------------------------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("pki", help="create the CA, broker/device certificates and the round-signing key")
    sub = p.add_subparsers(dest="pki_command", required=True)

    ca = sub.add_parser("init-ca", help="create a private certificate authority")
    ca.add_argument("--dir", required=True, type=Path, help="directory for the CA's key and certificate")
    ca.add_argument("--name", default="haarvest CA", help="the CA's common name (default %(default)s)")
    ca.add_argument("--overwrite", action="store_true",
                    help="replace an existing CA (every certificate it issued stops working)")
    ca.set_defaults(func=lambda a: print(init_ca(a.dir, a.name, overwrite=a.overwrite)))

    br = sub.add_parser("broker", help="issue the broker's TLS server certificate")
    br.add_argument("--dir", required=True, type=Path, help="CA directory")
    br.add_argument("--out", type=Path, help="output directory (default: the CA directory)")
    br.add_argument("--host", action="append", help="DNS name or IP (repeatable); default localhost, 127.0.0.1")
    br.set_defaults(
        func=lambda a: print(*issue_certificate(a.dir, "broker", a.out or a.dir, server=True, hosts=a.host))
    )

    dev = sub.add_parser("client", help="issue a client certificate (CN = device id or 'coordinator')")
    dev.add_argument("--dir", required=True, type=Path, help="CA directory")
    dev.add_argument("--id", required=True, help="device id (becomes the MQTT user name)")
    dev.add_argument("--out", type=Path, help="output directory (default: <dir>/clients)")
    dev.set_defaults(func=lambda a: print(*issue_certificate(a.dir, a.id, a.out or a.dir / "clients")))

    ck = sub.add_parser("coordinator-key", help="create the coordinator's Ed25519 round-signing key")
    ck.add_argument("--path", required=True, type=Path, help="key file to create (mode 0600)")
    ck.add_argument("--overwrite", action="store_true",
                    help="replace an existing key (devices must be given the new public key)")
    ck.set_defaults(func=lambda a: print(json.dumps({"coordinator_public_key": coordinator_key(a.path, a.overwrite)})))
