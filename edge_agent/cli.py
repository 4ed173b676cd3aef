"""``haarvest agent run | check-config | enroll | status | ledger``.

Exit codes: 0 success, 2 bad configuration / secrets, 1 other failures. ``run`` logs JSON lines to stderr,
stops gracefully on SIGTERM/SIGINT (drains the outbox for up to ``--drain-timeout`` seconds) and speaks the
systemd notify protocol when ``NOTIFY_SOCKET`` is set (READY=1, WATCHDOG=1, STOPPING=1).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["register", "main"]

DEFAULT_CONFIG = "/etc/haarvest/agent.toml"


def _load(args: argparse.Namespace) -> Any:
    from .config import load_config

    return load_config(args.config)


def _fail(msg: str, code: int = 2) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return code


def cmd_check_config(args: argparse.Namespace) -> int:
    from .config import ConfigError, load_secrets
    from .plans import build_stream_plan

    try:
        cfg = _load(args)
        plans = {s.name: build_stream_plan(cfg, s) for s in cfg.effective_streams()}
        cfg.coordinator_key()
    except ConfigError as exc:
        return _fail(str(exc))
    summary: dict[str, Any] = {
        "ok": True,
        "device_id": cfg.device_id,
        "state_dir": str(cfg.state_dir),
        "schedule": cfg.schedule,
        "streams": {
            n: {"dimensions": list(p.config.dimensions), "mechanism": p.mechanism_name, "params": p.params,
                "epsilon": p.epsilon, "cap": p.cap, **({"delta": p.delta} if p.delta else {})}
            for n, p in plans.items()
        },
        "ledger": cfg.ledger.model_dump(mode="json"),
        "mqtt": None if cfg.mqtt is None else f"{cfg.mqtt.host}:{cfg.mqtt.port} (protocol {cfg.mqtt.protocol})",
        "warnings": [],
    }
    try:
        load_secrets(cfg)
        summary["secrets"] = "ok"
    except ConfigError as exc:
        summary["secrets"] = str(exc)
        summary["warnings"].append("secrets missing or unreadable: run `haarvest agent enroll`")
    if cfg.sources and not args.no_source_check:
        from protocols.errors import InvalidRecord

        from .pipeline import Pipeline
        from .sources import SourceError, build_sources

        try:  # a source that cannot produce a configured dimension here would drop every reading: fail now
            reading = build_sources(cfg.sources, cfg.device_id).read()
            if reading is None:
                summary["ok"] = False
                summary["warnings"].append("the source returned no reading on this host")
            else:
                Pipeline(cfg, b"\0" * 32).validate(reading)
        except (SourceError, InvalidRecord) as exc:
            summary["ok"] = False
            summary["warnings"].append(f"a test reading failed on this host (the agent would drop every such "
                                       f"reading): {exc}")
        try:
            summary["warnings"] += replay_warnings(cfg)
        except SourceError as exc:
            summary["warnings"].append(str(exc))
    identity = certificate_mismatch(cfg)
    if identity:
        summary["ok"] = False
        summary["warnings"].append(identity)
    summary["round_params"] = {"streams": {n: p.stream_spec() for n, p in plans.items()}}
    print(json.dumps(summary, indent=2, default=str))
    return 0 if summary["ok"] else 1


def certificate_mismatch(cfg: Any) -> str | None:
    """Why the MQTT client certificate cannot carry this device's reports, or None: the broker's ACL binds a
    device's topics to its certificate's common name, so the CN must equal ``device_id``."""
    mq = cfg.mqtt
    if mq is None or mq.cert_file is None:
        return None
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    try:
        cert = x509.load_pem_x509_certificate(Path(mq.cert_file).read_bytes())
    except (OSError, ValueError) as exc:
        return f"mqtt.cert_file {mq.cert_file}: cannot read the certificate ({exc})"
    names = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if names != [cfg.device_id]:
        return (f"mqtt.cert_file {mq.cert_file} is issued to CN={','.join(map(str, names)) or '(none)'}, not to "
                f"device_id {cfg.device_id!r}: the broker's ACL would refuse this device's reports "
                f"(haarvest pki client --id {cfg.device_id})")
    return None


def replay_warnings(cfg: Any, max_rows: int = 1_000_000) -> list[str]:
    """Scan each replay file (once, at most ``max_rows`` rows) for values the agent would clip (numeric values
    outside the declared bounds) or drop (not a number, not finite, not a category): one warning per dimension
    and file, with counts, the observed range and the first offending line."""
    from protocols.errors import InvalidRecord

    from .readings import check_value
    from .sources import ReplaySource

    out: list[str] = []
    for sc in cfg.sources:
        if sc.kind != "replay":
            continue
        src = ReplaySource(sc.path, format=sc.format, time_column=sc.time_column, device_column=sc.device_column,
                           device=cfg.device_id if sc.device_column else None)
        outside: dict[str, list[Any]] = {}  # name -> [count, first line, min, max]
        invalid: dict[str, list[Any]] = {}  # name -> [count, first line, first value shown]
        rows = 0
        while rows < max_rows:
            reading = src.read()
            if reading is None:
                break
            rows += 1
            for d in cfg.dimensions:
                if reading.get(d.field) is None:
                    continue
                try:
                    x = check_value(d, reading[d.field])  # the agent's own rule
                except InvalidRecord as exc:
                    invalid.setdefault(d.name, [0, src.line, exc.shown_value()])[0] += 1
                    continue
                if d.kind == "numeric" and not d.lo <= x <= d.hi:
                    rec = outside.setdefault(d.name, [0, src.line, x, x])
                    rec[0] += 1
                    rec[2], rec[3] = min(rec[2], x), max(rec[3], x)
        for name, (n, line, lo, hi) in outside.items():
            d = cfg.dimension(name)
            out.append(f"{sc.path}: {name}: {n} of {rows} values outside its bounds [{d.lo:g}, {d.hi:g}] (seen "
                       f"{lo:g} to {hi:g}; first at line {line}): the agent clips them")
        for name, (n, line, shown) in invalid.items():
            out.append(f"{sc.path}: {name}: {n} of {rows} values are not valid (first at line {line}: {shown}): "
                       "the agent drops those records")
    return out


def cmd_enroll(args: argparse.Namespace) -> int:
    from .config import ConfigError, create_secrets, load_secrets
    from .embed import enrolment

    try:
        cfg = _load(args)
    except ConfigError as exc:
        return _fail(str(exc))
    try:
        secrets = create_secrets(cfg, overwrite=args.force, signature=args.signature)
        created = True
    except ConfigError as exc:
        return _fail(str(exc))
    except FileExistsError as exc:
        if args.force:
            return _fail(str(exc), 1)
        try:
            secrets = load_secrets(cfg)
        except ConfigError as exc2:
            return _fail(f"{exc}; and the existing files cannot be used: {exc2}")
        created = False
    print(
        json.dumps(
            {
                **enrolment(cfg, secrets),  # id, key, algorithm and the stream contract
                "created": created,
                "signing_key_file": str(cfg.signing_key_path),
                "hmac_secret_file": str(cfg.hmac_secret_path),
            },
            indent=2,
        )
    )
    return 0


def _open_state(args: argparse.Namespace) -> Any:
    from .state import State

    cfg = _load(args)
    if not cfg.database_path.exists():
        raise FileNotFoundError(f"no agent database at {cfg.database_path} (has the agent run?)")
    return cfg, State(cfg.database_path)


def cmd_status(args: argparse.Namespace) -> int:
    from .config import ConfigError

    try:
        cfg, state = _open_state(args)
    except (ConfigError, FileNotFoundError) as exc:
        return _fail(str(exc))
    with state:
        out = state.status()
        out["device_id"] = cfg.device_id
        out["caps"] = {"total": cfg.ledger.total_cap, "renewal_period_s": cfg.ledger.renewal_period_s,
                       "streams": {s.name: cfg.stream_cap(s) for s in cfg.effective_streams()}}
        out["invariants"] = state.check_invariants()
        out["privacy_units"] = _privacy_units(cfg)
        if args.integrity:
            out["integrity_check"] = state.integrity_check()
    print(json.dumps(out, indent=2, default=str))
    return 0 if out["invariants"]["ok"] and out.get("integrity_check", ["ok"]) == ["ok"] else 1


def _privacy_units(cfg: Any) -> dict[str, Any]:
    """Per stream: the privacy unit its charges are true for, the charge, and what the unit does not hide."""
    from protocols.errors import ConfigError

    from .plans import build_stream_plan, privacy_statement

    out: dict[str, Any] = {}
    for s in cfg.effective_streams():
        try:
            out[s.name] = privacy_statement(build_stream_plan(cfg, s))
        except ConfigError as exc:
            out[s.name] = {"error": str(exc)}
    return out


def cmd_reset_ledger(args: argparse.Namespace) -> int:
    from .config import ConfigError, load_secrets
    from .ledger_guard import mark_key, reset_ledger

    try:
        cfg = _load(args)
    except ConfigError as exc:
        return _fail(str(exc))
    if not args.yes:
        return _fail("reset-ledger starts a new privacy ledger with a full budget; it is recorded (ledger.resets, the "
                     "new database, the coordinator sees the device's boot) — confirm with --yes")
    try:  # the new mark is authenticated with the device's secret (enrolled devices have one)
        key = mark_key(load_secrets(cfg).hmac_secret)
    except ConfigError:
        key = None
    record = reset_ledger(cfg.database_path, reason=args.reason or "", next_seq=args.next_seq, key=key)
    print(json.dumps(record, indent=2))
    return 0


def cmd_ledger(args: argparse.Namespace) -> int:
    from .config import ConfigError

    try:
        _, state = _open_state(args)
    except (ConfigError, FileNotFoundError) as exc:
        return _fail(str(exc))
    with state:
        for row in state.ledger_rows(stream=args.stream, limit=args.limit):
            print(json.dumps(row))
        if args.total:
            print(json.dumps({"total": state.spent(args.stream), "by_stream": state.spent_by_stream(),
                              "by_unit": state.spent_by_unit(), "delta_total": state.spent_delta()}))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .agent import Agent
    from .config import ConfigError
    from .logs import setup_logging
    from .sources import SourceError
    from .systemd import Notifier

    setup_logging(args.log_level)
    from .ledger_guard import LedgerIntegrityError

    try:
        cfg = _load(args)
        agent = Agent(cfg, notifier=Notifier())
        agent.open()
    except (ConfigError, SourceError, LedgerIntegrityError) as exc:
        return _fail(str(exc))
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()
        agent.wake.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    agent.run(stop=stop, max_rounds=args.max_rounds, max_readings=args.max_readings,
              drain_timeout=args.drain_timeout)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("agent", help="the edge agent (device daemon)")
    sub = p.add_subparsers(dest="agent_command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", "-c", type=Path, default=Path(DEFAULT_CONFIG), help="agent TOML file")

    run = sub.add_parser("run", help="run the agent (daemon)")
    common(run)
    run.add_argument("--max-rounds", type=int, help="exit after answering this many rounds (demo)")
    run.add_argument("--max-readings", type=int, help="exit after this many readings (demo)")
    run.add_argument("--drain-timeout", type=float, default=10.0, help="seconds to drain the outbox at exit")
    run.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default %(default)s)")
    run.set_defaults(func=cmd_run)

    chk = sub.add_parser("check-config", help="validate the config, resolve mechanisms, test the source")
    common(chk)
    chk.add_argument("--no-source-check", action="store_true", help="do not take a test reading")
    chk.set_defaults(func=cmd_check_config)

    enr = sub.add_parser("enroll", help="create the device signing key and HMAC secret; print the enrolment JSON")
    common(enr)
    enr.add_argument("--force", action="store_true", help="replace an existing identity (new key, new memo)")
    enr.add_argument("--signature", choices=("ed25519", "hmac-sha256"), default="ed25519",
                     help="report key for a new identity: ed25519 (default; the registry holds only the public key) "
                          "or hmac-sha256 (far cheaper to verify, see `make bench`; the printed key is a secret the "
                          "coordinator's registry must keep private)")
    enr.set_defaults(func=cmd_enroll)

    st = sub.add_parser("status", help="ledger totals, outbox, counters, invariants (JSON)")
    common(st)
    st.add_argument("--integrity", action="store_true", help="also run PRAGMA integrity_check")
    st.set_defaults(func=cmd_status)

    rst = sub.add_parser("reset-ledger", help="start a new, recorded privacy ledger (the old one is kept aside)")
    common(rst)
    rst.add_argument("--yes", action="store_true", help="confirm: the device gets a full budget again")
    rst.add_argument("--reason", help="why (kept in the reset record)")
    rst.add_argument("--next-seq", type=int, help="continue report sequence numbers from at least this (e.g. the "
                                                  "coordinator's high-water mark for the device + 1)")
    rst.set_defaults(func=cmd_reset_ledger)

    led = sub.add_parser("ledger", help="print ledger charges as JSON lines")
    common(led)
    led.add_argument("--stream", help="only this stream's charges")
    led.add_argument("--limit", type=int, help="only the newest this many charges")
    led.add_argument("--total", action="store_true", help="also print totals")
    led.set_defaults(func=cmd_ledger)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="haarvest-agent")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["agent", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
