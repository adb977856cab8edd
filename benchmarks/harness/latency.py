"""Timing and percentiles: serving metrics from per-token timestamps (TTFT, TPOT, ITL),
throughput, and repeated timed calls."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestTrace:
    """When a request was sent and when each of its tokens became visible."""

    sent: float
    token_times: list[float] = field(default_factory=list)

    def add(self, when: float, count: int) -> None:
        self.token_times.extend([when] * count)

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.sent

    @property
    def tpot(self) -> float | None:
        n = len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) / (n - 1) if n > 1 else None

    @property
    def itls(self) -> list[float]:
        """Gaps between consecutive token arrivals (tokens arriving together share one)."""
        times = self.token_times
        gaps = []
        i = 1
        while i < len(times):
            j = i
            while j + 1 < len(times) and times[j + 1] == times[i]:
                j += 1
            share = (times[i] - times[i - 1]) / (j - i + 1)
            gaps.extend([share] * (j - i + 1))
            i = j + 1
        return gaps


def percentiles(values: Sequence[float], points: Sequence[int] = (50, 90, 99)) -> dict[str, float]:
    if not values:
        return {f"p{p}": float("nan") for p in points}
    ordered = sorted(values)
    out = {}
    for p in points:
        k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
        out[f"p{p}"] = ordered[k]
    return out


def summarize(traces: Sequence[RequestTrace], start: float) -> dict[str, Any]:
    end = max(t.token_times[-1] for t in traces)
    tokens = sum(len(t.token_times) for t in traces)
    ttft = [t.ttft for t in traces]
    tpot = [x for t in traces if (x := t.tpot) is not None]
    itl = [g for t in traces for g in t.itls]
    return {
        "requests": len(traces),
        "output_tokens": tokens,
        "wall_s": end - start,
        "output_tok_s": tokens / (end - start),
        "request_throughput": len(traces) / (end - start),
        "ttft_ms": {k: v * 1e3 for k, v in percentiles(ttft).items()},
        "tpot_ms": {k: v * 1e3 for k, v in percentiles(tpot).items()},
        "itl_ms": {k: v * 1e3 for k, v in percentiles(itl).items()},
        "ttft_mean_ms": statistics.fmean(ttft) * 1e3,
    }


def flush_db(url: str) -> None:
    """Empty the scratch Redis database a benchmark was given."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    finally:
        client.close()


def print_report(figures: dict[str, Any]) -> None:
    """Print ``figures`` as an aligned two-column table (the file is ``write_result``'s)."""
    width = max(len(k) for k in figures)
    for key, value in figures.items():
        print(f"{key:<{width}}  {value}")


def repeat_timed(call: Callable[[], object], repeats: int, warmup: int = 1) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``call``, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times
