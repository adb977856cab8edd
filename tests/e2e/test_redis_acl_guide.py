"""The ACL user docs/existing-redis.md tells operators to create is enough for kvrelay,
and no more: a real worker and a real client run every kind of call through it, and the
user cannot touch keys outside kvrelay's and Celery's names."""

from __future__ import annotations

import asyncio
import shlex
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from helpers.worker_process import WorkerProcess

import kvrelay
from kvrelay import AsyncClient

pytestmark = pytest.mark.integration

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "existing-redis.md"
MODEL = "llama-mqa"


def documented_acl() -> list[str]:
    """The ``ACL SETUSER`` command of the code block after ``<!-- acl -->``."""
    text = GUIDE.read_text(encoding="utf-8")
    block = text.split("<!-- acl -->", 1)[1].split("```", 2)[1]
    (line,) = [line for line in block.splitlines() if line.startswith("ACL SETUSER")]
    return shlex.split(line)


@pytest.fixture
def acl_url(clean_redis_url: str) -> Iterator[str]:
    """A URL that logs in as a fresh user with exactly the documented rules."""
    parts = urlsplit(clean_redis_url)
    db = parts.path.strip("/") or "0"
    user, password = f"kvrelay-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    command = documented_acl()
    assert command[:3] == ["ACL", "SETUSER", "kvrelay"]
    rules = [
        f">{password}" if rule.startswith(">") else rule.replace("&/0.", f"&/{db}.")
        for rule in command[3:]
    ]
    admin = redis.Redis.from_url(clean_redis_url)
    admin.execute_command("ACL", "SETUSER", user, *rules)
    host = f"{user}:{password}@{parts.hostname}:{parts.port}"
    try:
        yield urlunsplit((parts.scheme, host, parts.path, "", ""))
    finally:
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()


async def _exercise(url: str) -> None:
    async with AsyncClient(url, model=MODEL, max_queue=50, stream_timeout=30) as client:
        done = await client.generate(prompt_token_ids=[5, 6, 7], max_tokens=6, ignore_eos=True)
        assert done.usage.completion_tokens == 6
        async with client.stream(prompt_token_ids=[8, 9], max_tokens=4, ignore_eos=True) as s:
            assert len([chunk async for chunk in s]) >= 1
        again = await client.resume(done.job_id, after_seq=0)
        assert (await again.final()).token_ids == done.token_ids
        long = client.stream(prompt_token_ids=[3, 4], max_tokens=2000, ignore_eos=True)
        async with long:
            await long.__anext__()
            await client.cancel(long.job_id)
            with pytest.raises(kvrelay.Cancelled):
                await long.final()
        with pytest.raises(kvrelay.UnknownJob):
            await client.resume("no-such-job")
        assert [w.model for w in await client.workers()] == [MODEL]


def test_documented_acl_runs_worker_and_client(
    acl_url: str, tiny_model: Callable[[str], Path], tmp_path: Path
) -> None:
    worker = WorkerProcess("acl", acl_url, str(tiny_model(MODEL)), tmp_path, concurrency=2)
    worker.start()
    try:
        worker.wait_ready()
        asyncio.run(_exercise(acl_url))
        assert worker.alive(), worker.tail()
        assert "NOPERM" not in worker.tail(100_000), worker.tail()
    finally:
        worker.stop()
    limited = redis.Redis.from_url(acl_url)
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            limited.set("someone-else:key", b"x")
        with pytest.raises(redis.exceptions.NoPermissionError):
            limited.flushdb()
    finally:
        limited.close()
