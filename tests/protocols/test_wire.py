import pytest

from protocols import wire


@pytest.fixture
def key():
    return wire.generate_signing_key()


def _report(**kw):
    base = dict(device_id="dev-1", boot=2, seq=7, round_id="r1", stream="cpu", mechanism="hybrid", body={"y": [0.5]})
    base.update(kw)
    return wire.Report(**base)


def test_sign_verify_roundtrip(key):
    topic = wire.report_topic("dev-1")
    signed = wire.sign_report(_report(), topic, key)
    decoded = wire.decode_report(signed.to_bytes())
    wire.verify_report(decoded, topic, key.public_key())
    assert wire.device_id_from_topic(topic) == "dev-1"


@pytest.mark.parametrize(
    "change",
    [{"seq": 8}, {"boot": 3}, {"round_id": "r2"}, {"body": {"y": [0.6]}}, {"device_id": "dev-2"}],
)
def test_tampering_breaks_signature(key, change):
    topic = wire.report_topic("dev-1")
    signed = wire.sign_report(_report(), topic, key)
    tampered = signed.model_copy(update=change)
    with pytest.raises(wire.WireError) as err:
        wire.verify_report(tampered, topic, key.public_key())
    assert err.value.reason == "bad_signature"


def test_topic_is_bound(key):
    signed = wire.sign_report(_report(), wire.report_topic("dev-1"), key)
    with pytest.raises(wire.WireError):
        wire.verify_report(signed, wire.report_topic("dev-9"), key.public_key())


def test_unsigned_and_malformed():
    with pytest.raises(wire.WireError) as err:
        wire.verify_report(_report(), "t", wire.generate_signing_key().public_key())
    assert err.value.reason == "unsigned"
    for payload, reason in [(b"\xff", "malformed"), (b"[]", "malformed"), (b'{"v":1}', "schema"),
                            (b"x" * (wire.MAX_PAYLOAD + 1), "too_large"),
                            (b'{"a":NaN}', "malformed"), (b"[" * 100000 + b"]" * 100000, "too_large"),
                            (b"[" * 20000 + b"]" * 20000, "malformed")]:
        with pytest.raises(wire.WireError) as err:
            wire.decode_report(payload)
        assert err.value.reason == reason
    with pytest.raises(wire.WireError):
        wire.device_id_from_topic("haarvest/v1/rounds/x")
    with pytest.raises(ValueError):
        _report(device_id="a/b")
    with pytest.raises(ValueError):
        _report(seq=2**63)


def test_round_config_signing(key):
    cfg = wire.sign_round(wire.RoundConfig(round_id="r1", protocol="haar", epsilon=1.0, params={"k": 4}), key)
    wire.verify_round(wire.decode_round(cfg.to_bytes()), key.public_key())
    with pytest.raises(wire.WireError):
        wire.verify_round(cfg.model_copy(update={"epsilon": 9.0}), key.public_key())


def test_key_serialisation(key):
    assert wire.public_key_b64(wire.load_private_key(wire.private_key_b64(key))) == wire.public_key_b64(key)
    with pytest.raises(ValueError, match="Ed25519"):
        wire.load_public_key("nope")


# --- HMAC-SHA256 report keys ---------------------------------------------------------------------------------


def test_hmac_report_key_roundtrip_and_tampering():
    key = wire.generate_device_key("hmac-sha256")
    topic = wire.report_topic("dev-1")
    signed = wire.sign_report(_report(), topic, key)
    wire.verify_report(wire.decode_report(signed.to_bytes()), topic, wire.load_registry_key(wire.registry_key(key)))
    for change in ({"seq": 8}, {"body": {"y": [0.6]}}, {"sig": signed.sig[:-4] + "AAA="}):
        with pytest.raises(wire.WireError) as err:
            wire.verify_report(signed.model_copy(update=change), topic, key)
        assert err.value.reason == "bad_signature"
    with pytest.raises(wire.WireError):
        wire.verify_report(signed, wire.report_topic("dev-9"), key)
    with pytest.raises(wire.WireError):
        wire.verify_report(signed, topic, wire.generate_device_key("hmac-sha256"))
    with pytest.raises(wire.WireError):  # an Ed25519 key never accepts an HMAC tag
        wire.verify_report(signed, topic, wire.generate_signing_key().public_key())


def test_device_key_texts():
    for algorithm in wire.SIGNATURE_ALGORITHMS:
        key = wire.generate_device_key(algorithm)
        again = wire.load_device_key(wire.device_key_text(key) + "\n")
        assert wire.registry_key(again) == wire.registry_key(key) and wire.key_algorithm(again) == algorithm
        assert len(wire.registry_key_id(wire.registry_key(key))) == 16
    mac = wire.generate_device_key("hmac-sha256")
    assert wire.registry_key(mac).startswith("hmac-sha256:") and "secret" in repr(mac)
    assert wire.registry_key(mac).split(":", 1)[1] not in repr(mac)
    assert wire.load_registry_key(wire.registry_key(mac)) == mac
    ed = wire.generate_signing_key()
    assert wire.load_registry_key("ed25519:" + wire.public_key_b64(ed)) is not None
    for bad in ("hmac-sha256:c2hvcnQ=", "hmac-sha256:!!", "nope"):
        with pytest.raises(ValueError):
            wire.load_registry_key(bad)
    with pytest.raises(ValueError, match="unknown signature algorithm"):
        wire.generate_device_key("rsa")
    with pytest.raises(ValueError):
        wire.MacKey(b"short")


def test_rounds_are_only_ed25519():
    cfg = wire.RoundConfig(round_id="r1", protocol="haar", epsilon=1.0)
    mac = wire.generate_device_key("hmac-sha256")
    with pytest.raises(TypeError):
        wire.sign_round(cfg, mac)
    with pytest.raises(TypeError):
        wire.verify_round(wire.sign_round(cfg, wire.generate_signing_key()), mac)


@pytest.mark.parametrize("algorithm", wire.SIGNATURE_ALGORITHMS)
@pytest.mark.parametrize("body", [
    {"y": [0.5]},
    {"report": 223},
    {"report": [1326584390301200278, 3]},
    {"stream": "x", "sig": "y", "v": [1, {"b": 2, "a": None}], "é": "ünïcode", "z": True},
    {},
])
def test_one_pass_encoding_equals_sign_then_serialize(algorithm, body):
    key = wire.generate_device_key(algorithm)
    topic = wire.report_topic("dev-1")
    report = _report(body=body)
    payload = wire.signed_report_bytes(report, topic, key)
    assert payload == wire.sign_report(report, topic, key).to_bytes()
    verify = key.public_key() if algorithm == "ed25519" else key
    wire.verify_report(wire.decode_report(payload), topic, verify)


def _signed(algorithm, body):
    key = wire.generate_device_key(algorithm)
    topic = wire.report_topic("dev-1")
    payload = wire.signed_report_bytes(_report(body=body), topic, key)
    return payload, topic, (key.public_key() if algorithm == "ed25519" else key)


_AWKWARD_BODY = {"a": "x,y", "n": {"b": [1, 2], "c": "\",\"sig\":\""}, "z": [0.5, -1]}


@pytest.mark.parametrize("algorithm", wire.SIGNATURE_ALGORITHMS)
@pytest.mark.parametrize("body", [{"y": [0.5]}, _AWKWARD_BODY, {"stream": "x", "sig": "y", "v": [1, {"b": 2}]}])
def test_verify_from_received_bytes_skips_the_canonical_encoding(algorithm, body, monkeypatch):
    payload, topic, verify = _signed(algorithm, body)
    report = wire.decode_report(payload)

    def no_encoding(obj):
        raise AssertionError("the canonical JSON was re-encoded")

    monkeypatch.setattr(wire, "canonical_json", no_encoding)
    wire.verify_report(report, topic, verify, payload)


@pytest.mark.parametrize("algorithm", wire.SIGNATURE_ALGORITHMS)
def test_verify_from_received_bytes_other_layouts_fall_back(algorithm):
    """Another encoder's layout (spaces, sig first, unsorted keys) still verifies: the canonical check decides."""
    import json

    payload, topic, verify = _signed(algorithm, _AWKWARD_BODY)
    fields = json.loads(payload)
    sig = fields.pop("sig")
    for text in (json.dumps({"sig": sig, **fields}), json.dumps(dict(reversed(list(fields.items())), sig=sig),
                                                                indent=1)):
        wire.verify_report(wire.decode_report(text.encode()), topic, verify, text.encode())
        spaced_bad = text.replace(sig, sig[:-4] + ("AAAA" if not sig.endswith("AAAA") else "BBBB"))
        with pytest.raises(wire.WireError):
            wire.verify_report(wire.decode_report(spaced_bad.encode()), topic, verify, spaced_bad.encode())


@pytest.mark.parametrize("algorithm", wire.SIGNATURE_ALGORITHMS)
def test_verify_from_received_bytes_moving_the_signature_is_caught(algorithm):
    """Every re-placement of the sig member (at every comma of the signed text: top level, inside the body's
    objects, arrays and strings) and every tampered field: whatever decodes and verifies is the signed report."""
    payload, topic, verify = _signed(algorithm, _AWKWARD_BODY)
    original = wire.decode_report(payload)
    member = b'"sig":"' + original.sig.encode() + b'",'
    unsigned = payload.replace(b"," + member, b",", 1)
    variants = [unsigned[:i + 1] + member + unsigned[i + 1:] for i in range(len(unsigned)) if unsigned[i:i + 1] == b","]
    variants += [payload.replace(b'"seq":7', b'"seq":8'), payload.replace(b'"x,y"', b'"x,z"'),
                 payload.replace(b'"stream":"cpu"', b'"stream":"cpu","seq":8'),
                 payload.replace(b'{"body"', b'{"seq":8,"body"')]
    accepted = 0
    for variant in variants:
        try:
            report = wire.decode_report(variant)
            wire.verify_report(report, topic, verify, variant)
        except wire.WireError:
            continue
        accepted += 1
        assert report == original, variant
    assert accepted >= 2  # the honest place and other top-level places (canonical fallback)


def test_verify_with_a_text_payload_uses_the_canonical_check():
    payload, topic, verify = _signed("hmac-sha256", {"y": [0.5]})
    wire.verify_report(wire.decode_report(payload.decode()), topic, verify, payload.decode())


@pytest.mark.parametrize("obj", [
    {"b": [1, 2.5, -0.0, 1e300, 0.1 + 0.2], "a": "é\"\\\n\u2028x", "z": {"y": None, "x": True, "w": False}},
    "a string", 5, 2**70, [], {}, [[{"k": [1]}]],
])
def test_canonical_json_is_the_standard_encoders_sorted_compact_ascii_output(obj):
    """The encoder built once (:data:`wire._CANONICAL_C`) writes exactly what ``json.JSONEncoder`` with the same
    settings writes, and refuses NaN/inf (ValueError) and unencodable objects (TypeError) as it does."""
    import json

    reference = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    assert wire.canonical_json_text(obj) == reference.encode(obj)
    assert wire.canonical_json(obj) == reference.encode(obj).encode()


@pytest.mark.parametrize("bad, error", [(float("nan"), ValueError), ({"a": [float("inf")]}, ValueError),
                                        ({"a": object()}, TypeError), ({1j: 1}, TypeError)])
def test_canonical_json_refuses_what_json_cannot_encode(bad, error):
    with pytest.raises(error):
        wire.canonical_json(bad)


def test_receipt_bytes_are_the_receipts_canonical_json():
    """receipt_bytes writes the receipt out directly: byte for byte what canonical_json makes of its fields, for odd
    device ids and reasons (quotes, backslashes, control characters, non-ASCII), large and empty sequences."""
    import random

    rng = random.Random(7)
    alphabet = ['a', 'Z', '0', '-', '.', ':', '"', '\\', '\n', '\x00', '\x7f', 'é', '€', '\U0001f600', '/', ' ']
    texts = ["dev-1", "", "fleet-0000001"] + ["".join(rng.choices(alphabet, k=rng.randint(1, 12))) for _ in range(300)]
    for i, device in enumerate(texts):
        stored = [rng.choice([0, 1, 2**63 - 1, rng.randrange(2**40)]) for _ in range(rng.randint(0, 4))]
        rejected = [(rng.randrange(2**20), rng.choice(texts)) for _ in range(rng.randint(0, 3))] if i % 2 else []
        expected = wire.canonical_json({"v": 1, "device_id": device, "stored": stored,
                                        "rejected": [[s, r] for s, r in rejected]})
        assert wire.receipt_bytes(device, stored, rejected) == expected
        receipt = wire.Receipt(device, tuple(stored), tuple(rejected))
        assert wire.encode_receipt(receipt) == expected
        assert wire.decode_receipt(expected) == wire.Receipt(device, tuple(stored),
                                                             tuple((s, r[:64]) for s, r in rejected))


def _typed(value):
    """A value with the type of every part spelled out (1 and 1.0, 0.0 and -0.0, True and 1, a list and a tuple
    differ) and dict keys in their order."""
    if isinstance(value, dict):
        return ("dict", [(k, _typed(v)) for k, v in value.items()])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_typed(v) for v in value])
    return (type(value).__name__, repr(value))


def _outcome(decode, payload):
    try:
        report = decode(payload)
    except wire.WireError as exc:
        return ("error", exc.reason, str(exc))
    return ("report", _typed({name: getattr(report, name) for name in wire.Report.model_fields}))


def test_decode_report_fast_path_agrees_with_the_general_path():
    """decode_report first tries pydantic's strict JSON parser; on every mutated payload — each field replaced by
    JSON values of every type, duplicated, dropped or added, odd bytes, truncations, deep nesting — it must give the
    general path's outcome: the same report (the same types in the body), or the same error."""
    import random

    rng = random.Random(11)
    general = lambda p: wire._decode(wire.Report, p)  # noqa: E731 - the path without the fast one
    bodies = [{"report": 223}, {"report": {"detail": [-1.0226, 0.0, -0.0], "mean": -2.95}},
              {"report": [0, 1, 1, 0]}, {"y": [1e300, 5e-324, 1.5e-7, 12345678901234567890, -3]}, {}]
    fragments = [b"1", b"-1", b"0", b"-0", b"1.0", b"1e0", b"1E5", b"-0.0", b"1e400", b"-1e400", b"true", b"false",
                 b"null", b'"1"', b'"x"', b'""', b"[]", b"{}", b'{"a":1}', b"[1,2]", b"9223372036854775807",
                 b"9223372036854775808", b"-9223372036854775809", b'"dev-1"', b'"bad id!"', "\"é\"".encode(),
                 b'"\\u00e9"', b'"\\ud800"', b"NaN", b"-Infinity", b"1.", b".5", b"01", b"+1", b"0x10"]
    seeds = []
    for i, body in enumerate(bodies):
        report = _report(seq=i + 1, body=body)
        seeds.append(wire.canonical_json(report.model_dump()))
    payloads = list(seeds)
    for seed in seeds:
        for name in wire.Report.model_fields:
            key = f'"{name}":'.encode()
            at = seed.index(key) + len(key)
            end = at
            depth = 0
            while True:  # the end of this field's value
                c = seed[end:end + 1]
                if c in (b"{", b"["):
                    depth += 1
                elif c in (b"}", b"]"):
                    if depth == 0:
                        break
                    depth -= 1
                elif c == b"," and depth == 0:
                    break
                elif c == b'"':
                    end = seed.index(b'"', end + 1)
                end += 1
            for frag in fragments:
                payloads.append(seed[:at] + frag + seed[end:])
            payloads.append(seed[:-1] + b"," + key + rng.choice(fragments) + b"}")  # a duplicate key, last wins
            payloads.append(seed[:at - len(key)] + seed[end + 1:] if seed[end:end + 1] == b"," else seed)  # dropped
        payloads.append(seed[:-1] + b',"extra":1}')
        for frag in fragments:  # inside the body, and as the later of two duplicate keys there
            payloads.append(seed.replace(b'"body":{', b'"body":{"in":' + frag + b",", 1))
            payloads.append(seed.replace(b'"body":{', b'"body":{"in":[1,' + frag + b"],", 1))
            payloads.append(seed.replace(b'"body":{', b'"body":{"in":1,"in":' + frag + b",", 1))
            payloads.append(seed.replace(b'"body":{', b'"body":{"in":{"a":' + frag + b',"a":[]},', 1))
        for depth in (150, 199, 200, 250, 1200):  # pydantic's parser stops at 200, json's far deeper
            payloads.append(seed.replace(b'"body":{', b'"body":{"in":' + b"[" * depth + b"]" * depth + b",", 1))
        payloads.append(b" \n" + seed.replace(b",", b" , ") + b"\n")
        payloads.append(b"\xef\xbb\xbf" + seed)
        for raw in (b"\xed\xa0\x80", b"\xff", b"\x01", b"\x7f", "é€😀".encode()):
            payloads.append(seed.replace(b'"dev-1"', b'"dev' + raw + b'"'))
            payloads.append(seed.replace(b'"report"', b'"rep' + raw + b'"'))
        for _ in range(20):
            payloads.append(seed[:rng.randrange(len(seed))])
    payloads += [b"[]", b"null", b"1", b"", b"{}", b'{"body":' + b"[" * 5000 + b"]" * 5000 + b"}",
                 b'{"body":{"a":' + b"[" * 300 + b"]" * 300 + b"}}"]
    big = _report(body={"report": [0.123456789] * 6000})  # a valid report over the size limit
    payloads.append(wire.canonical_json(big.model_dump()))
    assert len(payloads[-1]) > wire.MAX_PAYLOAD
    fast_taken = 0
    for payload in payloads:
        outcome = _outcome(wire.decode_report, payload)
        assert outcome == _outcome(general, payload), payload
        if outcome[0] == "report":
            try:
                wire.Report.model_validate_json(payload, strict=True)
                fast_taken += b"NaN" not in payload and b"Infinity" not in payload
            except ValueError:
                pass
    assert len(payloads) > 2500 and fast_taken > 300
    assert _outcome(wire.decode_report, payloads[-1])[:2] == ("error", "too_large")


def test_decode_report_follows_a_lower_interpreter_integer_limit():
    """pydantic's JSON parser reads integers of up to 4,300 digits whatever the interpreter's limit; with the limit
    lowered, a longer integer must still be refused as the general path refuses it."""
    import sys

    payload = wire.canonical_json(_report(body={"x": 10**999}).model_dump())
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        outcome = _outcome(wire.decode_report, payload)
        assert outcome == _outcome(lambda p: wire._decode(wire.Report, p), payload)
        assert outcome[:2] == ("error", "malformed")
    finally:
        sys.set_int_max_str_digits(old)
    assert _outcome(wire.decode_report, payload)[0] == "report"


def test_decode_report_takes_the_fast_path_for_what_a_device_sends(monkeypatch, key):
    """A device's signed report never reaches the general path; a payload with a non-finite constant does."""
    general = []
    real = wire._decode
    monkeypatch.setattr(wire, "_decode", lambda model, payload: general.append(payload) or real(model, payload))
    topic = wire.report_topic("dev-1")
    for body in ({"report": 32}, {"report": [0, 1, 1]}, {"report": {"detail": [0.5, -1.0, 0.0], "mean": 3.5}}):
        payload = wire.signed_report_bytes(_report(body=body), topic, key)
        assert wire.decode_report(payload).body == body
    assert general == []
    with pytest.raises(wire.WireError, match="malformed"):
        wire.decode_report(payload.replace(b"3.5", b"NaN"))
    assert len(general) == 1
