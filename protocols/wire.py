"""Wire format shared by devices and coordinator: topics, signed reports, signed round configurations.

Everything that crosses the network is canonical JSON (sorted keys, no whitespace, no NaN) validated by a
pydantic model. Reports are authenticated by the device's *report key* over a domain-separated message binding the
MQTT topic, device id, boot counter, sequence number, round id and body (so a report cannot be replayed to another
topic, device or round without breaking the signature). Round configurations are signed by the coordinator's
Ed25519 key; devices accept only rounds that verify under the coordinator key they were provisioned with.

Two report-key algorithms, chosen per device at enrolment (the coordinator's registry entry decides which one a
device's reports are checked with, so there is no algorithm negotiation on the wire):

* ``ed25519`` (default) — an Ed25519 signature (RFC 8032). The registry holds only the public key; nobody but the
  device can produce its reports. Verifying is the dearer of the two (the per-report CPU of each is measured in the
  "Coordinator ingest" section of ``make bench``).
* ``hmac-sha256`` — an HMAC-SHA256 tag (RFC 2104) under a 32-byte secret the device creates at enrolment and the
  coordinator's registry stores (``hmac-sha256:<base64>``). Verifying is much cheaper than an Ed25519 signature,
  which is what lets one host ingest a large fleet at broker speed; the price is that the registry is a secret
  (whoever reads it can forge that device's reports, though not publish them without the device's broker
  credentials), and that the coordinator could forge them too (no non-repudiation). The key is separate from the
  device's memo HMAC secret, which never leaves the device.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from protocols.errors import WireError

SCHEMA_VERSION = 1
TOPIC_PREFIX = "haarvest/v1"
#: Identifiers are topic-safe: no MQTT wildcards or separators.
IDENT = r"^[A-Za-z0-9_.:-]{1,64}$"
MAX_PAYLOAD = 64 * 1024
MAX_INT64 = 2**63 - 1  # counters are stored as SQLite/PostgreSQL BIGINT

Ident = Annotated[str, Field(pattern=IDENT)]

__all__ = [
    "WireError",
    "Report",
    "RoundConfig",
    "canonical_json",
    "canonical_json_text",
    "report_topic",
    "round_topic",
    "status_topic",
    "receipt_topic",
    "Receipt",
    "encode_receipt",
    "receipt_bytes",
    "decode_receipt",
    "ROUNDS_CURRENT_TOPIC",
    "REPORTS_WILDCARD",
    "device_id_from_topic",
    "sign_report",
    "signed_report_bytes",
    "verify_report",
    "decode_report",
    "sign_round",
    "verify_round",
    "decode_round",
    "generate_signing_key",
    "MacKey",
    "SIGNATURE_ALGORITHMS",
    "generate_device_key",
    "device_key_text",
    "load_device_key",
    "registry_key",
    "load_registry_key",
    "key_algorithm",
    "registry_key_id",
    "public_key_b64",
    "load_public_key",
    "load_private_key",
    "private_key_b64",
]


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
#: The C encoder :data:`_CANONICAL` builds on every call, built once (``json.JSONEncoder.encode`` makes a new one per
#: call: a third of a small body's encoding time; ingest encodes each report's body and receipt). Without its
#: circular-reference check (JSON decoded from bytes has no cycles; a cyclic object raises RecursionError instead of
#: ValueError). None where the C accelerator is missing.
_CANONICAL_C = (json.encoder.c_make_encoder(None, _CANONICAL.default, json.encoder.encode_basestring_ascii, None,
                                            ":", ",", True, False, False)
                if json.encoder.c_make_encoder is not None else None)


def canonical_json_text(obj: Any) -> str:
    """Deterministic JSON text: sorted keys, compact separators, ASCII, NaN/inf refused (ValueError)."""
    if _CANONICAL_C is None:
        return _CANONICAL.encode(obj)
    return "".join(_CANONICAL_C(obj, 0))


def canonical_json(obj: Any) -> bytes:
    """:func:`canonical_json_text` as bytes."""
    return canonical_json_text(obj).encode()


# --- topics -------------------------------------------------------------------------------------------------

REPORTS_WILDCARD = f"{TOPIC_PREFIX}/reports/+"
ROUNDS_CURRENT_TOPIC = f"{TOPIC_PREFIX}/rounds/current"


def report_topic(device_id: str) -> str:
    return f"{TOPIC_PREFIX}/reports/{device_id}"


def round_topic(round_id: str) -> str:
    return f"{TOPIC_PREFIX}/rounds/{round_id}"


def status_topic(device_id: str) -> str:
    return f"{TOPIC_PREFIX}/status/{device_id}"


def receipt_topic(device_id: str) -> str:
    """Where the coordinator tells a device which of its reports it has stored (only the coordinator may publish
    there: deploy/mosquitto/haarvest.acl; a device may read only its own)."""
    return f"{TOPIC_PREFIX}/receipts/{device_id}"


#: At most this many sequence numbers in one receipt (a batch holds at most 10^4 messages in practice).
MAX_RECEIPT_SEQS = 100_000


@dataclass(frozen=True)
class Receipt:
    """End-to-end delivery: the reports of ``device_id`` the coordinator has durably processed — ``stored`` (now
    or earlier: duplicates are receipted again) and ``rejected`` ((seq, reason): authentic, but never to be
    stored, e.g. a closed round). A device marks a report delivered only on a receipt, never on a PUBACK."""

    device_id: str
    stored: tuple[int, ...]
    rejected: tuple[tuple[int, str], ...] = ()


def encode_receipt(receipt: Receipt) -> bytes:
    """The receipt's canonical JSON: ``{"device_id":…,"rejected":[[seq,reason],…],"stored":[seq,…],"v":1}``."""
    return receipt_bytes(receipt.device_id, receipt.stored, receipt.rejected)


_json_string = json.encoder.encode_basestring_ascii  # the canonical encoder's own string escaping (ensure_ascii)


def receipt_bytes(device_id: str, stored: Sequence[int], rejected: Sequence[tuple[int, str]] = ()) -> bytes:
    """:func:`encode_receipt` without building a :class:`Receipt` (ingest sends one per device of every batch):
    the same bytes as ``canonical_json`` of the receipt's fields — keys in sorted order, compact separators,
    strings escaped as that encoder escapes them, sequence numbers as ``int`` — written out directly (2.4 times
    faster for one stored report). ``stored`` must hold ints and ``rejected`` (int, str) pairs, as a receipt's do."""
    rej = ",".join([f"[{int(seq)},{_json_string(reason)}]" for seq, reason in rejected])
    return (f'{{"device_id":{_json_string(device_id)},"rejected":[{rej}],'
            f'"stored":[{",".join([str(int(seq)) for seq in stored])}],"v":1}}').encode()


def decode_receipt(payload: bytes) -> Receipt:
    """Parse a receipt; WireError('malformed') for anything else."""
    try:
        obj = json.loads(payload)
        if not isinstance(obj, dict) or obj.get("v") != 1 or not isinstance(obj.get("device_id"), str):
            raise ValueError("not a receipt")
        stored, rejected = obj.get("stored", []), obj.get("rejected", [])
        if not isinstance(stored, list) or not isinstance(rejected, list) or \
                len(stored) + len(rejected) > MAX_RECEIPT_SEQS:
            raise ValueError("bad lists")
        if any(type(s) is not int or s < 0 for s in stored):
            raise ValueError("bad seq")
        rej = []
        for item in rejected:
            if not (isinstance(item, list) and len(item) == 2 and type(item[0]) is int and item[0] >= 0
                    and isinstance(item[1], str)):
                raise ValueError("bad rejection")
            rej.append((item[0], item[1][:64]))
        return Receipt(obj["device_id"], tuple(stored), tuple(rej))
    except (ValueError, TypeError, RecursionError) as exc:
        raise WireError("malformed", f"receipt: {exc}") from None


def device_id_from_topic(topic: str) -> str:
    """The device id a report topic names; WireError('wrong_topic') for any other topic."""
    prefix = f"{TOPIC_PREFIX}/reports/"
    if not topic.startswith(prefix):
        raise WireError("wrong_topic", topic)
    device = topic[len(prefix) :]
    if not device or "/" in device:
        raise WireError("wrong_topic", topic)
    return device


# --- keys ---------------------------------------------------------------------------------------------------


def generate_signing_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def public_key_b64(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return base64.b64encode(pub.public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()


def private_key_b64(key: Ed25519PrivateKey) -> str:
    from cryptography.hazmat.primitives.serialization import NoEncryption, PrivateFormat

    return base64.b64encode(key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())).decode()


def load_public_key(b64: str) -> Ed25519PublicKey:
    try:
        return Ed25519PublicKey.from_public_bytes(base64.b64decode(b64, validate=True))
    except Exception as exc:  # noqa: BLE001 - any decoding failure is a bad key
        raise ValueError(f"not a base64 raw Ed25519 public key: {exc}") from None


def load_private_key(b64: str) -> Ed25519PrivateKey:
    try:
        return Ed25519PrivateKey.from_private_bytes(base64.b64decode(b64.strip(), validate=True))
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"not a base64 raw Ed25519 private key: {exc}") from None


# --- device report keys -------------------------------------------------------------------------------------

SIGNATURE_ALGORITHMS = ("ed25519", "hmac-sha256")
_HMAC_PREFIX = "hmac-sha256:"
_ED25519_PREFIX = "ed25519:"
#: Bytes of a new HMAC report key (and the least a registry entry may hold): 256 bits.
MAC_KEY_BYTES = 32


class MacKey:
    """An HMAC-SHA256 report key shared by one device and the coordinator (RFC 2104).

    Duck-types the two methods the wire format uses: ``sign(message) -> tag`` (like Ed25519PrivateKey) and
    ``verify(tag, message)`` raising ``InvalidSignature`` (like Ed25519PublicKey); the comparison is constant-time.
    """

    __slots__ = ("_secret",)

    def __init__(self, secret: bytes) -> None:
        if not isinstance(secret, bytes) or len(secret) < MAC_KEY_BYTES:
            raise ValueError(f"an HMAC report key needs at least {MAC_KEY_BYTES} bytes")
        self._secret = secret

    @property
    def secret(self) -> bytes:
        return self._secret

    def sign(self, message: bytes) -> bytes:
        return hmac.digest(self._secret, message, "sha256")

    def verify(self, tag: bytes, message: bytes) -> None:
        if not hmac.compare_digest(hmac.digest(self._secret, message, "sha256"), tag):
            raise InvalidSignature()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MacKey) and hmac.compare_digest(self._secret, other._secret)

    def __hash__(self) -> int:
        return hash(hashlib.sha256(self._secret).digest())

    def __repr__(self) -> str:
        return "MacKey(<secret>)"


#: What a device signs its reports with, and what the coordinator checks them with.
DeviceKey = Ed25519PrivateKey | MacKey
VerifyKey = Ed25519PublicKey | MacKey


def generate_device_key(algorithm: str = "ed25519") -> DeviceKey:
    """A new report key: an Ed25519 private key, or 32 random bytes (OS entropy) for ``hmac-sha256``."""
    if algorithm == "ed25519":
        return generate_signing_key()
    if algorithm == "hmac-sha256":
        return MacKey(secrets.token_bytes(MAC_KEY_BYTES))
    raise ValueError(f"unknown signature algorithm {algorithm!r}; choose one of {', '.join(SIGNATURE_ALGORITHMS)}")


def key_algorithm(key: DeviceKey | VerifyKey) -> str:
    return "hmac-sha256" if isinstance(key, MacKey) else "ed25519"


def _mac_b64(key: MacKey) -> str:
    return _HMAC_PREFIX + base64.b64encode(key.secret).decode()


def _load_mac(text: str) -> MacKey:
    try:
        raw = base64.b64decode(text[len(_HMAC_PREFIX):], validate=True)
    except Exception:  # noqa: BLE001
        raise ValueError("not an hmac-sha256:<base64> key") from None
    if len(raw) < MAC_KEY_BYTES:
        raise ValueError(f"an hmac-sha256 key needs at least {MAC_KEY_BYTES} bytes, got {len(raw)}")
    return MacKey(raw)


def device_key_text(key: DeviceKey) -> str:
    """The device's key file content: base64 raw Ed25519 private key, or ``hmac-sha256:<base64 secret>``."""
    return _mac_b64(key) if isinstance(key, MacKey) else private_key_b64(key)


def load_device_key(text: str) -> DeviceKey:
    """Parse a device key file (:func:`device_key_text`); the prefix decides the algorithm."""
    text = text.strip()
    if text.startswith(_HMAC_PREFIX):
        return _load_mac(text)
    return load_private_key(text.removeprefix(_ED25519_PREFIX))


def registry_key(key: DeviceKey) -> str:
    """The coordinator's registry entry for a device key: the base64 Ed25519 *public* key, or the HMAC key itself
    (``hmac-sha256:<base64>`` — a secret: keep the registry private)."""
    return _mac_b64(key) if isinstance(key, MacKey) else public_key_b64(key)


def load_registry_key(text: str) -> VerifyKey:
    """Parse a registry entry (:func:`registry_key`): ValueError for anything else."""
    text = text.strip()
    if text.startswith(_HMAC_PREFIX):
        return _load_mac(text)
    return load_public_key(text.removeprefix(_ED25519_PREFIX))


def registry_key_id(text: str) -> str:
    """A public fingerprint of a registry entry (first 16 hex digits of its SHA-256): safe to show or log."""
    return hashlib.sha256(text.strip().encode()).hexdigest()[:16]


# --- models -------------------------------------------------------------------------------------------------


def _report_signing_message(topic: str, unsigned_json: bytes) -> bytes:
    """What a report's signature covers: a domain-separation prefix, the topic, the canonical JSON of every field
    but ``sig``."""
    return b"haarvest-report-v1\n" + topic.encode() + b"\n" + unsigned_json


class _Signed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    sig: str = ""

    def unsigned_dict(self) -> dict[str, Any]:
        """Every field but ``sig``. The fields hold JSON values already (validated str/int/float/list/dict), so this
        is ``model_dump(mode="json", exclude={"sig"})`` without the serializer's cost on the ingest path."""
        return {k: v for k, v in self.__dict__.items() if k != "sig"}

    def to_bytes(self) -> bytes:
        return canonical_json(self.model_dump(mode="json"))


class Report(_Signed):
    """One device's privatized report for one stream in one round.

    ``body`` is the mechanism's report for this device (lists of numbers; see the mechanism's ``to_wire``).
    ``seq`` increases strictly per device across reboots (the coordinator's replay high-water mark); ``boot`` is
    the device's boot counter.
    """

    v: Literal[1] = SCHEMA_VERSION
    device_id: Ident
    boot: int = Field(ge=0, le=MAX_INT64)
    seq: int = Field(ge=0, le=MAX_INT64)
    round_id: Ident
    stream: Ident
    mechanism: Ident
    body: dict[str, Any]

    def signing_message(self, topic: str) -> bytes:
        return _report_signing_message(topic, canonical_json(self.unsigned_dict()))


class RoundConfig(_Signed):
    """Public parameters of one collection round, signed by the coordinator and published retained.

    ``params`` holds everything a device needs (mechanism names, per-stream parameters, rounding steps,
    candidate prefixes, ...). ``depends_on`` lists the earlier rounds whose aggregates chose these parameters
    (sequential interaction, SPEC §5). ``epsilon`` is the most one device may spend on this round.
    """

    v: Literal[1] = SCHEMA_VERSION
    round_id: Ident
    protocol: Ident
    epsilon: float = Field(gt=0, allow_inf_nan=False)
    params: dict[str, Any] = Field(default_factory=dict)
    depends_on: list[Ident] = Field(default_factory=list)
    issued_at: float = Field(default_factory=time.time)
    not_after: float | None = None

    def signing_message(self) -> bytes:
        return b"haarvest-round-v1\n" + canonical_json(self.unsigned_dict())


def _sign(model: _Signed, message: bytes, key: DeviceKey) -> Any:
    return model.model_copy(update={"sig": base64.b64encode(key.sign(message)).decode()})


def _verify(sig: str, message: bytes, key: VerifyKey) -> None:
    if not sig:
        raise WireError("unsigned")
    try:
        raw = base64.b64decode(sig, validate=True)
    except Exception:  # noqa: BLE001
        raise WireError("bad_signature", "signature is not base64") from None
    try:
        key.verify(raw, message)
    except InvalidSignature:
        raise WireError("bad_signature") from None


def sign_report(report: Report, topic: str, key: DeviceKey) -> Report:
    """``report`` with ``sig`` = base64 of the Ed25519 signature or HMAC-SHA256 tag of its signing message: the
    reference signer. Devices send :func:`signed_report_bytes` (one pass, no model copy); tests pin its bytes to
    this one's and build signed or re-signed :class:`Report` objects with it."""
    return _sign(report, report.signing_message(topic), key)


#: Top-level report fields that sort before ``sig`` (canonical JSON sorts keys; the others — stream, v — after it).
_BEFORE_SIG = tuple(name for name in Report.model_fields if name < "sig")


def signed_report_bytes(report: Report, topic: str, key: DeviceKey) -> bytes:
    """``sign_report(report, topic, key).to_bytes()`` in one pass (the device's hot path): the canonical JSON of the
    unsigned fields is encoded once — as the text of the fields sorting before ``sig`` and of those after it, whose
    concatenation *is* the canonical JSON because every key of the first part sorts before every key of the second
    — signed, and the signature spliced in at its sorted place. No model copy, no second serialization."""
    fields = report.unsigned_dict()
    head = canonical_json_text({k: fields.pop(k) for k in _BEFORE_SIG})
    tail = canonical_json_text(fields)
    sig = base64.b64encode(key.sign(_report_signing_message(topic, f"{head[:-1]},{tail[1:]}".encode()))).decode()
    return f'{head[:-1]},"sig":"{sig}",{tail[1:]}'.encode()


def verify_report(report: Report, topic: str, key: VerifyKey, payload: bytes | None = None) -> None:
    """Raise WireError('unsigned' | 'bad_signature') unless ``report`` is validly signed for ``topic`` under the
    device's registered key (Ed25519 public key or HMAC key).

    ``payload`` — the bytes ``report`` was decoded from — lets the ingest path skip re-encoding the canonical JSON
    (a share of the coordinator's CPU per report): the bytes a device sends (:func:`signed_report_bytes`) *are* the
    signed canonical JSON with ``,"sig":"<sig>",`` spliced in, so the signature is first checked over the payload
    with that one splice cut back to ``,``. This accepts exactly what the canonical check accepts. If the check
    passes, the device signed the cut text ``T`` (the signatures are unforgeable and devices sign only canonical
    JSON of a report's unsigned fields, under this topic and domain prefix), so ``T`` has no top-level ``sig`` and
    the payload is ``T`` with one ``"sig":…`` member inserted. An insertion inside a string literal leaves invalid
    JSON (the needle's quotes close the string and ``sig`` follows as a bare word); one inside an array is
    invalid JSON; one inside a nested object leaves the top level without ``sig``, while ``report.sig`` — which
    the needle is built from — is the top-level member. So the payload decodes to ``T``'s fields plus the
    top-level ``sig``: ``report`` is what the device signed. Any other layout (another encoder's spacing or key
    order) falls back to the canonical re-encoding, whose check is authoritative; a failed cut check costs a
    second signature check only if the cut text differs from the canonical one."""
    sig = report.sig
    if isinstance(payload, (bytes, bytearray)) and sig:
        needle = b',"sig":"' + sig.encode() + b'",'
        at = payload.find(needle)
        if at > 0:
            cut = payload[:at] + b"," + payload[at + len(needle):]
            try:
                _verify(sig, _report_signing_message(topic, cut), key)
                return
            except WireError:
                canonical = canonical_json(report.unsigned_dict())
                if canonical == cut:
                    raise
                _verify(sig, _report_signing_message(topic, canonical), key)
                return
    _verify(sig, report.signing_message(topic), key)


def sign_round(config: RoundConfig, key: Ed25519PrivateKey) -> RoundConfig:
    """Rounds are always Ed25519-signed: every device verifies them, so the key must be public."""
    if not isinstance(key, Ed25519PrivateKey):
        raise TypeError("round configurations are signed with the coordinator's Ed25519 key")
    return _sign(config, config.signing_message(), key)


def verify_round(config: RoundConfig, key: Ed25519PublicKey) -> None:
    if not isinstance(key, Ed25519PublicKey):
        raise TypeError("round configurations are verified with the coordinator's Ed25519 public key")
    _verify(config.sig, config.signing_message(), key)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} is not allowed")


#: One strict decoder (NaN/Infinity refused), built once: ``json.loads`` with a hook builds a new one per call.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def _decode(model: type[_Signed], payload: bytes) -> Any:
    if len(payload) > MAX_PAYLOAD:
        raise WireError("too_large", f"{len(payload)} bytes > {MAX_PAYLOAD}")
    try:
        data = _DECODER.decode(payload.decode("utf-8") if isinstance(payload, (bytes, bytearray)) else payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError("malformed", f"not JSON: {exc}") from None
    except RecursionError:
        raise WireError("malformed", "JSON nested too deeply") from None
    except ValueError as exc:  # NaN / Infinity
        raise WireError("malformed", str(exc)) from None
    if not isinstance(data, dict):
        raise WireError("malformed", "not a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise WireError("schema", f"{where}: {first.get('msg')}") from None


#: Digits of an integer pydantic's JSON parser reads at most (its own limit, CPython's default for ``int(str)``).
_PARSER_INT_DIGITS = 4300


def decode_report(payload: bytes) -> Report:
    """A report from its JSON bytes; WireError('too_large' | 'malformed' | 'schema') otherwise.

    The general path parses with the standard library (non-finite constants refused) and validates the object
    (pydantic, lax). Ingest decodes every report, so a payload is first given to pydantic's own JSON parser in
    strict mode — about half the cost — unless it holds an escape or a non-finite constant. Whatever that parser
    accepts the general path accepts too and builds the same report from (the last of duplicate keys, ``int`` and
    ``float`` as ``json`` makes them; strict mode takes JSON integers for the integer fields and strings for the
    string fields); whatever it refuses goes to the general path. So outcomes and reasons are the general path's
    (``tests/protocols/test_wire.py`` compares the two on mutated payloads).

    Non-finite constants go to the general path because pydantic's parser accepts them and the general path
    refuses them. Escapes go there only as a precaution: the two parsers agree on every escape tried, and pydantic's
    refuses a lone surrogate. Both parsers refuse integers of more digits than a limit; pydantic's is fixed at
    :data:`_PARSER_INT_DIGITS`, the general path's is the interpreter's (``sys.set_int_max_str_digits``), so with a
    lower interpreter limit everything takes the general path."""
    if type(payload) is bytes and len(payload) <= MAX_PAYLOAD and b"\\" not in payload \
            and b"NaN" not in payload and b"Infinity" not in payload \
            and not 0 < sys.get_int_max_str_digits() < _PARSER_INT_DIGITS:
        try:
            return Report.model_validate_json(payload, strict=True)
        except ValidationError:
            pass
    return _decode(Report, payload)


def decode_round(payload: bytes) -> RoundConfig:
    return _decode(RoundConfig, payload)
