"""A tenant's Redis user runs kvrelay's scripts as Redis Functions (``FCALL``) and no Lua
of its own: ``EVAL``, ``EVALSHA``, ``SCRIPT LOAD`` and ``FUNCTION LOAD`` are refused (an
``EVAL "while true do end" 0`` would block the shared server for every tenant). When the
server lost the functions (``FUNCTION FLUSH``, what a restart without persistence
leaves), a tenant's calls fail with ``FunctionsMissing`` naming the admin command, which
loads them again. (Before, the tenant rules granted ``EVAL`` and its kin.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from kvrelay import AsyncClient
from kvrelay.cli.main import main as kvrelay_main
from kvrelay.keys import Keyspace
from kvrelay.lua_library import LIBRARY
from kvrelay.redis_functions import LOAD_COMMAND, FunctionsMissing
from kvrelay_worker.jobs.job_store import JobEvents, JobStore
from kvrelay_worker.settings import WorkerSettings

pytestmark = pytest.mark.integration

TENANT = "alpha"


def _store(url: str) -> JobStore:
    return JobStore(redis.Redis.from_url(url),
                    WorkerSettings(redis_url=url, model_name="m", namespace=TENANT))


def _library_loaded(admin: redis.Redis) -> bool:
    return bool(admin.function_list(library=LIBRARY.name))


def _calls(admin: redis.Redis) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): int(v["calls"])
            for name, v in admin.info("commandstats").items()}


@pytest.fixture
def urls(acl_redis: tuple[str, dict[str, str]]) -> Iterator[tuple[str, str]]:
    """(admin URL, the tenant's URL); the library is loaded again after each test."""
    admin_url, tenant_urls = acl_redis
    yield admin_url, tenant_urls[TENANT]
    admin = redis.Redis.from_url(admin_url)
    try:
        admin.execute_command("FUNCTION", "LOAD", "REPLACE", LIBRARY.text)
    finally:
        admin.close()


def test_a_tenant_may_not_run_or_load_any_lua(urls: tuple[str, str]) -> None:
    _, tenant_url = urls
    tenant = redis.Redis.from_url(tenant_url)
    try:
        refused = [
            lambda: tenant.eval("return 1", 0),
            lambda: tenant.evalsha("e0e1f9fabfc9d4800c877a703b823ac0578ff8db", 0),
            lambda: tenant.script_load("return 1"),
            lambda: tenant.execute_command(
                "FUNCTION", "LOAD",
                "#!lua name=mine\nredis.register_function('spin', function() end)"),
        ]
        for call in refused:
            with pytest.raises(redis.exceptions.NoPermissionError):
                call()
    finally:
        tenant.close()


def test_a_tenant_job_store_round_trip_runs_by_fcall_only(urls: tuple[str, str]) -> None:
    admin_url, tenant_url = urls
    admin = redis.Redis.from_url(admin_url)
    store = _store(tenant_url)
    try:
        store.scripts.prepare()  # a tenant's worker at start: the admin loaded them
        before = _calls(admin)
        assert store.claim("j", '{"prompt": "p"}', "digest").status == "claimed"
        store.redis.set(Keyspace(TENANT).lease("k"), store.worker_id)
        assert store.append_batch([JobEvents("k", events=[(0, True, b"\x90")],
                                             release=True)]) == [1]
        assert store.release_done("j")
        after = _calls(admin)
        assert after.get("fcall", 0) - before.get("fcall", 0) == 3
        for lua in ("eval", "evalsha", "script|load"):
            assert after.get(lua, 0) == before.get(lua, 0), lua
    finally:
        store.redis.close()
        admin.close()


async def test_lost_functions_name_the_admin_command_which_loads_them_again(
        urls: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    admin_url, tenant_url = urls
    admin = redis.Redis.from_url(admin_url)
    store = _store(tenant_url)
    try:
        admin.execute_command("FUNCTION", "FLUSH")
        # A tenant's worker refuses to start, and a running one's call fails, saying what
        # to run; its user could not load them.
        with pytest.raises(FunctionsMissing, match=LOAD_COMMAND):
            store.scripts.prepare()
        with pytest.raises(FunctionsMissing, match=LOAD_COMMAND):
            store.claim("after-flush", '{"prompt": "p"}', "digest")
        # A tenant's client too.
        async with AsyncClient(tenant_url, model="m", namespace=TENANT,
                               require_worker=False, connect_timeout=3,
                               reconnect_timeout=3) as client:
            with pytest.raises(FunctionsMissing, match=LOAD_COMMAND):
                await client.generate(prompt_token_ids=[1, 2], max_tokens=2)
        assert not _library_loaded(admin)

        assert kvrelay_main(["functions", "--redis-url", admin_url]) == 0
        assert LIBRARY.name in capsys.readouterr().out
        assert _library_loaded(admin)
        assert store.claim("after-flush", '{"prompt": "p"}', "digest").status == "claimed"
    finally:
        store.redis.close()
        admin.close()
