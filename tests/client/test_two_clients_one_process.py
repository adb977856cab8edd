"""Two SDK clients in one process, with different enqueue thread counts, both enqueue.

Celery sets kombu's pool limit for the whole process and resizes every pool to it,
refusing to shrink one in use: a client with fewer threads, made while another client's
pool had connections out, failed its enqueues with "Can't shrink pool when in use"
(seen in CI: a stream of the refused-writes test died before its fault).
"""

from __future__ import annotations

from kvrelay.enqueue import CeleryEnqueuer


def test_a_client_with_fewer_threads_does_not_shrink_another_clients_pool(
        redis_url: str) -> None:
    wide = CeleryEnqueuer(redis_url, threads=9)
    held = [wide._celery().pool.acquire(block=True) for _ in range(5)]
    try:
        narrow = CeleryEnqueuer(redis_url, threads=1)
        narrow_pool = narrow._celery().pool  # sets the process's limit: it must not shrink
        with narrow_pool.acquire(block=True) as connection:
            connection.ensure_connection(max_retries=1)
    finally:
        for connection in held:
            connection.release()
