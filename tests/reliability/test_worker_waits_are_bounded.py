"""No worker thread waits forever: on a Redis that stops answering, on a dead engine.

A "black hole" is a real TCP server that accepts connections and never replies, as a
Redis does when it hangs or a network path silently drops packets. Without socket
timeouts, the worker's clients (its own and Celery's broker connection) block on it
for good; with them, every call raises within the configured bound.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis

from kvrelay_worker.app import make_celery
from kvrelay_worker.redis_client import worker_redis
from kvrelay_worker.settings import WorkerSettings

TIMEOUT_S = 1.0
# Generous: the call must end near TIMEOUT_S; the test only refuses "never".
BOUND_S = 20.0


@pytest.fixture
def black_hole() -> Iterator[str]:
    """A redis:// URL whose server accepts connections and never says a word."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{server.getsockname()[1]}/0"
    stop.set()
    thread.join(5)
    for conn in accepted:
        conn.close()
    server.close()


def ends_within(call: Callable[[], object], bound: float) -> BaseException | None:
    """Run ``call`` on a thread; fail the test if it is still running after ``bound``;
    return what it raised."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # handed to the test
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(bound)
    assert not thread.is_alive(), f"still waiting after {bound}s"
    assert time.monotonic() - start < bound
    return raised[0] if raised else None


def settings(url: str) -> WorkerSettings:
    return WorkerSettings(redis_url=url, model_name="bounded",
                          redis_socket_timeout=TIMEOUT_S)


def test_worker_redis_calls_end_on_a_silent_server(black_hole: str) -> None:
    client = worker_redis(settings(black_hole))
    raised = ends_within(client.ping, BOUND_S)
    assert isinstance(raised, redis.TimeoutError), raised


def test_celery_broker_calls_end_on_a_silent_server(black_hole: str) -> None:
    app = make_celery(settings(black_hole))

    def publish_through_the_broker() -> None:
        with app.connection_for_write() as conn:
            conn.default_channel.client.ping()

    raised = ends_within(publish_through_the_broker, BOUND_S)
    assert raised is not None
    assert "imeout" in f"{type(raised).__name__} {raised}", raised


@pytest.mark.integration
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_job_whose_engine_thread_died_fails_instead_of_hanging(
        clean_redis_url: str, tiny_model_path: str) -> None:
    """The task thread used to wait on the job's end with no bound: with the engine thread
    gone, the Celery slot was held forever and the caller heard nothing."""
    from helpers.job_log import read_events

    from kvrelay.protocol import Failed, GenerateRequest, SamplingOptions, request_to_payload
    from kvrelay_worker.runtime import WorkerRuntime

    runtime = WorkerRuntime(WorkerSettings(redis_url=clean_redis_url, model=tiny_model_path,
                                           device="cpu", concurrency=2),
                            requeue=lambda job_id, payload: None)
    runtime.start()
    try:
        def engine_thread_dies() -> None:
            raise SystemExit("the engine thread ends (as on an error no handler catches)")

        runtime.engine.step = engine_thread_dies  # type: ignore[method-assign]
        request = GenerateRequest(job_id="orphaned", model=runtime.settings.served_model,
                                  prompt_token_ids=[1, 2, 3],
                                  sampling=SamplingOptions(max_tokens=8), enqueued_at=time.time())
        raised = ends_within(lambda: runtime.run_job("orphaned", request_to_payload(request)),
                             BOUND_S)
        assert raised is None, raised
        last = read_events(clean_redis_url, "orphaned")[-1]
        assert isinstance(last, Failed), last
        assert last.code == "internal", last
    finally:
        runtime.shutdown(grace=0)
