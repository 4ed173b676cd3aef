import ssl
import stat

import pytest
from cryptography import x509

from coordinator import pki
from haarvest.cli import main


def test_ca_and_certificates_verify(tmp_path):
    pki.init_ca(tmp_path)
    with pytest.raises(FileExistsError):
        pki.init_ca(tmp_path)
    crt, key = pki.issue_certificate(tmp_path, "broker", tmp_path, server=True, hosts=["localhost", "127.0.0.1"])
    dcrt, dkey = pki.issue_certificate(tmp_path, "dev-7", tmp_path / "clients")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    for path in (crt, dcrt):
        cert = x509.load_pem_x509_certificate(path.read_bytes())
        cert.verify_directly_issued_by(ca)
    cn = x509.load_pem_x509_certificate(dcrt.read_bytes()).subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    assert cn[0].value == "dev-7"
    # the files load as a TLS server context and a client context
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(crt, key)
    client = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    client.load_cert_chain(dcrt, dkey)


def test_bad_names_and_missing_ca(tmp_path):
    with pytest.raises(FileNotFoundError, match="init-ca"):
        pki.issue_certificate(tmp_path, "dev", tmp_path)
    pki.init_ca(tmp_path)
    with pytest.raises(ValueError, match="invalid common name"):
        pki.issue_certificate(tmp_path, "a/b", tmp_path)


def test_cli_and_coordinator_key(tmp_path, capsys):
    assert main(["pki", "init-ca", "--dir", str(tmp_path / "ca")]) == 0
    assert main(["pki", "client", "--dir", str(tmp_path / "ca"), "--id", "dev-1"]) == 0
    assert (tmp_path / "ca" / "clients" / "dev-1.crt").exists()
    pub = pki.coordinator_key(tmp_path / "coord.key")
    assert pki.coordinator_key(tmp_path / "coord.key") == pub
