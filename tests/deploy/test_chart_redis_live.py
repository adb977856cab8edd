"""The chart's own Redis container, run for real: its rendered command and environment
(the password from the chart's Secret), its volumes as local folders. The URL the workers
and the gateway get must open it, the password must be required and stay off the command
line, the settings kvrelay relies on must hold, and its readiness probe must pass."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
import redis
from helpers.container_process import ContainerProcess, local_env, with_mounts
from helpers.helm_chart import container, container_env, named, port_number, render, workers
from helpers.redis_server import free_port

pytestmark = pytest.mark.integration

NAME = "kv-kvrelay-redis"


def test_the_chart_redis_serves_the_workers_url(tmp_path: Path) -> None:
    if not (shutil.which("redis-server") and shutil.which("redis-cli")):
        pytest.skip("needs redis-server and redis-cli on PATH (the image's commands)")
    port = free_port()
    objects = render({"redis": {"internal": {"port": port}}}, tmp_path)
    statefulset = named(objects, "StatefulSet", NAME)
    spec = container(statefulset, "redis")
    mounts = {m["mountPath"]: tmp_path / m["name"] for m in spec["volumeMounts"]}
    for folder in mounts.values():
        folder.mkdir()
    env = local_env(container_env(objects, spec), tmp_path / "root")
    server = ContainerProcess(with_mounts(spec["command"], mounts), env,
                              tmp_path / "redis.log").start()
    try:
        probe = spec["readinessProbe"]["exec"]["command"]
        deadline = time.monotonic() + 30
        while subprocess.run(probe, env=env, capture_output=True, text=True,
                             timeout=10).stdout.strip() != "PONG":
            assert server.alive(), server.tail()
            assert time.monotonic() < deadline, server.tail()
            time.sleep(0.1)

        service = named(objects, "Service", NAME)
        [service_port] = service["spec"]["ports"]
        assert port_number(spec, service_port["targetPort"]) == service_port["port"] == port
        url = container_env(objects, container(workers(objects)[0], "worker"))[
            "KVRELAY_REDIS_URL"]
        assert f"@{NAME}:{port}/0" in url
        client = redis.Redis.from_url(url.replace(f"@{NAME}:", "@127.0.0.1:"))
        assert client.ping()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()
        config = client.config_get("*")
        assert config["appendonly"] == "yes"
        assert config["appendfsync"] == "everysec"
        assert config["maxmemory-policy"] == "noeviction"
        assert int(config["proto-max-bulk-len"]) == 4 << 20
        assert Path(config["dir"]) == mounts["/data"]
        assert server.process is not None
        password = env["REDIS_PASSWORD"]
        cmdline = Path(f"/proc/{server.process.pid}/cmdline").read_bytes()
        assert b"redis-server" in cmdline
        assert password.encode() not in cmdline
        client.close()

        server.terminate()
        grace = statefulset["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
        assert server.wait(timeout=grace) == 0, server.tail()
        assert any(mounts["/data"].rglob("*.aof")), "the append-only file is on the volume"
    finally:
        server.stop()
