"""kvrelay's Lua scripts as one Redis Functions library, and how they are called.

A tenant's ACL user may run ``FCALL`` but neither ``EVAL`` nor ``FUNCTION LOAD`` (both run
any Lua, which can block the shared server): the scripts are loaded once, by the worker
or an admin (``kvrelay functions``), as one library whose name and function names carry
a hash of its text, so two worker versions coexist during a rolling upgrade.

Redis 6.2 has no functions: there the same bodies run by ``EVALSHA`` (loaded again on
``NOSCRIPT``), which only the default namespace may rely on (tenants need Redis >= 7).
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import redis
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import NoPermissionError, NoScriptError, ResponseError

from kvrelay.errors import KvrelayError

__all__ = [
    "LOAD_COMMAND",
    "AsyncFunctions",
    "Functions",
    "FunctionsMissing",
    "Library",
    "LuaScript",
    "NoFunctions",
    "has_functions",
]

T = TypeVar("T")

# What an admin runs to load the library (a tenant's user may not).
LOAD_COMMAND: Final = "kvrelay functions"


class FunctionsMissing(KvrelayError, code="redis_functions_missing"):
    """The server lacks this version's functions and this caller may not load them."""


class NoFunctions(KvrelayError, code="redis_functions_unsupported"):
    """A namespace (tenant) is configured on a Redis without functions (before 7)."""


@dataclass(frozen=True)
class LuaScript:
    """One script: its function's short name, its body (reads ``KEYS`` and ``ARGV``),
    whether it calls the library's shared helpers, and its function flags (none: a Redis
    out of memory refuses the whole call before it runs, never half of its writes;
    ``allow-oom``: it runs anyway). Without functions (6.2) it runs unflagged."""

    name: str
    body: str
    helpers: bool = False
    flags: tuple[str, ...] = ()


class Library:
    """The library text built from ``scripts`` (``helpers`` defined once, at its top)."""

    def __init__(self, helpers: str, scripts: Sequence[LuaScript]) -> None:
        self.helpers = helpers
        self.scripts = tuple(scripts)
        registrations = "".join(
            f"redis.register_function{{function_name='kvrelay_@VERSION@_{s.name}', "
            f"callback=function(KEYS, ARGV)\n{s.body.strip()}\nend, "
            f"flags={{{', '.join(repr(f) for f in s.flags)}}}}}\n"
            for s in self.scripts)
        template = f"#!lua name=kvrelay_@VERSION@\n{helpers.strip()}\n{registrations}"
        self.version = hashlib.sha1(template.encode()).hexdigest()[:8]
        self.name = f"kvrelay_{self.version}"
        self.text = template.replace("@VERSION@", self.version)
        self._shas: dict[str, str] = {}

    def function(self, script: LuaScript) -> str:
        return f"{self.name}_{script.name}"

    def eval_text(self, script: LuaScript) -> str:
        """The script for ``EVAL`` (no functions): its helpers prepended, no flag line
        (Redis 6.2 cannot parse one)."""
        return (self.helpers + script.body) if script.helpers else script.body

    def sha(self, script: LuaScript) -> str:
        if script.name not in self._shas:
            self._shas[script.name] = hashlib.sha1(self.eval_text(script).encode()).hexdigest()
        return self._shas[script.name]


def _version_major(reply: Any) -> int:
    """The major version in a ``HELLO`` reply (a map, or RESP2's flat list of pairs)."""
    if isinstance(reply, list):
        reply = dict(zip(reply[::2], reply[1::2]))
    raw = reply.get(b"version", reply.get("version", b"0")) if isinstance(reply, dict) else b"0"
    version = raw.decode() if isinstance(raw, bytes) else str(raw)
    return int(version.split(".", 1)[0])


def has_functions(client: redis.Redis) -> bool:
    """Functions came with Redis 7. The version comes from ``HELLO`` (no arguments: the
    protocol stays as it is), not ``INFO``, which a tenant's user may not run."""
    return _version_major(client.execute_command("HELLO")) >= 7


def is_missing(result: object) -> bool:
    """A call's error reply saying the server lacks the function or script."""
    return isinstance(result, NoScriptError) or (
        isinstance(result, ResponseError) and "function not found" in str(result).lower())


def _missing(library: Library) -> FunctionsMissing:
    return FunctionsMissing(
        f"Redis lacks kvrelay's functions ({library.name}) and this user may not load "
        f"them: run `{LOAD_COMMAND}` with an admin's KVRELAY_REDIS_URL")


def _no_functions(namespace: str) -> NoFunctions:
    return NoFunctions(f"namespace {namespace!r} needs Redis >= 7 (Redis Functions); this "
                       "server is older: upgrade it, or run without a namespace")


class Functions:
    """Calls the library's scripts on one synchronous client (and its pipelines).

    ``functions``: whether the server has them (None: ask it, once). ``may_load``:
    whether this caller loads what the server lacks (a worker, an admin); otherwise a
    missing function raises ``FunctionsMissing``, which says what to run.
    """

    def __init__(self, client: redis.Redis, library: Library, *, namespace: str = "",
                 may_load: bool = True, functions: bool | None = None) -> None:
        self.client = client
        self.library = library
        self.namespace = namespace
        self.may_load = may_load
        self._functions = functions

    @property
    def functions(self) -> bool:
        if self._functions is None:
            self._functions = has_functions(self.client)
        return self._functions

    def prepare(self) -> None:
        """At start: refuse a namespace without functions; load the library (or, where
        this user may not, check that it is there)."""
        if not self.functions:
            if self.namespace:
                raise _no_functions(self.namespace)
            return
        try:
            self.load()
        except FunctionsMissing:
            probe = self.client.pipeline(transaction=False)
            self.queue(probe, self.library.scripts[0], [], [], check_only=True)
            reply = probe.execute(raise_on_error=False)[0]
            if is_missing(reply):
                raise

    def load(self) -> None:
        """Load the library (or, without functions, the scripts); one already there is
        fine. A user that may not load gets ``FunctionsMissing``."""
        if not self.may_load:
            raise _missing(self.library)
        try:
            if self.functions:
                self.client.execute_command("FUNCTION", "LOAD", self.library.text)
            else:
                for script in self.library.scripts:
                    self.client.script_load(self.library.eval_text(script))
        except NoPermissionError:
            raise _missing(self.library) from None
        except ResponseError as exc:
            if "already exists" not in str(exc):
                raise

    def queue(self, pipe: Any, script: LuaScript, keys: Sequence[Any], args: Sequence[Any],
              *, check_only: bool = False) -> None:
        """Add one call to ``pipe`` (``FCALL``, or ``EVALSHA`` without functions)."""
        if self.functions:
            if check_only:
                # A negative key count never runs the body: Redis looks the function
                # up first ("Function not found"), then refuses the count.
                pipe.execute_command("FCALL", self.library.function(script), -1)
                return
            pipe.execute_command("FCALL", self.library.function(script), len(keys), *keys, *args)
        else:
            pipe.execute_command("EVALSHA", self.library.sha(script), len(keys), *keys, *args)

    def call(self, script: LuaScript, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """One call; loaded and sent again once when the server lacks the script."""
        result = self._send(script, keys, args)
        if is_missing(result):
            self.load()
            result = self._send(script, keys, args)
        if isinstance(result, Exception):
            raise result
        return result

    def _send(self, script: LuaScript, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        pipe = self.client.pipeline(transaction=False)
        self.queue(pipe, script, keys, args)
        return pipe.execute(raise_on_error=False)[0]


class AsyncFunctions:
    """``Functions`` for an asyncio client: the same calls, the same rules."""

    def __init__(self, client: AsyncRedis, library: Library, *, namespace: str = "",
                 may_load: bool = True) -> None:
        self.client = client
        self.library = library
        self.namespace = namespace
        self.may_load = may_load
        self._functions: bool | None = None

    async def functions(self) -> bool:
        if self._functions is None:
            self._functions = _version_major(await self.client.execute_command("HELLO")) >= 7
            if not self._functions and self.namespace:
                raise _no_functions(self.namespace)
        return self._functions

    async def load(self) -> None:
        if not self.may_load:
            raise _missing(self.library)
        try:
            if await self.functions():
                await self.client.execute_command("FUNCTION", "LOAD", self.library.text)
            else:
                for script in self.library.scripts:
                    await self.client.script_load(self.library.eval_text(script))
        except NoPermissionError:
            raise _missing(self.library) from None
        except ResponseError as exc:
            if "already exists" not in str(exc):
                raise

    async def queue(self, pipe: Any, script: LuaScript, keys: Sequence[Any],
                    args: Sequence[Any]) -> None:
        """Add one call to ``pipe`` (asks the server's version first, once)."""
        if await self.functions():
            pipe.execute_command("FCALL", self.library.function(script), len(keys), *keys, *args)
        else:
            pipe.execute_command("EVALSHA", self.library.sha(script), len(keys), *keys, *args)

    async def retry_missing(self, send: Callable[[], Awaitable[T]]) -> T:
        """``send()`` (a round trip that calls scripts through ``queue``); once more after
        loading them where the server lacks them (raises ``FunctionsMissing`` where this
        caller may not load)."""
        try:
            return await send()
        except ResponseError as exc:
            if not is_missing(exc):
                raise
        await self.load()
        return await send()
