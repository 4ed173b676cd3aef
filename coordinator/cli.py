"""``haarvest coordinator …``: run the coordinator, enroll devices, manage rounds, estimate, export."""

from __future__ import annotations

import argparse
import csv
import json
import re
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coordinator.run_config import DEFAULT_DB, DEFAULT_KEY  # noqa: F401 - the defaults, re-exported

from protocols.errors import PublishError

if TYPE_CHECKING:
    from coordinator.run_config import RunOptions

__all__ = ["register", "main"]

#: seconds to wait for the broker's CONNACK / PUBACK when publishing round configurations
PUBLISH_TIMEOUT = 10.0


def _load_json_arg(text: str) -> Any:
    """A JSON literal, or ``@path`` / a path to a JSON file."""
    p = Path(text[1:] if text.startswith("@") else text)
    if text.startswith("@") or (not text.lstrip().startswith(("{", "[")) and p.exists()):
        return json.loads(p.read_text())
    return json.loads(text)


def _options(args: argparse.Namespace, files: tuple[str, ...] = ()) -> "RunOptions":
    """The options of this command: defaults < ``--config`` file < options given on the command line; with
    ``files``, those file options must name readable files. Exits with status 2 and a clear message otherwise."""
    from coordinator.run_config import RunConfigError, RunOptions, load_options

    given = {k: v for k, v in vars(args).items() if k in RunOptions.model_fields}
    try:
        opts = load_options(getattr(args, "config", None), given)
        opts.check_files(files)
    except RunConfigError as exc:
        print(f"haarvest coordinator: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    return opts


def _store(args: argparse.Namespace, create: bool = False):  # noqa: ANN202
    """The store the options name; unless ``create``, a SQLite file that does not exist is an error (exit 2) — a
    mistyped ``--db`` must not leave an empty database behind."""
    from coordinator.store import open_store

    db = _options(args).db
    if not create and not db.startswith(("postgresql://", "postgres://")) and db != ":memory:":
        path = Path(db[len("sqlite:///"):] if db.startswith("sqlite:///") else db)
        if not path.exists():
            print(f"haarvest coordinator: no database at {path} (mistyped --db? `coordinator run` or "
                  "`enroll-device` creates it)", file=sys.stderr)
            raise SystemExit(2)
    return open_store(db)


def cmd_run(args: argparse.Namespace) -> int:
    from coordinator.run_config import EXISTING_FILE_KEYS
    from coordinator.service import Coordinator, CoordinatorConfig

    o = _options(args, EXISTING_FILE_KEYS)
    config = CoordinatorConfig(
        db=o.db, key_file=o.key, mqtt_host=o.mqtt_host, mqtt_port=o.mqtt_port, client_id=o.client_id,
        shared_group=o.share_group, batch_size=o.batch_size, batch_ms=o.batch_ms,
        replay_window=o.replay_window, http_host=o.http_host, http_port=o.http_port,
        devices_file=o.devices, mqtt_username=o.mqtt_username, mqtt_password=o.mqtt_password,
        mqtt_tls_ca=o.mqtt_ca, mqtt_tls_cert=o.mqtt_cert, mqtt_tls_key=o.mqtt_key, mqtt_tls=o.mqtt_tls,
        mqtt_protocol=o.mqtt_protocol, api_tokens_file=o.api_tokens, flood_max_messages=o.flood_max_messages,
        flood_max_rejections=o.flood_max_rejections, flood_window_s=o.flood_window_s,
        broker_quarantine=o.broker_quarantine,
    )
    try:
        coord = Coordinator(config)
    except ValueError as exc:
        print(f"haarvest coordinator run: {exc}", file=sys.stderr)
        return 2
    try:
        coord.start()
    except ValueError as exc:  # e.g. an API token file without a usable token
        coord.close()
        print(f"haarvest coordinator run: {exc}", file=sys.stderr)
        return 2
    except (TimeoutError, RuntimeError, OSError) as exc:  # no subscription; receiver exited; TLS file or option
        coord.close()
        tls = " with TLS" if o.tls else ""
        print(f"haarvest coordinator run: {exc} (broker {o.mqtt_host}:{o.mqtt_port}{tls}: is it running, and does "
              "it accept this client — certificate, user name, ACL?)", file=sys.stderr)
        return 1
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    print(json.dumps({"status": "ready", "http": coord.http_url, "api_tokens": getattr(coord, "api_tokens_file", None),
                      "coordinator_public_key": coord.public_key}), flush=True)
    try:
        while not done.wait(1.0):
            pass
    finally:
        coord.close()
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    """Print the effective run options (defaults < file < command line) as JSON, the password masked; exit 2 on a
    bad file or option, or a CA / certificate / key / devices file that cannot be read."""
    from coordinator.run_config import EXISTING_FILE_KEYS

    o = _options(args, EXISTING_FILE_KEYS)
    shown = o.model_dump()
    if shown["mqtt_password"] is not None:
        shown["mqtt_password"] = "***"
    shown["tls"] = o.tls
    print(json.dumps(shown, indent=1))
    return 0


def cmd_enroll(args: argparse.Namespace) -> int:
    from coordinator.service import DeviceRecord, parse_contract, read_device_records
    from protocols import wire

    try:
        if args.json:
            source = json.loads(sys.stdin.read()) if args.json == "-" else args.json
            records = read_device_records(source)
        elif args.id and args.pubkey:
            streams = None if args.streams is None else [s for s in args.streams.split(",") if s]
            records = [DeviceRecord(args.id, args.pubkey, parse_contract(streams))]
        else:
            print("give --id and --pubkey, or --json FILE (what `haarvest agent enroll` prints)", file=sys.stderr)
            return 2
        for rec in records:
            if not re.match(wire.IDENT, rec.device_id):
                raise ValueError(f"bad device id {rec.device_id!r}")
            wire.load_registry_key(rec.public_key)
    except (OSError, ValueError) as exc:  # nothing is stored unless every record is good
        print(f"error: {exc}", file=sys.stderr)
        return 2
    store = _store(args, create=True)
    try:
        for rec in records:
            store.upsert_device(rec.device_id, rec.public_key.strip(), "revoked" if args.revoke else "active",
                                contract=rec.contract)
    finally:
        store.close()
    unbound = [r.device_id for r in records if r.contract is None]
    if unbound and not args.revoke:
        print(f"warning: {len(unbound)} device(s) enrolled without a stream contract (any stream of a round is "
              f"accepted from them): {', '.join(unbound[:5])}", file=sys.stderr)
    print(json.dumps({"enrolled" if not args.revoke else "revoked": [r.device_id for r in records]}))
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    from coordinator.service import device_rows

    store = _store(args)
    try:
        for device_id, status in ((args.release, "active"), (args.quarantine, "quarantined")):
            if device_id:
                try:
                    store.set_device_status(device_id, status)
                except ValueError as exc:
                    print(f"error: {exc}", file=sys.stderr)
                    return 2
        rows = device_rows(store)
    finally:
        store.close()
    print(json.dumps(rows, indent=1))
    return 0


_OWN_CERT = ("publishing rounds needs the round publisher's own certificate (rounds_cert and rounds_key, CN "
             "coordinator-rounds): with the ingest's certificate the broker would hand this connection the ingest's "
             "session")


def _mqtt_connect(o: "RunOptions", protocol: int):  # noqa: ANN202 - paho Client
    """A connected paho client (network loop running) with the options' TLS and credentials, or PublishError."""
    import secrets as _secrets
    import ssl

    from protocols.mqtt import new_client

    # Never the ingest's identity: a second connection with it would take over (clean start: wipe) the
    # coordinator's session. With client certificates the broker binds the client id to the certificate's CN
    # (deploy/mosquitto/haarvest.conf), so the round publisher presents its own (cmd_rounds refuses without one).
    # Not a persistent session: it publishes retained messages and disconnects.
    client = new_client(f"haarvest-rounds-{_secrets.token_hex(4)}", protocol, persistent=False,
                        username=o.mqtt_username, password=o.mqtt_password, tls=o.tls, ca_certs=o.mqtt_ca,
                        certfile=o.rounds_cert, keyfile=o.rounds_key)
    answered = threading.Event()
    result: dict[str, Any] = {}

    def on_connect(_c, _u, _flags, reason_code, _props) -> None:  # noqa: ANN001
        result.setdefault("connack", reason_code)
        answered.set()

    def on_disconnect(_c, _u, _flags, reason_code, _props) -> None:  # noqa: ANN001
        result.setdefault("closed", reason_code)
        answered.set()

    client.on_connect, client.on_disconnect = on_connect, on_disconnect
    where = f"{o.mqtt_host}:{o.mqtt_port}" + (" (TLS)" if o.tls else "")
    try:
        client.connect(o.mqtt_host, o.mqtt_port, keepalive=30)
    except (OSError, ssl.SSLError) as exc:  # refused, unreachable, TLS handshake failed (certificate, CA, name)
        raise PublishError(f"cannot connect to {where}: {exc}") from None
    client.loop_start()
    answered.wait(PUBLISH_TIMEOUT)
    connack = result.get("connack")
    if connack is None or connack.is_failure:
        client.loop_stop()
        why = connack if connack is not None else result.get("closed", f"no answer in {PUBLISH_TIMEOUT:g} s")
        raise PublishError(f"the broker at {where} did not accept the connection: {why}")
    return client


def _publish_rounds(o: "RunOptions", items: list[tuple[str, bytes]]) -> None:
    """Publish ``(topic, payload)`` retained at QoS 1 and wait for every PUBACK; PublishError if the connection
    fails or the broker refuses a message (MQTT 5 reason code, e.g. "Not authorized" from the ACL). ``"auto"``
    tries MQTT 5, then 3.1.1 after any failure to connect."""
    from protocols.mqtt import attempts

    protocols = attempts(o.mqtt_protocol)
    for i, protocol in enumerate(protocols):
        try:
            client = _mqtt_connect(o, protocol)
            break
        except PublishError:
            if i == len(protocols) - 1:
                raise
    acks: dict[int, Any] = {}
    client.on_publish = lambda _c, _u, mid, reason_code, _p: acks.__setitem__(mid, reason_code)
    try:
        for topic, payload in items:
            info = client.publish(topic, payload, qos=1, retain=True)
            try:
                info.wait_for_publish(PUBLISH_TIMEOUT)
            except (RuntimeError, ValueError) as exc:  # connection lost
                raise PublishError(f"{topic}: {exc}") from None
            if not info.is_published():
                raise PublishError(f"{topic}: no PUBACK in {PUBLISH_TIMEOUT:g} s")
            reason = acks.get(info.mid)
            if reason is not None and reason.is_failure:
                raise PublishError(f"the broker refused {topic}: {reason}")
    finally:
        client.disconnect()
        client.loop_stop()


def cmd_rounds(args: argparse.Namespace) -> int:
    from coordinator.rounds import RoundManager
    from coordinator.service import load_or_create_key
    from coordinator.store import open_store

    publishing = args.rounds_cmd != "list" and not args.no_publish
    o = _options(args, ("mqtt_ca", "mqtt_cert", "mqtt_key", "rounds_cert", "rounds_key") if publishing else ())
    if publishing and o.mqtt_cert is not None and o.rounds_cert is None:
        print(f"haarvest coordinator rounds {args.rounds_cmd}: nothing changed: {_OWN_CERT}", file=sys.stderr)
        return 2
    store = open_store(o.db)
    try:
        published: list[tuple[str, bytes]] = []
        publish = (lambda t, p, r: published.append((t, p))) if publishing else None
        manager = RoundManager(store, load_or_create_key(o.key), publish=publish)
        if args.rounds_cmd == "list":
            rows = manager.list()
            print(json.dumps(rows if args.full else [{k: v for k, v in r.items() if k != "config"} for r in rows],
                             indent=1))
        elif args.rounds_cmd == "open":
            cfg = manager.open_round(args.id, args.epsilon, _load_json_arg(args.params), protocol=args.protocol,
                                     depends_on=args.depends_on or [], not_after=args.not_after)
            print(cfg.to_bytes().decode())
        elif args.rounds_cmd == "close":
            manager.close_round(args.id)
            print(json.dumps({"closed": args.id}))
        elif args.rounds_cmd == "next":
            from coordinator.estimate import estimate_round

            history = [(rid, estimate_round(store, rid)) for rid in args.after]
            base = _load_json_arg(args.params) if args.params else manager.get(args.after[-1]).params
            base = _with_selection(base, args.threshold, args.top_k)
            cfg = manager.open_next_round(args.id, args.epsilon, base, history)
            print(cfg.to_bytes().decode())
        elif args.rounds_cmd == "publish":
            manager.republish()
        if published:
            try:
                _publish_rounds(o, published)
            except PublishError as exc:
                stored = "" if args.rounds_cmd == "publish" else \
                    "the change is stored, but devices have not been told: "
                print(f"haarvest coordinator rounds {args.rounds_cmd}: {stored}{exc}\n"
                      "  retry with `haarvest coordinator rounds publish` (same options) once the broker accepts "
                      "this client", file=sys.stderr)
                return 1
    finally:
        store.close()
    return 0


def _with_selection(base: Any, threshold: float | None, top_k: int | None) -> Any:
    """``base`` round params with every heavy-hitter stream's ``threshold`` / ``top_k`` set (those given)."""
    if threshold is None and top_k is None:
        return base
    from protocols.contract import parse_round_params
    from protocols.heavy_hitters import check_selection

    check_selection(threshold, top_k)
    params = parse_round_params(base)
    if not any(spec.heavy_hitters is not None for spec in params.streams.values()):
        raise ValueError("--threshold and --top-k select heavy hitters, and no stream of the round has heavy_hitters")
    given = {k: v for k, v in (("threshold", threshold), ("top_k", top_k)) if v is not None}
    streams = {name: spec if spec.heavy_hitters is None else
               spec.model_copy(update={"heavy_hitters": spec.heavy_hitters.model_copy(update=given)})
               for name, spec in params.streams.items()}
    return params.model_copy(update={"streams": streams}).model_dump(mode="json", exclude_none=True)


def cmd_estimate(args: argparse.Namespace) -> int:
    from coordinator.estimate import estimate_round

    store = _store(args)
    try:
        result = estimate_round(store, args.round, level=args.level, variance=args.variance,
                                consistency=not args.no_consistency)
    finally:
        store.close()
    if args.json:
        print(json.dumps({k: v.to_dict() for k, v in result.items()}, indent=1))
        return 0
    for name, est in result.items():
        dropped = f", {est.dropped} invalid reports dropped" if est.dropped else ""
        print(f"== {args.round}/{name} ({est.kind}, {est.mechanism}, n={est.n}{dropped})")
        if est.error:
            print(f"   error: {est.error}")
            continue
        for label, e, lo, hi in zip(est.labels, est.estimate, est.ci_low, est.ci_high):
            print(f"   {label:>16}  {e:12.6g}   [{lo:.6g}, {hi:.6g}]")
        if est.heavy_hitters:
            print("   heavy hitters: " + ", ".join(f"{h['label']} ({h['frequency']:.4g})" for h in est.heavy_hitters))
    return 0


def cmd_aggregates(args: argparse.Namespace) -> int:
    from coordinator.aggregates import check_aggregates

    store = _store(args)
    try:
        checks = check_aggregates(store, args.round or None, rebuild=args.rebuild)
    finally:
        store.close()
    for c in checks:
        kept = "-" if c.stored_n is None else str(c.stored_n)
        print(f"{c.round_id}/{c.stream}: {c.status} (aggregated n={kept}, stored reports n={c.reports_n})")
    bad = [c for c in checks if c.status in ("differ", "stale")]
    if bad and not args.rebuild:
        print(f"{len(bad)} stream(s) to rebuild: haarvest coordinator aggregates --rebuild", file=sys.stderr)
        return 1
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    store = _store(args)
    out = open(args.out, "w", newline="") if args.out else sys.stdout
    try:
        if args.format == "jsonl":
            for rep in store.iter_reports(args.round):
                out.write(json.dumps(rep.as_dict(), sort_keys=True) + "\n")
        else:
            writer = csv.writer(out)
            writer.writerow(["device_id", "seq", "boot", "round_id", "stream", "mechanism", "body", "sig",
                             "received_at"])
            for rep in store.iter_reports(args.round):
                writer.writerow(rep.as_tuple())
    finally:
        store.close()
        if args.out:
            out.close()
    return 0


def _option(sp: argparse.ArgumentParser, name: str, help: str | None = None, **kw: Any) -> None:
    """``--name`` for the option ``name`` of :class:`coordinator.run_config.RunOptions`: left out of the namespace
    unless given (so a ``--config`` file can supply it); the help shows the built-in default."""
    from coordinator.run_config import RunOptions

    field = RunOptions.model_fields[name]
    text = help or field.description or ""
    if field.default is not None and field.default is not False:
        text = f"{text} (default {field.default})".strip()
    sp.add_argument("--" + name.replace("_", "-"), dest=name, default=argparse.SUPPRESS, help=text or None, **kw)


CONFIG_HELP = ("TOML file of options: keys = the long options of `coordinator run` (mqtt_port = 8883, …); options "
               "given on the command line override it (docs/coordinator.md)")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("coordinator", help="the coordinator: ingest, rounds, estimates")
    sub = p.add_subparsers(dest="coordinator_cmd", required=True)

    def db(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", metavar="FILE", default=None, help=CONFIG_HELP)
        _option(sp, "db", metavar="DB")

    def mqtt(sp: argparse.ArgumentParser) -> None:
        _option(sp, "mqtt_host")
        _option(sp, "mqtt_port", type=int)
        _option(sp, "mqtt_username")
        _option(sp, "mqtt_password")
        _option(sp, "mqtt_tls", action=argparse.BooleanOptionalAction,
                help="connect with TLS (implied by --mqtt-ca or --mqtt-cert; without --mqtt-ca: the system's CAs)")
        _option(sp, "mqtt_ca", help="CA certificate (PEM) of the broker: connect with TLS", metavar="FILE")
        _option(sp, "mqtt_cert", help="client certificate (PEM) to present to the broker, e.g. CN coordinator "
                "from `haarvest pki client --id coordinator`; with --mqtt-key", metavar="FILE")
        _option(sp, "mqtt_key", help="the client certificate's private key (PEM)", metavar="FILE")
        _option(sp, "mqtt_protocol", choices=("5", "3.1.1", "auto"),
                help="MQTT protocol version (3.1.1 for brokers such as amqtt)")
        _option(sp, "rounds_cert", metavar="FILE")
        _option(sp, "rounds_key", metavar="FILE")

    def run_options(sp: argparse.ArgumentParser) -> None:
        db(sp)
        mqtt(sp)
        _option(sp, "key", metavar="FILE")
        _option(sp, "client_id")
        _option(sp, "share_group", metavar="GROUP")
        _option(sp, "batch_size", type=int, help="reports validated and committed per transaction at most")
        _option(sp, "batch_ms", type=float, help="milliseconds a batch waits to fill up")
        _option(sp, "replay_window", type=int)
        _option(sp, "http_host")
        _option(sp, "http_port", type=int, metavar="PORT")
        _option(sp, "api_tokens", metavar="FILE")
        _option(sp, "flood_max_messages", type=int, metavar="N")
        _option(sp, "flood_max_rejections", type=int, metavar="N")
        _option(sp, "flood_window_s", type=float, metavar="S")
        _option(sp, "devices", metavar="FILE")

    run = sub.add_parser("run", help="ingest reports over MQTT and serve the HTTP API until SIGTERM")
    run_options(run)
    run.set_defaults(func=cmd_run)

    check = sub.add_parser("check-config", help="validate the run options (--config FILE and flags), print them")
    run_options(check)
    check.set_defaults(func=cmd_check_config)

    en = sub.add_parser("enroll-device", help="register a device's Ed25519 public key")
    db(en)
    en.add_argument("--id", help="device id (with --pubkey, instead of --json)")
    en.add_argument("--pubkey", help="the device's report key: Ed25519 public key, base64 (with --id)")
    en.add_argument("--json", help="file with the JSON `haarvest agent enroll` prints (or a list of them); - = stdin")
    en.add_argument("--streams", help="with --id: the streams the device may report, comma-separated (its "
                                      "contract; `agent enroll` prints it)")
    en.add_argument("--revoke", action="store_true", help="mark the device(s) revoked instead")
    en.set_defaults(func=cmd_enroll)

    dv = sub.add_parser("devices", help="list enrolled devices: status, contract, stored and receipted reports, "
                                        "rejections by reason")
    db(dv)
    dv.add_argument("--release", metavar="ID", help="end a device's quarantine (the running coordinator lifts "
                                                    "the broker cut-off within seconds)")
    dv.add_argument("--quarantine", metavar="ID", help="quarantine a device by hand")
    dv.set_defaults(func=cmd_devices)

    rd = sub.add_parser("rounds", help="list, open, close, plan and publish rounds")
    rsub = rd.add_subparsers(dest="rounds_cmd", required=True)
    for name, helptext in [("list", "list rounds"), ("open", "open a round"), ("close", "close a round"),
                           ("next", "open an adaptive round planned from earlier rounds' estimates"),
                           ("publish", "publish every open round again (retained)")]:
        sp = rsub.add_parser(name, help=helptext)
        db(sp)
        mqtt(sp)
        _option(sp, "key", metavar="FILE", help="round-signing key file")
        sp.add_argument("--no-publish", action="store_true", help="store only; do not publish to the broker")
        if name == "list":
            sp.add_argument("--full", action="store_true", help="include each round's signed configuration")
        if name in ("open", "close", "next"):
            sp.add_argument("--id", required=True, help="round id (letters, digits, ._-)")
        if name in ("open", "next"):
            sp.add_argument("--epsilon", type=float, required=True,
                            help="the most ε the round may ask of a device (its streams' ε must fit)")
            sp.add_argument("--params", required=name == "open", help="RoundParams JSON, or @file")
            sp.add_argument("--protocol", default="telemetry", help="free-form protocol label (default %(default)s)")
        if name == "open":
            sp.add_argument("--depends-on", nargs="*", help="earlier rounds whose aggregates planned this one")
            sp.add_argument("--not-after", type=float, default=None,
                            help="Unix time after which devices no longer answer the round")
        if name == "next":
            sp.add_argument("--after", nargs="+", required=True, help="earlier rounds, oldest first")
            sp.add_argument("--threshold", type=float, default=None,
                            help="heavy hitters: keep the items whose estimated frequency reaches this (0..1) "
                                 "instead of those significantly above zero (3 standard errors); carried onward")
            sp.add_argument("--top-k", dest="top_k", type=int, default=None,
                            help="heavy hitters: keep at most the k best items passing the threshold at each "
                                 "extension step (default: up to 16); carried onward")
        sp.set_defaults(func=cmd_rounds)

    es = sub.add_parser("estimate", help="estimates with confidence intervals for a round")
    db(es)
    es.add_argument("round", help="round id")
    es.add_argument("--level", type=float, default=0.95, help="confidence level of the intervals (default %(default)s)")
    es.add_argument("--variance", choices=["plugin", "worst"], default="plugin",
                    help="interval variance: plugin (estimated from the reports) or worst (the worst case over inputs)")
    es.add_argument("--no-consistency", action="store_true",
                    help="the unbiased estimates, without clipping to the bounds or projecting onto the simplex")
    es.add_argument("--json", action="store_true", help="print JSON instead of a table")
    es.set_defaults(func=cmd_estimate)

    ag = sub.add_parser("aggregates", help="check the aggregates kept at ingest against the stored reports; "
                                           "--rebuild recomputes them from the reports")
    db(ag)
    ag.add_argument("round", nargs="*", help="round ids (default: every round)")
    ag.add_argument("--rebuild", action="store_true",
                    help="replace the aggregates by those recomputed from the stored reports (writes held off)")
    ag.set_defaults(func=cmd_aggregates)

    ex = sub.add_parser("export", help="export stored reports (JSON lines or CSV)")
    db(ex)
    ex.add_argument("round", nargs="?", default=None, help="round id (default: every round)")
    ex.add_argument("--format", choices=["jsonl", "csv"], default="jsonl", help="output format (default %(default)s)")
    ex.add_argument("--out", default=None, help="output file (default: stdout)")
    ex.set_defaults(func=cmd_export)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="haarvest")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
