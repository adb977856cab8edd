"""What the publisher's batch script costs Redis by itself, per generated token.

No worker, no client, no Celery: ``JobStore.append_batch`` called in a loop the way a
worker's publisher calls it, one batch per engine step, for ``--jobs`` jobs of
``--tokens`` tokens each (a finished job is replaced by a new one, its log moved at its
end and every 16 batches and the job released by its last batch, as the publisher does).
Redis's own counters around the loop: ``INFO commandstats`` (calls and µs inside each command, a script's including its inner
calls) and ``INFO cpu``. Set beside ``scaling.py``'s figures, this separates what the
script costs from what the same commands cost on a machine crowded with workers.

    python benchmarks/batch_script_cost.py --redis redis://127.0.0.1:6379/15

The database named by ``--redis`` is emptied (FLUSHDB) first: give it a scratch one.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid

import redis
from harness import write_result

from kvrelay.keys import Keyspace
from kvrelay.protocol import Finished, Started, Tokens, encode_event
from kvrelay_worker.jobs.job_store import JobEvents, JobStore
from kvrelay_worker.jobs.publisher import LOG_MOVE_BATCHES
from kvrelay_worker.settings import WorkerSettings

KEYS = Keyspace()


class _Job:
    def __init__(self, store: JobStore, index: int) -> None:
        self.job_id = uuid.uuid4().hex
        self.seq = 0
        self.unlogged: list[bytes] = []
        self.batches = 0
        self.reply_to = KEYS.reply_channel(f"client-{index % 2}")
        store.redis.set(KEYS.lease(self.job_id), store.worker_id, px=600_000)


def _counters(client: redis.Redis) -> dict[str, float]:
    stats = client.info("commandstats")
    cpu = client.info("cpu")
    out = {f"calls:{k.removeprefix('cmdstat_')}": float(v["calls"]) for k, v in stats.items()}
    out.update({f"usec:{k.removeprefix('cmdstat_')}": float(v["usec"]) for k, v in stats.items()})
    out["cpu_us"] = (float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])) * 1e6
    return out


def _listen(url: str, channel: str, stop: threading.Event) -> None:
    """A reply channel's subscriber, reading every message as a client would."""
    pubsub = redis.Redis.from_url(url).pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(channel)
    while not stop.is_set():
        pubsub.get_message(timeout=0.1)
    pubsub.close()


def run(url: str, jobs: int, tokens: int, steps: int, interval_ms: float = 0.0,
        subscribers: bool = False) -> dict[str, object]:
    client = redis.Redis.from_url(url)
    client.flushdb()
    stop = threading.Event()
    listeners = [threading.Thread(target=_listen, args=(url, KEYS.reply_channel(f"client-{i}"),
                                                        stop), daemon=True)
                 for i in range(2 if subscribers else 0)]
    for listener in listeners:
        listener.start()
    time.sleep(0.5 if listeners else 0.0)
    store = JobStore(client, WorkerSettings(redis_url=url, model_name="bench"))
    running = [_Job(store, i) for i in range(jobs)]
    generated = 0
    store.append_batch([JobEvents("warm-up", "", [(0, False, encode_event(
        Started(seq=0, worker="bench")))])])  # loads the script
    before = _counters(client)
    started = time.perf_counter()
    for _ in range(steps):
        batch = []
        for job in running:
            if job.seq == 0:
                event: object = Started(seq=0, worker="bench")
            elif job.seq > tokens:
                event = Finished(seq=job.seq, finish_reason="length")
            else:
                event = Tokens(seq=job.seq, token_ids=[job.seq], text=" tok")
                generated += 1
            data = encode_event(event)  # type: ignore[arg-type]
            ended = isinstance(event, Finished)
            entry = JobEvents(job.job_id, job.reply_to, [(job.seq, ended, data)],
                              release=ended)
            job.batches += 1
            if ended or job.batches % LOG_MOVE_BATCHES == 0:
                entry.moved, entry.moved_last, job.unlogged = [*job.unlogged, data], job.seq, []
            else:
                job.unlogged.append(data)
            batch.append(entry)
            job.seq += 1
        store.append_batch(batch)
        if interval_ms > 0:
            time.sleep(interval_ms / 1000)
        running = [job if job.seq <= tokens + 1 else _Job(store, i)
                   for i, job in enumerate(running)]
    elapsed = time.perf_counter() - started
    after = _counters(client)
    client.close()
    stop.set()
    per_token = {k: round((after[k] - before.get(k, 0.0)) / generated, 4)
                 for k in after if after[k] > before.get(k, 0.0) and "info" not in k}
    return {"jobs": jobs, "tokens_per_job": tokens, "steps": steps,
            "interval_ms": interval_ms, "subscribers": len(listeners),
            "generated_tokens": generated, "batch_wall_ms": round(elapsed / steps * 1000, 3),
            "per_token": per_token}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--jobs", type=int, default=64, help="jobs per batch")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per job")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--interval-ms", type=float, default=0.0,
                        help="pause between batches, as an engine step would (Redis then "
                             "sleeps and wakes for each batch, as it does in a fleet)")
    parser.add_argument("--subscribers", action="store_true",
                        help="two clients subscribed to the reply channels (PUBLISH then "
                             "delivers, as it does in a fleet)")
    parser.add_argument("--out", default="benchmarks/results/batch_script_cost.json")
    args = parser.parse_args(argv)
    result = run(args.redis, args.jobs, args.tokens, args.steps, args.interval_ms,
                 args.subscribers)
    per_token = result["per_token"]
    assert isinstance(per_token, dict)
    print(f"{result['generated_tokens']} tokens in {args.steps} batches of {args.jobs} jobs "
          f"({result['batch_wall_ms']} ms per batch, round trip included)")
    print(f"Redis CPU µs per token: {per_token.get('cpu_us', 0):.2f}")
    for key in sorted(k for k in per_token if k.startswith("usec:")):
        name = key.removeprefix("usec:")
        print(f"  {name:<10} {per_token.get('calls:' + name, 0):.4f} calls, "
              f"{per_token[key]:.3f} µs per token")
    write_result(args.out, "batch_script_cost", args, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
