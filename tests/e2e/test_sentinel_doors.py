"""Every door takes the ``redis+sentinel://`` URL: the sync SDK, ``kvrelay generate``, the
gateway, and the worker they all reach, behind a real primary, replica and three
sentinels. (A failover under load is ``tests/reliability/test_sentinel_failover.py``.)"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis
from cli_support import cli_env, run_cli
from helpers.gateway_process import GatewayProcess
from helpers.sentinel_cluster import SentinelCluster
from helpers.worker_process import WorkerProcess

from kvrelay import AsyncClient, Client
from kvrelay.cli.errors import CliError
from kvrelay.cli.redis_server import ping
from kvrelay.keys import Keyspace

pytestmark = pytest.mark.integration

MODEL = "llama-mqa"
JOB = {"prompt_token_ids": [5, 6, 7], "max_tokens": 6, "temperature": 0.0,
       "ignore_eos": True}


@pytest.fixture(scope="module")
def sentinel_worker(tiny_model: Callable[[str], Path],
                    tmp_path_factory: pytest.TempPathFactory
                    ) -> Iterator[tuple[SentinelCluster, WorkerProcess]]:
    folder = tmp_path_factory.mktemp("sentinel-doors")
    cluster = SentinelCluster(folder / "ha").start()
    worker = WorkerProcess("ha-doors", cluster.url, str(tiny_model(MODEL)), folder,
                           concurrency=4)
    try:
        worker.start().wait_ready()
        yield cluster, worker
    except BaseException:
        print(f"\n----- worker log -----\n{worker.tail(6000)}")
        raise
    finally:
        worker.stop()
        cluster.stop()


def test_sync_client(sentinel_worker: tuple[SentinelCluster, WorkerProcess]) -> None:
    cluster, _ = sentinel_worker
    with Client(cluster.url, model=MODEL) as client:
        completion = client.generate(**JOB)
        assert len(completion.token_ids) == 6
        assert completion.finish_reason == "length"
        # The same request, streamed, gives the same greedy tokens.
        streamed = [t for chunk in client.stream(**JOB) for t in chunk.token_ids]
    assert streamed == completion.token_ids


def test_cli_generate(sentinel_worker: tuple[SentinelCluster, WorkerProcess],
                      tmp_path: Path) -> None:
    cluster, _ = sentinel_worker
    result = run_cli(["generate", "Hello", "--redis-url", cluster.url, "--model", MODEL,
                      "--max-tokens", "5", "--temperature", "0", "--json"], cli_env(tmp_path))
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["model"] == MODEL
    assert answer["usage"]["completion_tokens"] == len(answer["token_ids"]) > 0


def test_cli_refuses_a_malformed_sentinel_url(tmp_path: Path) -> None:
    result = run_cli(["generate", "Hello", "--redis-url", "redis+sentinel://h:26379",
                      "--model", MODEL], cli_env(tmp_path))
    assert result.returncode != 0
    assert "names no primary" in result.stderr
    assert "Traceback" not in result.stderr


def test_kvrelay_up_checks_a_sentinel_url(
        sentinel_worker: tuple[SentinelCluster, WorkerProcess]) -> None:
    """``kvrelay up --redis-url`` pings the Redis it is given: through the sentinels."""
    cluster, _ = sentinel_worker
    ping(cluster.url)
    wrong_name = cluster.url.replace("/kvrelay-ha/", "/no-such-primary/")
    with pytest.raises(CliError, match="no-such-primary"):
        ping(wrong_name)


def test_gateway(sentinel_worker: tuple[SentinelCluster, WorkerProcess],
                 tmp_path: Path) -> None:
    cluster, _ = sentinel_worker
    gateway = GatewayProcess(cluster.url, tmp_path).start()
    try:
        reply = httpx.post(f"{gateway.url}/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": JOB["prompt_token_ids"], "max_tokens": 6,
            "temperature": 0, "ignore_eos": True})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["usage"]["completion_tokens"] == 6
        assert body["choices"][0]["finish_reason"] == "length"
    except BaseException:
        print(f"\n----- gateway log -----\n{gateway.tail()}")
        raise
    finally:
        gateway.stop()


def _waits_after_pushes_to(primary: redis.Redis, queue: str, run: Callable[[], None]) -> int:
    """The ``WAIT``s the primary took while ``run`` ran, each right after a push to
    ``queue`` on the same connection: the SDK's enqueue sends its push and the ``WAIT``
    that follows it as one pipeline, on one connection (``kvrelay.queue_push``). An idle
    worker's own writes (its heartbeat, its queue-limit hash) and the SDK's other writes
    send ``WAIT``s too, on other connections or after other commands: not counted."""
    marker = f"kvrelay-test-monitor-end-{uuid.uuid4().hex}"
    waits, ended = 0, False
    with primary.monitor() as monitor:  # MONITOR is on before ``run`` starts

        def read() -> None:
            nonlocal waits, ended
            last: dict[tuple[str, str], list[str]] = {}  # each connection's last command
            while True:
                seen = monitor.next_command()
                words = seen["command"].split()
                if marker in words:
                    ended = True
                    return
                sender = (seen["client_address"], seen["client_port"])
                if seen["client_type"] == "lua":  # a script's own calls: not its caller's
                    continue
                if words and words[0].upper() == "WAIT" and queue in last.get(sender, []):
                    waits += 1
                last[sender] = words

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            run()
        finally:
            primary.get(marker)  # seen by the reader last: it stops there
            reader.join(timeout=30)
        assert ended, "MONITOR never showed the end marker"
    return waits


def test_an_enqueued_job_is_on_the_replica(
        sentinel_worker: tuple[SentinelCluster, WorkerProcess]) -> None:
    """``stream.start()`` returns once the job message is on the replica too: the SDK's
    push is followed by ``WAIT`` on its connection (a model no worker serves, so only the
    SDK pushes to its queue)."""
    cluster, _ = sentinel_worker
    unserved = "nobody-serves-this"
    queue = Keyspace().celery_queue(unserved)
    with redis.Redis(port=cluster.primary.port) as primary, \
            redis.Redis(port=cluster.replica.port) as replica:

        def waits_sent_by_enqueue(url: str) -> int:
            primary.delete(queue)

            async def enqueue() -> None:
                async with AsyncClient(url, model=unserved, require_worker=False) as client:
                    stream = client.stream(prompt_token_ids=[1, 2], max_tokens=1)
                    await stream.start()
                    # Read at once, with no wait of our own: the replica already has it.
                    assert replica.llen(queue) == 1
                    await stream.aclose()

            return _waits_after_pushes_to(primary, queue, lambda: asyncio.run(enqueue()))

        assert waits_sent_by_enqueue(cluster.url) >= 1
        # The contrast: with the wait turned off the push sends none (the worker's own
        # writes may still send theirs: they are not counted).
        assert waits_sent_by_enqueue(cluster.url + "?wait_replicas=0") == 0
        primary.delete(queue)
