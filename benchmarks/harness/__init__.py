"""The benchmarks' shared harness: one result writer, one way to start Redis and a
worker stack, timing and percentiles. Scripts in ``benchmarks/`` import it as
``harness`` (Python puts a script's own folder first on its path)."""

from harness.environment import environment
from harness.latency import (
    RequestTrace,
    flush_db,
    percentiles,
    print_report,
    repeat_timed,
    summarize,
)
from harness.machine import git_commit, machine_info
from harness.results import read_result, write_result
from harness.stack import private_redis, tiny_worker_stack, worker_stack

__all__ = [
    "RequestTrace",
    "environment",
    "flush_db",
    "git_commit",
    "machine_info",
    "percentiles",
    "print_report",
    "private_redis",
    "read_result",
    "repeat_timed",
    "summarize",
    "tiny_worker_stack",
    "worker_stack",
    "write_result",
]
