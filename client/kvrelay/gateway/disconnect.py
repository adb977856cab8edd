"""Racing a request's work against the caller hanging up: the one place that watches
ASGI's ``http.disconnect``, for streamed and whole answers alike."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.types import Receive

T = TypeVar("T")


async def run_until_disconnect(work: Coroutine[Any, Any, T], receive: Receive) -> asyncio.Task[T]:
    """Run ``work`` until it ends or the caller disconnects, whichever comes first.

    Returns the work's task: done, or still running when the caller left (the caller of
    this function decides whether to cancel it). If this function itself is cancelled,
    so is the work.
    """
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    return task
