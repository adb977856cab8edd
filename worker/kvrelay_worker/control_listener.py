"""Listens on the control channel: forwards aborts for jobs this worker holds, and
adapter loads and unloads (``AdapterMessage``) to whoever applies them."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis

from kvrelay.protocol import AbortMessage, AdapterMessage, decode_control

log = logging.getLogger(__name__)


class ControlListener:
    def __init__(self, client: redis.Redis, channel: str,
                 on_abort: Callable[[str], None],
                 on_adapter: Callable[[AdapterMessage], None] | None = None) -> None:
        self.redis = client
        self.channel = channel
        self.on_abort = on_abort
        self.on_adapter = on_adapter
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvrelay-control", daemon=True)
        self._ready = threading.Event()

    def start(self, timeout: float = 10.0) -> None:
        self._thread.start()
        self._ready.wait(timeout)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(self.channel)
                self._ready.set()
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=0.5)
                    if message is None or message.get("type") != "message":
                        continue
                    self._handle(message["data"])
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("control channel lost (%s); reconnecting", exc)
                self._stop.wait(0.5)
            except Exception:  # a socket closed under it, a reply it cannot parse, ...
                log.exception("control channel failed; reconnecting")
                self._stop.wait(0.5)
            finally:
                try:
                    pubsub.close()
                except Exception:
                    pass

    def _handle(self, data: bytes) -> None:
        try:
            message = decode_control(data)
        except Exception:
            log.warning("ignoring an undecodable control message")
            return
        if isinstance(message, AbortMessage):
            self.on_abort(message.job_id)
        elif isinstance(message, AdapterMessage) and self.on_adapter is not None:
            self.on_adapter(message)
