"""Which Redis errors are held and retried: the server's refusals, however worded.

The texts are the ones Redis 7 and redis-py produce for a refused plain command, a
refused command in a pipeline and a refused script (seen against a real server under
``min-replicas-to-write``); a malformed call or a script's own bug is not a refusal.
"""

from __future__ import annotations

import pytest
import redis

from kvrelay.redis_faults import is_refusal, is_transient


@pytest.mark.parametrize("text", [
    "NOREPLICAS Not enough good replicas to write.",
    "Command # 1 (SET k 1 EX 3600) of pipeline caused error: "
    "('NOREPLICAS Not enough good replicas to write.',)",
    "NOREPLICAS Not enough good replicas to write. script: 4dc1f4, on @user_script:2.",
    "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist",
    "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
    "NOPERM User tenant has no permissions to run the 'eval' command",
    "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
])
def test_refusals_are_held(text: str) -> None:
    assert is_refusal(redis.ResponseError(text))
    assert is_transient(redis.ResponseError(text))


@pytest.mark.parametrize("exc", [
    redis.ReadOnlyError("You can't write against a read only replica."),
    redis.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
    redis.BusyLoadingError("Redis is loading the dataset in memory"),
    # A pipeline's refusal, as redis-py words it (the NOPERM code dropped).
    redis.exceptions.NoPermissionError("Command # 1 (ZADD k 1 m) of pipeline caused error: "
                                       "this user has no permissions to run the 'zadd' command"),
    redis.ConnectionError("Connection refused"),
    redis.TimeoutError("Timeout reading from socket"),
])
def test_unreachable_or_refusing_servers_are_transient(exc: redis.RedisError) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize("text", [
    "ERR wrong number of arguments for 'set' command",
    "WRONGTYPE Operation against a key holding the wrong kind of value",
    "ERR user_script:12: attempt to compare nil with number script: 4dc1f4",
    "ERR Error running script: the job's busy flag is set",
])
def test_faults_of_the_call_are_not(text: str) -> None:
    assert not is_transient(redis.ResponseError(text))
