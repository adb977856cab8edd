"""A worker's settings error about its Redis URL names the URL without its password."""

from __future__ import annotations

import pytest

from kvrelay_worker.settings import SettingsError, WorkerSettings


def test_a_bad_redis_url_is_named_without_its_password() -> None:
    with pytest.raises(SettingsError, match="must start with") as refused:
        WorkerSettings.from_env({"KVRELAY_REDIS_URL": "http://admin:hunter2-secret@db:6379/0"})
    assert "hunter2-secret" not in str(refused.value)
    assert "admin:***@db:6379" in str(refused.value)
