"""``Client``: the ``AsyncClient`` API for scripts and notebooks, without ``await``.

It runs a private event loop in a daemon thread and proxies every call to it, so a
synchronous program gets the same single pub/sub connection, ordering, reconnects and
aborts as async code. Interrupting a call (Ctrl-C) cancels it in the loop, which aborts
the job exactly as cancelling an ``await`` would.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterator
from types import TracebackType
from typing import Any, TypeVar, Unpack

from kvrelay.adapter_admin import AdapterAdmin, ServedAdapter
from kvrelay.adapter_wire import AdapterResult
from kvrelay.client import AsyncClient
from kvrelay.completion import Completion, StreamChunk
from kvrelay.errors import KvrelayError
from kvrelay.protocol import GenerateRequest, WorkerInfo
from kvrelay.request_builder import GenerateOptions
from kvrelay.stream import AsyncStream
from kvrelay.tracing.caller_context import in_callers_context

__all__ = ["Adapters", "Client", "Stream"]

T = TypeVar("T")


class _LoopThread:
    """An event loop running forever in a daemon thread, until ``stop``."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.stopped = False
        self._thread = threading.Thread(target=self._run, name="kvrelay-client-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result."""
        if self.stopped:
            coro.close()
            raise KvrelayError("the client is closed")
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("kvrelay.Client cannot be called from its own event loop")
        # Under the caller's trace context: a job started here joins the caller's trace.
        future = asyncio.run_coroutine_threadsafe(in_callers_context(coro), self.loop)
        try:
            return future.result()
        except BaseException:
            # KeyboardInterrupt & co.: cancel the work in the loop, wait for it to unwind.
            if not future.done():
                future.cancel()
                with contextlib.suppress(BaseException):
                    future.result(timeout=5.0)
            raise

    def call_sync(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a plain function on the loop thread (for objects bound to that loop)."""

        async def run() -> T:
            return fn(*args, **kwargs)

        return self.call(run())

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5.0)
        if not self._thread.is_alive():
            self.loop.close()


async def _next_or_none(stream: AsyncStream) -> StreamChunk | None:
    # StopAsyncIteration must not cross the thread boundary inside a future.
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return None


class _ClosesOnExit:
    """``with`` support for objects whose ``close()`` ends them."""

    def close(self) -> None:
        raise NotImplementedError

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Stream(_ClosesOnExit):
    """Synchronous view of an ``AsyncStream``: ``with client.stream(...) as s: for c in s``."""

    def __init__(self, runner: _LoopThread, stream: AsyncStream) -> None:
        self._runner = runner
        self._stream = stream

    @property
    def job_id(self) -> str:
        return self._stream.job_id

    @property
    def request(self) -> GenerateRequest | None:
        return self._stream.request

    @property
    def last_seq(self) -> int:
        return self._stream.last_seq

    @property
    def done(self) -> bool:
        return self._stream.done

    def __enter__(self) -> Stream:
        self._runner.call(self._stream.start())
        return self

    def __iter__(self) -> Iterator[StreamChunk]:
        return self

    def __next__(self) -> StreamChunk:
        chunk = self._runner.call(_next_or_none(self._stream))
        if chunk is None:
            raise StopIteration
        return chunk

    @property
    def text_stream(self) -> Iterator[str]:
        """Just the text deltas of choice 0."""
        for chunk in self:
            if chunk.index == 0 and chunk.text:
                yield chunk.text

    def final(self) -> Completion:
        return self._runner.call(self._stream.final())

    def close(self) -> None:
        """Stop listening; aborts the job unless it already ended."""
        if not self._runner.stopped:
            self._runner.call(self._stream.aclose())


class Adapters:
    """Synchronous view of ``kvrelay.adapter_admin.AdapterAdmin``."""

    def __init__(self, runner: _LoopThread, admin: AdapterAdmin) -> None:
        self._runner = runner
        self._admin = admin

    def list(self, model: str | None = None) -> list[ServedAdapter]:
        return self._runner.call(self._admin.list(model))

    def load(self, name: str, path: str, *, model: str | None = None,
             timeout: float = 120.0) -> dict[str, AdapterResult]:
        return self._runner.call(self._admin.load(name, path, model=model, timeout=timeout))

    def unload(self, name: str, *, model: str | None = None,
               timeout: float = 120.0) -> dict[str, AdapterResult]:
        return self._runner.call(self._admin.unload(name, model=model, timeout=timeout))


class Client(_ClosesOnExit):
    """Synchronous client; takes the same arguments as ``AsyncClient``."""

    def __init__(self, url: str | None = None, **kwargs: Any) -> None:
        self._runner = _LoopThread()
        try:
            self._client = self._runner.call_sync(AsyncClient, url, **kwargs)
        except BaseException:
            self._runner.stop()
            raise

    @property
    def async_client(self) -> AsyncClient:
        """The underlying ``AsyncClient`` (lives on the private loop thread)."""
        return self._client

    def __enter__(self) -> Client:
        try:
            self.connect()
        except BaseException:
            self.close()
            raise
        return self

    def connect(self) -> None:
        self._runner.call(self._client.connect())

    def generate(self, prompt: str | None = None, **options: Unpack[GenerateOptions]) -> Completion:
        return self._runner.call(self._client.generate(prompt, **options))

    def stream(self, prompt: str | None = None, **options: Unpack[GenerateOptions]) -> Stream:
        return Stream(self._runner, self._runner.call_sync(self._client.stream, prompt, **options))

    def resume(
        self,
        job_id: str,
        *,
        after_seq: int = -1,
        stream_timeout: float | None = None,
        timeout: float | None = None,
        abort_on_exit: bool = False,
    ) -> Stream:
        """``AsyncClient.resume``: observes the job; leaving aborts only with
        ``abort_on_exit=True``."""
        stream = self._runner.call(
            self._client.resume(
                job_id,
                after_seq=after_seq,
                stream_timeout=stream_timeout,
                timeout=timeout,
                abort_on_exit=abort_on_exit,
            )
        )
        return Stream(self._runner, stream)

    def cancel(self, job_id: str) -> None:
        self._runner.call(self._client.cancel(job_id))

    def workers(self) -> list[WorkerInfo]:
        return self._runner.call(self._client.workers())

    def queue_length(self, model: str | None = None) -> int:
        return self._runner.call(self._client.queue_length(model))

    @property
    def adapters(self) -> Adapters:
        """``AsyncClient.adapters`` without ``await``: load, unload, list."""
        return Adapters(self._runner, self._runner.call_sync(lambda: self._client.adapters))

    def close(self) -> None:
        """Close the async client, then stop the loop thread."""
        if self._runner.stopped:
            return
        try:
            self._runner.call(self._client.aclose())
        except (KvrelayError, concurrent.futures.CancelledError):
            pass
        finally:
            self._runner.stop()

    def __repr__(self) -> str:
        return f"Client({self._client!r})"
