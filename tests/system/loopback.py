"""A Flower ``Grid`` test double: messages go straight to a ``ClientApp`` in this process (no SuperLink, no Ray).

It uses the real ``flwr.app.Message``/``Context`` objects and the real ClientApp dispatch (``query.<action>``), so the
ServerApp and ClientApp code paths are the deployed ones; only the transport is short-circuited.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any
from uuid import uuid4

from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity


class LoopbackGrid:
    """``nodes``: node id → node config (``partition-id`` etc.). ``slow``: node ids that never answer (stragglers)."""

    def __init__(self, client_app: Any, nodes: dict[int, dict[str, Any]], slow: Iterable[int] = ()) -> None:
        self.client_app = client_app
        self.nodes = nodes
        self.slow = set(slow)
        self.pending: dict[str, Message] = {}
        # what a SuperLink-side ServerApp process has set before its main() runs
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, SUPERLINK_NODE_ID
        self.contexts = {n: Context(run_id=1, node_id=n, node_config=dict(cfg), state=RecordDict(), run_config={})
                         for n, cfg in nodes.items()}

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for msg in messages:
            mid = str(uuid4())
            msg.metadata.__dict__["_message_id"] = mid
            self.pending[mid] = msg
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        out = []
        for mid in list(message_ids):
            msg = self.pending.get(mid)
            if msg is None or msg.metadata.dst_node_id in self.slow:
                continue
            del self.pending[mid]
            try:
                reply = self.client_app(msg, self.contexts[msg.metadata.dst_node_id])
            except Exception as exc:  # noqa: BLE001 - a SuperNode reports a failing ClientApp as an error reply
                reply = Message(Error(code=0, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg)
            reply.metadata.__dict__["_message_id"] = str(uuid4())
            out.append(reply)
        return out

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        ids = self.push_messages(messages)
        time.sleep(0)
        return self.pull_messages(ids)
