"""Two tenants in one Redis, each confined by an ACL user to its namespace's prefix.

Real redis-server with users made from ``kvrelay.acl.tenant_acl_rules``, a real worker
per tenant (``KVRELAY_NAMESPACE`` and the tenant's credentials). Each tenant's jobs
complete through its own worker, and with its own credentials tenant B can neither read
A's logs and records, nor cancel A's jobs, nor inject events into A's streams or jobs
into A's queue, nor list what the server holds. Every key either writes lies under its
tenant's prefix. (Before namespaces every tenant shared ``kvrelay:``: none of this could
be expressed, and these tests fail at the first ``namespace=`` argument.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from helpers.worker_process import WorkerProcess

from kvrelay import AsyncClient, Cancelled, KvrelayError, event_log
from kvrelay.enqueue import CeleryEnqueuer
from kvrelay.keys import Keyspace
from kvrelay.protocol import (
    AbortMessage,
    Failed,
    GenerateRequest,
    SamplingOptions,
    encode_control,
    encode_event,
    request_to_payload,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MODEL = "llama-mqa"
A, B = Keyspace("alpha"), Keyspace("beta")
LONG_JOB = {"prompt_token_ids": [3, 4, 5], "max_tokens": 160, "temperature": 0.0,
            "ignore_eos": True}


@pytest.fixture(scope="module")
def tenants(acl_redis: tuple[str, dict[str, str]], tiny_model: Callable[[str], Path],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, WorkerProcess]]:
    """One worker per tenant, each with its own namespace and ACL user."""
    _, urls = acl_redis
    logs = tmp_path_factory.mktemp("tenant-workers")
    model = str(tiny_model(MODEL))
    workers = {name: WorkerProcess(name, urls[name], model, logs, concurrency=4,
                                   namespace=name) for name in urls}
    try:
        for worker in workers.values():
            worker.start()
        for worker in workers.values():
            worker.wait_ready()
        yield workers
    except BaseException:
        for worker in workers.values():
            print(f"----- {worker.name} -----\n{worker.tail(4000)}")
        raise
    finally:
        for worker in workers.values():
            worker.stop()


def _client(url: str, keys: Keyspace) -> AsyncClient:
    return AsyncClient(url, model=MODEL, namespace=keys.namespace, stream_timeout=60,
                       connect_timeout=3, reconnect_timeout=3)


def _refused(call: Callable[[], object]) -> None:
    with pytest.raises(redis.exceptions.NoPermissionError):
        call()


async def test_each_tenant_job_completes_through_its_own_worker(
        acl_redis: tuple[str, dict[str, str]], tenants: dict[str, WorkerProcess]) -> None:
    admin_url, urls = acl_redis
    for name, keys in (("alpha", A), ("beta", B)):
        async with _client(urls[name], keys) as client:
            done = await client.generate(prompt_token_ids=[7, 8, 9], max_tokens=6,
                                         temperature=0.0, ignore_eos=True)
            assert len(done.token_ids) == 6
            assert {w.worker_id for w in await client.workers()} == {
                tenants[name].info()["worker_id"]}  # type: ignore[index]
    admin = redis.Redis.from_url(admin_url)
    try:
        names = [key.decode() for key in admin.scan_iter(count=1000)]
    finally:
        admin.close()
    assert names
    outside = [key for key in names if not key.startswith((A.prefix, B.prefix))]
    assert outside == [], "every key must lie under its tenant's prefix"
    assert any(key.startswith(A.event_log("")[:-2]) for key in names)
    assert any(key.startswith(B.event_log("")[:-2]) for key in names)


async def test_b_cannot_read_cancel_or_inject_into_a(
        acl_redis: tuple[str, dict[str, str]], tenants: dict[str, WorkerProcess]) -> None:
    _, urls = acl_redis
    b_raw = redis.Redis.from_url(urls["beta"])
    try:
        async with _client(urls["alpha"], A) as alice:
            stream = alice.stream(**LONG_JOB)  # type: ignore[arg-type]
            async with stream:
                job = stream.job_id
                first = await stream.__anext__()
                # B, with its own credentials, goes after A's job while it runs.
                _refused(lambda: b_raw.xrange(A.event_log(job)))
                _refused(lambda: b_raw.hgetall(A.job_record(job)))
                _refused(lambda: b_raw.set(A.abort_flag(job), b"1"))
                _refused(lambda: b_raw.publish(A.control_channel,
                                               encode_control(AbortMessage(job_id=job))))
                bogus = encode_event(Failed(seq=first.seq + 1, code="cancelled", message="B"))
                _refused(lambda: b_raw.publish(A.events_channel(job), bogus))
                _refused(lambda: event_log.add_entry(b_raw, A.event_log(job), 900, bogus))
                # Listing the server would reveal A's job ids.
                _refused(lambda: b_raw.keys("*"))
                _refused(lambda: b_raw.scan(0))
                _refused(lambda: b_raw.execute_command("PUBSUB", "CHANNELS"))
                # The SDK pointed at A's namespace with B's credentials gets nowhere either.
                async with _client(urls["beta"], A) as impostor:
                    with pytest.raises((KvrelayError, redis.exceptions.RedisError)):
                        await impostor.cancel(job)
                    with pytest.raises((KvrelayError, redis.exceptions.RedisError)):
                        await asyncio.wait_for(impostor.resume(job), 10)
                    with pytest.raises((KvrelayError, redis.exceptions.RedisError)):
                        await impostor.workers()
                done = await stream.final()
        # A's job ran to its end untouched.
        assert done.finish_reason == "length"
        assert len(done.token_ids) == LONG_JOB["max_tokens"]
    finally:
        b_raw.close()


def test_b_cannot_put_jobs_on_as_queue(acl_redis: tuple[str, dict[str, str]],
                                       tenants: dict[str, WorkerProcess]) -> None:
    _, urls = acl_redis
    request = GenerateRequest(job_id="b-into-a", model=MODEL, prompt_token_ids=[1, 2],
                              sampling=SamplingOptions(max_tokens=2))
    b_raw = redis.Redis.from_url(urls["beta"])
    try:
        _refused(lambda: b_raw.lpush(A.queue(MODEL), b"{}"))
        _refused(lambda: b_raw.llen(A.queue(MODEL)))
    finally:
        b_raw.close()
    enqueuer = CeleryEnqueuer(urls["beta"], connect_timeout=3, keyspace=A)
    try:
        with pytest.raises(Exception, match=r"(?i)permission"):
            enqueuer.publish(request)
    finally:
        enqueuer._executor.shutdown(wait=True)
        if enqueuer._app is not None:
            enqueuer._app.close()
    assert request_to_payload(request)  # the request itself was valid


async def test_a_still_cancels_its_own_job(acl_redis: tuple[str, dict[str, str]],
                                           tenants: dict[str, WorkerProcess]) -> None:
    """The namespaced abort flag and control channel reach A's worker under A's ACL."""
    _, urls = acl_redis
    async with _client(urls["alpha"], A) as alice:
        async with alice.stream(**LONG_JOB) as stream:  # type: ignore[arg-type]
            await stream.__anext__()
            await alice.cancel(stream.job_id)
            with pytest.raises(Cancelled):
                await stream.final()


def test_a_tenant_may_wait_for_its_replicas(acl_redis: tuple[str, dict[str, str]]) -> None:
    """Behind sentinels each job-state write and each stream read of a log ends with
    ``WAIT`` (``kvrelay.replica_wait``): refused it, a tenant could write nothing."""
    _, urls = acl_redis
    client = redis.Redis.from_url(urls["alpha"])
    try:
        assert client.execute_command("WAIT", 0, 0) == 0
    finally:
        client.close()
