"""With ``rediss://`` every connection verifies the server, Celery's broker included.

A real TLS-only redis-server with a certificate signed by a CA made here. Given the CA
(``?ssl_ca_certs=``), the SDK and a real worker stream a job over TLS. Without it,
every door is refused with "certificate verify failed": the SDK's command and pub/sub
connections, its Celery producer, and the worker's Celery app (before the fix, both
Celery paths connected with CERT_NONE and trusted any server). ``?ssl_cert_reqs=none``
is the explicit opt-out for self-signed test setups.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from helpers.worker_process import WorkerProcess
from tls_setup import TlsRedis

from kvrelay import AsyncClient, BrokerUnavailable, InvalidRequest
from kvrelay.enqueue import CeleryEnqueuer
from kvrelay.tls import celery_ssl_options

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

VERIFY_FAILED = "certificate verify failed"


def _with_ca(server: TlsRedis) -> str:
    return f"{server.url}?ssl_ca_certs={server.certs.ca}"


def test_url_query_drives_celery_verification() -> None:
    assert celery_ssl_options("redis://h:6379/0") is None
    required = celery_ssl_options("rediss://h:6380/0?ssl_ca_certs=/ca.pem")
    assert required == {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": "/ca.pem",
                        "ssl_check_hostname": True}
    assert celery_ssl_options("rediss://h/0")["ssl_cert_reqs"] == ssl.CERT_REQUIRED  # type: ignore[index]
    opt_out = celery_ssl_options("rediss://h/0?ssl_cert_reqs=none")
    assert opt_out == {"ssl_cert_reqs": ssl.CERT_NONE, "ssl_check_hostname": False}
    with pytest.raises(InvalidRequest, match="ssl_cert_reqs"):
        AsyncClient("rediss://h/0?ssl_cert_reqs=maybe")


async def test_sdk_and_worker_stream_a_job_over_tls(tls_redis: TlsRedis, tiny_model_path: str,
                                                    tmp_path: Path) -> None:
    url = _with_ca(tls_redis)
    worker = WorkerProcess("tls", url, tiny_model_path, tmp_path, concurrency=2).start()
    try:
        worker.wait_ready()
        async with AsyncClient(url, model="llama-mqa", stream_timeout=60) as client:
            seqs: list[int] = []
            async with client.stream(prompt_token_ids=[5, 6, 7], max_tokens=12,
                                     temperature=0.0, ignore_eos=True) as stream:
                async for chunk in stream:
                    seqs.append(chunk.seq)
                done = await stream.final()
        assert len(done.token_ids) == 12
        assert seqs
        assert seqs == sorted(seqs)
    except BaseException:
        print(worker.tail(6000))
        raise
    finally:
        worker.stop()


async def test_sdk_without_the_ca_is_refused(tls_redis: TlsRedis) -> None:
    client = AsyncClient(tls_redis.url, model="m", connect_timeout=3)
    try:
        with pytest.raises(BrokerUnavailable, match=VERIFY_FAILED):
            await client.connect()
    finally:
        await client.aclose()


def test_sdk_celery_producer_without_the_ca_is_refused(tls_redis: TlsRedis) -> None:
    enqueuer = CeleryEnqueuer(tls_redis.url, connect_timeout=3)
    try:
        with pytest.raises(Exception, match=VERIFY_FAILED):
            enqueuer.warm_up()
    finally:
        enqueuer._executor.shutdown(wait=True)
        if enqueuer._app is not None:
            enqueuer._app.close()


def test_worker_celery_broker_without_the_ca_is_refused(tls_redis: TlsRedis) -> None:
    from kvrelay_worker.app import make_celery
    from kvrelay_worker.settings import WorkerSettings

    app = make_celery(WorkerSettings(redis_url=tls_redis.url, model="m"))
    try:
        with pytest.raises(Exception, match=VERIFY_FAILED), app.connection_for_read() as conn:
            conn.ensure_connection(max_retries=1, timeout=3)
    finally:
        app.close()


def test_the_explicit_opt_out_accepts_a_self_signed_server(tls_redis: TlsRedis) -> None:
    from kvrelay_worker.app import make_celery
    from kvrelay_worker.settings import WorkerSettings

    url = f"{tls_redis.url}?ssl_cert_reqs=none"
    enqueuer = CeleryEnqueuer(url, connect_timeout=3)
    try:
        enqueuer.warm_up()
    finally:
        enqueuer._executor.shutdown(wait=True)
        enqueuer._app.close()
    app = make_celery(WorkerSettings(redis_url=url, model="m"))
    try:
        with app.connection_for_read() as conn:
            conn.ensure_connection(max_retries=1, timeout=3)
    finally:
        app.close()
