"""``haarvest coordinator …``: run the coordinator, enroll devices, manage rounds, estimate, export."""

from __future__ import annotations

import argparse
import csv
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["register", "main"]

DEFAULT_DB = "haarvest-coordinator.db"
DEFAULT_KEY = "coordinator.key"


def _load_json_arg(text: str) -> Any:
    """A JSON literal, or ``@path`` / a path to a JSON file."""
    p = Path(text[1:] if text.startswith("@") else text)
    if text.startswith("@") or (not text.lstrip().startswith(("{", "[")) and p.exists()):
        return json.loads(p.read_text())
    return json.loads(text)


def _store(args: argparse.Namespace):  # noqa: ANN202
    from coordinator.store import open_store

    return open_store(args.db)


def cmd_run(args: argparse.Namespace) -> int:
    from coordinator.service import Coordinator, CoordinatorConfig

    config = CoordinatorConfig(
        db=args.db, key_file=args.key, mqtt_host=args.mqtt_host, mqtt_port=args.mqtt_port, client_id=args.client_id,
        shared_group=args.share_group, batch_size=args.batch_size, batch_ms=args.batch_ms,
        replay_window=args.replay_window, http_host=args.http_host, http_port=args.http_port,
        devices_file=args.devices, mqtt_username=args.mqtt_username, mqtt_password=args.mqtt_password,
        mqtt_tls_ca=args.mqtt_ca, mqtt_protocol=args.mqtt_protocol,
    )
    coord = Coordinator(config)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    coord.start()
    print(json.dumps({"status": "ready", "http": coord.http_url, "coordinator_public_key": coord.public_key}),
          flush=True)
    try:
        while not done.wait(1.0):
            pass
    finally:
        coord.close()
    return 0


def cmd_enroll(args: argparse.Namespace) -> int:
    from coordinator.service import read_device_records
    from protocols import wire

    if args.json:
        source = json.loads(sys.stdin.read()) if args.json == "-" else args.json
        records = read_device_records(source)
    elif args.id and args.pubkey:
        records = [(args.id, args.pubkey)]
    else:
        print("give --id and --pubkey, or --json FILE (what `haarvest agent enroll` prints)", file=sys.stderr)
        return 2
    import re

    store = _store(args)
    try:
        for device_id, pub in records:
            if not re.match(wire.IDENT, device_id):
                raise ValueError(f"bad device id {device_id!r}")
            wire.load_public_key(pub)
            store.upsert_device(device_id, pub, "revoked" if args.revoke else "active")
    finally:
        store.close()
    print(json.dumps({"enrolled" if not args.revoke else "revoked": [d for d, _ in records]}))
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    store = _store(args)
    try:
        devices = store.devices()
    finally:
        store.close()
    print(json.dumps([{"device_id": d, "public_key": k, "status": s} for d, (k, s) in sorted(devices.items())],
                     indent=1))
    return 0


def _publish_rounds(host: str, port: int, items: list[tuple[str, bytes]]) -> None:
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.connect(host, port)
    client.loop_start()
    try:
        for topic, payload in items:
            client.publish(topic, payload, qos=1, retain=True).wait_for_publish(10)
    finally:
        client.disconnect()
        client.loop_stop()


def cmd_rounds(args: argparse.Namespace) -> int:
    from coordinator.rounds import RoundManager
    from coordinator.service import load_or_create_key

    store = _store(args)
    try:
        published: list[tuple[str, bytes]] = []
        publish = None if args.rounds_cmd == "list" or args.no_publish else \
            (lambda t, p, r: published.append((t, p)))
        manager = RoundManager(store, load_or_create_key(args.key), publish=publish)
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
            cfg = manager.open_next_round(args.id, args.epsilon, base, history)
            print(cfg.to_bytes().decode())
        elif args.rounds_cmd == "publish":
            manager.republish()
        if published:
            _publish_rounds(args.mqtt_host, args.mqtt_port, published)
    finally:
        store.close()
    return 0


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


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("coordinator", help="the coordinator: ingest, rounds, estimates")
    sub = p.add_subparsers(dest="coordinator_cmd", required=True)

    def db(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--db", default=DEFAULT_DB, help="SQLite path or postgresql:// URL (default %(default)s)")

    def mqtt(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--mqtt-host", default="127.0.0.1")
        sp.add_argument("--mqtt-port", type=int, default=1883)

    run = sub.add_parser("run", help="ingest reports over MQTT and serve the HTTP API until SIGTERM")
    db(run)
    mqtt(run)
    run.add_argument("--key", default=DEFAULT_KEY, help="round-signing key file (created if missing)")
    run.add_argument("--client-id", default="haarvest-coordinator")
    run.add_argument("--share-group", default=None, help="MQTT v5 shared-subscription group for several workers")
    run.add_argument("--batch-size", type=int, default=1000)
    run.add_argument("--batch-ms", type=float, default=20.0)
    run.add_argument("--replay-window", type=int, default=0)
    run.add_argument("--http-host", default="127.0.0.1")
    run.add_argument("--http-port", type=int, default=None, help="serve the API/dashboard on this port (0: any)")
    run.add_argument("--devices", default=None, help="JSON file of devices to enroll at start")
    run.add_argument("--mqtt-username", default=None)
    run.add_argument("--mqtt-password", default=None)
    run.add_argument("--mqtt-ca", default=None, help="CA certificate: connect with TLS")
    run.add_argument("--mqtt-protocol", choices=("5", "3.1.1", "auto"), default="5",
                     help="MQTT protocol version (3.1.1 for brokers such as amqtt; default %(default)s)")
    run.set_defaults(func=cmd_run)

    en = sub.add_parser("enroll-device", help="register a device's Ed25519 public key")
    db(en)
    en.add_argument("--id")
    en.add_argument("--pubkey")
    en.add_argument("--json", help="file with the JSON `haarvest agent enroll` prints (or a list of them); - = stdin")
    en.add_argument("--revoke", action="store_true", help="mark the device(s) revoked instead")
    en.set_defaults(func=cmd_enroll)

    dv = sub.add_parser("devices", help="list enrolled devices")
    db(dv)
    dv.set_defaults(func=cmd_devices)

    rd = sub.add_parser("rounds", help="list, open, close, plan and publish rounds")
    rsub = rd.add_subparsers(dest="rounds_cmd", required=True)
    for name, helptext in [("list", "list rounds"), ("open", "open a round"), ("close", "close a round"),
                           ("next", "open an adaptive round planned from earlier rounds' estimates"),
                           ("publish", "publish every open round again (retained)")]:
        sp = rsub.add_parser(name, help=helptext)
        db(sp)
        mqtt(sp)
        sp.add_argument("--key", default=DEFAULT_KEY)
        sp.add_argument("--no-publish", action="store_true", help="store only; do not publish to the broker")
        if name == "list":
            sp.add_argument("--full", action="store_true")
        if name in ("open", "close", "next"):
            sp.add_argument("--id", required=True)
        if name in ("open", "next"):
            sp.add_argument("--epsilon", type=float, required=True)
            sp.add_argument("--params", required=name == "open", help="RoundParams JSON, or @file")
            sp.add_argument("--protocol", default="telemetry")
        if name == "open":
            sp.add_argument("--depends-on", nargs="*")
            sp.add_argument("--not-after", type=float, default=None)
        if name == "next":
            sp.add_argument("--after", nargs="+", required=True, help="earlier rounds, oldest first")
        sp.set_defaults(func=cmd_rounds)

    es = sub.add_parser("estimate", help="estimates with confidence intervals for a round")
    db(es)
    es.add_argument("round")
    es.add_argument("--level", type=float, default=0.95)
    es.add_argument("--variance", choices=["plugin", "worst"], default="plugin")
    es.add_argument("--no-consistency", action="store_true")
    es.add_argument("--json", action="store_true")
    es.set_defaults(func=cmd_estimate)

    ex = sub.add_parser("export", help="export stored reports (JSON lines or CSV)")
    db(ex)
    ex.add_argument("round", nargs="?", default=None)
    ex.add_argument("--format", choices=["jsonl", "csv"], default="jsonl")
    ex.add_argument("--out", default=None)
    ex.set_defaults(func=cmd_export)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="haarvest")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
