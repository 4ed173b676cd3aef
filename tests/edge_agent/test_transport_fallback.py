"""protocol = "auto": a broker that refuses MQTT 5 makes the agent fall back to 3.1.1 and deliver anyway."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from edge_agent.agent import Agent
from edge_agent.embed import new_identity, numeric, simple_config
from edge_agent.sources import CallableSource
from simulations.broker import free_port

pytestmark = pytest.mark.integration


class V311OnlyProxy:
    """Answers an MQTT 5 CONNECT like a 3.1.1-only broker (CONNACK 'unacceptable protocol version', close);
    pipes 3.1.1 connections through to mosquitto."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.refused_v5 = 0
        self.accepted_v311 = 0
        self.srv = socket.create_server(("127.0.0.1", self.port))
        self.srv.settimeout(0.2)
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.srv.accept()
            except OSError:
                continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        first = conn.recv(65536)
        # fixed header, remaining-length varint, then 00 04 'MQTT' and the protocol level byte
        i = 1
        while first[i] & 0x80:
            i += 1
        level = first[i + 1 + 6]
        if level == 5:
            self.refused_v5 += 1
            conn.sendall(b"\x20\x02\x00\x01")
            conn.close()
            return
        self.accepted_v311 += 1
        up = socket.create_connection(("127.0.0.1", self.upstream))
        up.sendall(first)

        def pipe(a: socket.socket, b: socket.socket) -> None:
            try:
                while data := a.recv(65536):
                    b.sendall(data)
            except OSError:
                pass
            finally:
                for s in (a, b):
                    try:
                        s.close()
                    except OSError:
                        pass

        threading.Thread(target=pipe, args=(conn, up), daemon=True).start()
        threading.Thread(target=pipe, args=(up, conn), daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.srv.close()


def test_auto_protocol_falls_back_to_311(mosquitto, tmp_path):
    proxy = V311OnlyProxy(mosquitto.port)
    cfg = simple_config("dev-f", tmp_path / "f", [numeric("cpu", 0, 100)], report_interval_s=3600.0,
                        mqtt={"receipts": False, "host": "127.0.0.1", "port": proxy.port, "protocol": "auto",
                              "reconnect_min_s": 1, "reconnect_max_s": 1})
    agent = Agent(cfg, CallableSource(lambda: {"cpu": 5.0}), secrets=new_identity()).open()
    try:
        agent.report("r0")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and agent.state.pending_count():
            agent.step()
            time.sleep(0.02)
        assert agent.state.pending_count() == 0
        assert proxy.refused_v5 >= 1 and proxy.accepted_v311 >= 1
        import paho.mqtt.client as mqtt

        assert agent.transport.protocol == mqtt.MQTTv311
    finally:
        agent.close(drain_timeout=1)
        proxy.close()
