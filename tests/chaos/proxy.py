"""A TCP proxy between each worker and Redis, so the harness can cut one worker off,
blackhole its connections or slow Redis down, without touching the worker's process or
the server.

One ``ProxyHub`` runs every listener on one asyncio loop in a thread of its own. A
``ProxyGroup`` is one worker's listeners: one per Redis server (and, behind sentinels,
one per sentinel, whose replies are rewritten to name this group's listeners:
``chaos.sentinel_view``). Faults on a group are counted, so overlapping ones heal in any
order:

- **cut**: every connection reset and new ones refused (the listeners closed), as when
  the worker's host loses its network; the worker's engine computes on (unlike SIGSTOP).
- **blackhole**: connections stay open but nothing passes either way (new connections
  are accepted and wait): calls time out. What was held is delivered when it heals, as
  TCP's retransmission would, so a write the worker gave up on may still land late.
- **latency** (the hub's, on every group): each chunk to or from a Redis server waits
  ``latency_s`` before it is passed on, in order: a slow Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from chaos.sentinel_view import ReplyRewriter

HOST = "127.0.0.1"
# Seconds a control call (listen, cut, heal) may take on the proxy's loop.
CONTROL_TIMEOUT_S = 10.0
_CHUNK = 1 << 16
T = TypeVar("T")


@dataclass(frozen=True)
class Route:
    """One listener: its name in the group, the port it forwards to, and whether
    latency applies (to a Redis server, not to a sentinel)."""

    name: str
    upstream_port: int
    slow: bool = True


class _Link:
    """One accepted connection and its upstream one."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.writers = [client]
        self.task: asyncio.Task[Any] | None = None

    def abort(self) -> None:
        for writer in self.writers:
            writer.transport.abort()  # a reset, not a polite close
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel()


class ProxyGroup:
    """One worker's listeners; ``cut``/``heal_cut`` and ``blackhole``/``heal_blackhole``
    may be called from any thread."""

    def __init__(self, hub: ProxyHub, name: str, routes: list[Route]) -> None:
        self.hub = hub
        self.name = name
        self.routes = routes
        self.ports: dict[str, int] = {}
        self._servers: list[asyncio.AbstractServer] = []
        self._links: set[_Link] = set()
        self._cuts = 0
        self._holds = 0
        self._open: asyncio.Event | None = None
        # Per route: the real ports its replies name, as this group's listener ports
        # (known only once every listener listens: ``set_rewrites``).
        self._rewrites: dict[str, dict[int, int]] = {}

    def port(self, name: str) -> int:
        return self.ports[name]

    def set_rewrites(self, name: str, ports: dict[int, int]) -> None:
        """Replies on listener ``name`` name these real ports as these listener ports."""
        self._rewrites[name] = dict(ports)

    # Control, from any thread.
    def cut(self) -> None:
        self.hub.call(self._cut())

    def heal_cut(self) -> None:
        self.hub.call(self._heal_cut())

    def blackhole(self) -> None:
        self.hub.call(self._blackhole())

    def heal_blackhole(self) -> None:
        self.hub.call(self._heal_blackhole())

    def connections(self) -> int:
        return len(self._links)

    # On the proxy's loop.
    async def listen(self) -> None:
        if self._open is None:
            self._open = asyncio.Event()
            self._open.set()
        for route in self.routes:
            server = await asyncio.start_server(functools.partial(self._accept, route),
                                                HOST, self.ports.get(route.name, 0))
            self.ports[route.name] = server.sockets[0].getsockname()[1]
            self._servers.append(server)

    async def _stop_listening(self) -> None:
        servers, self._servers = self._servers, []
        for server in servers:
            server.close()
            await server.wait_closed()

    async def _cut(self) -> None:
        self._cuts += 1
        if self._cuts == 1:
            await self._stop_listening()
            for link in list(self._links):
                link.abort()
            self._links.clear()

    async def _heal_cut(self) -> None:
        if self._cuts <= 0:
            raise RuntimeError(f"{self.name}: not cut")
        self._cuts -= 1
        if self._cuts == 0:
            await self.listen()

    async def _blackhole(self) -> None:
        assert self._open is not None
        self._holds += 1
        self._open.clear()

    async def _heal_blackhole(self) -> None:
        assert self._open is not None
        if self._holds <= 0:
            raise RuntimeError(f"{self.name}: not blackholed")
        self._holds -= 1
        if self._holds == 0:
            self._open.set()

    async def close(self) -> None:
        await self._stop_listening()
        for link in list(self._links):
            link.abort()
        self._links.clear()

    async def _passable(self) -> None:
        assert self._open is not None
        await self._open.wait()

    async def _accept(self, route: Route, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        link = _Link(writer)
        link.task = asyncio.current_task()
        self._links.add(link)
        try:
            await self._passable()  # a blackhole holds the connect too
            up_reader, up_writer = await asyncio.open_connection(HOST, route.upstream_port)
            link.writers.append(up_writer)
            ports = self._rewrites.get(route.name)
            rewriter = ReplyRewriter(ports) if ports else None
            pumps = [asyncio.create_task(self._pump(reader, up_writer, route.slow, None)),
                     asyncio.create_task(self._pump(up_reader, writer, route.slow, rewriter))]
            try:
                await asyncio.gather(*pumps)
            finally:
                for pump in pumps:
                    pump.cancel()
        except (OSError, asyncio.IncompleteReadError):
            pass  # the server went away or refused: the worker sees its connection end
        except asyncio.CancelledError:
            # A cut or the hub's close ended this connection. Returning, not raising:
            # Python 3.11's stream callback asks a cancelled handler for its exception
            # and logs the CancelledError that raises.
            pass
        finally:
            self._links.discard(link)
            link.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    slow: bool, rewriter: ReplyRewriter | None) -> None:
        """Pass one direction on, chunk by chunk, each after its delay and only while the
        group is not blackholed; the end of the stream is passed on too."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def feed() -> None:
            try:
                while data := await reader.read(_CHUNK):
                    if rewriter is not None:
                        data = rewriter.feed(data)
                    delay = self.hub.latency_s if slow else 0.0
                    queue.put_nowait((loop.time() + delay, data))
            except OSError:
                pass
            finally:
                queue.put_nowait(None)

        feeder = asyncio.create_task(feed())
        try:
            while (item := await queue.get()) is not None:
                due, data = item
                await self._passable()
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                    await self._passable()
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        finally:
            feeder.cancel()


class ProxyHub:
    """The loop every group's listeners run on; ``close`` ends them all."""

    def __init__(self) -> None:
        self.latency_s = 0.0
        self.groups: list[ProxyGroup] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="chaos-proxy",
                                        daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the proxy's loop and return its result (its error raised)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(CONTROL_TIMEOUT_S)

    def group(self, name: str, routes: list[Route],
              rewrites: Callable[[ProxyGroup], dict[str, dict[int, int]]] | None = None
              ) -> ProxyGroup:
        """A listening group; ``rewrites`` (given the group, its ports known) names, per
        route, the ports its replies must show as this group's."""
        group = ProxyGroup(self, name, routes)
        self.call(group.listen())
        for route_name, ports in (rewrites(group) if rewrites else {}).items():
            group.set_rewrites(route_name, ports)
        self.groups.append(group)
        return group

    def set_latency(self, seconds: float) -> None:
        """Every chunk to or from a Redis server waits ``seconds`` from now on."""
        self.latency_s = seconds

    def close(self) -> None:
        for group in self.groups:
            with contextlib.suppress(Exception):  # closing: each group as far as it goes
                self.call(group.close())
        with contextlib.suppress(Exception):
            self.call(_cancel_the_rest())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CONTROL_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()


async def _cancel_the_rest() -> None:
    """Cancel every task left on the loop (connections' pumps) and let them end."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def sentinel_group(hub: ProxyHub, name: str, servers: list[int], sentinels: list[int],
                   master_name: str) -> tuple[ProxyGroup, str]:
    """A worker's group behind sentinels: a listener per Redis server (on ``servers``)
    and per sentinel, the sentinels' replies naming the group's listeners; and the
    ``redis+sentinel://`` URL the worker is given."""
    server_routes = {f"redis{i}": port for i, port in enumerate(servers)}
    sentinel_routes = {f"sentinel{i}": port for i, port in enumerate(sentinels)}
    routes = [Route(route, port) for route, port in server_routes.items()]
    routes += [Route(route, port, slow=False) for route, port in sentinel_routes.items()]

    def rewrites(group: ProxyGroup) -> dict[str, dict[int, int]]:
        ports = {port: group.port(route) for route, port in server_routes.items()}
        return {route: ports for route in sentinel_routes}

    group = hub.group(name, routes, rewrites)
    hosts = ",".join(f"{HOST}:{group.port(route)}" for route in sentinel_routes)
    return group, f"redis+sentinel://{hosts}/{master_name}/0"
