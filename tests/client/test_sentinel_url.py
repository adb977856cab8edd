"""The ``redis+sentinel://`` URL form: what parses, what each side gets, and clear errors."""

from __future__ import annotations

import pytest

from kvrelay import AsyncClient, InvalidRequest
from kvrelay.connection import redact_url
from kvrelay.enqueue import celery_broker_settings
from kvrelay.sentinel_url import (
    SentinelUrl,
    SentinelUrlError,
    is_sentinel_url,
    kombu_sentinel_settings,
    parse_sentinel_url,
)


def test_full_form() -> None:
    target = parse_sentinel_url(
        "redis+sentinel://app:s%40cret@s1.example:26380,10.0.0.2,[::1]:26381/main-cache/3"
        "?wait_replicas=2&wait_timeout_ms=50")
    assert target == SentinelUrl(
        sentinels=(("s1.example", 26380), ("10.0.0.2", 26379), ("::1", 26381)),
        master_name="main-cache", db=3, username="app", password="s@cret",
        wait_replicas=2, wait_timeout_ms=50)
    assert target.primary_kwargs() == {"db": 3, "username": "app", "password": "s@cret"}


def test_defaults() -> None:
    target = parse_sentinel_url("redis+sentinel://localhost/mymaster")
    assert target.sentinels == (("localhost", 26379),)
    assert (target.master_name, target.db, target.username, target.password) == \
        ("mymaster", 0, None, None)
    assert (target.wait_replicas, target.wait_timeout_ms) == (1, 200)
    assert parse_sentinel_url("redis+sentinel://localhost/mymaster/").db == 0
    assert parse_sentinel_url("redis+sentinel://:pw@localhost/m").password == "pw"


@pytest.mark.parametrize(("url", "says"), [
    ("redis://localhost/0", "starts with redis+sentinel://"),
    ("redis+sentinel://localhost", "names no primary"),
    ("redis+sentinel://localhost/", "names no primary"),
    ("redis+sentinel://localhost/m/0/extra", "/<master-name>[/<db>]"),
    ("redis+sentinel://localhost/m/x", "db must be a whole number"),
    ("redis+sentinel://localhost/m/-1", "db must be a whole number"),
    ("redis+sentinel://a:1,,b:2/m", "empty sentinel address"),
    ("redis+sentinel://:26379/m", "has no host"),
    ("redis+sentinel://a:99999/m", "port must be 1-65535"),
    ("redis+sentinel://a:0/m", "port must be 1-65535"),
    ("redis+sentinel://a:port/m", "port must be a whole number"),
    ("redis+sentinel://[::1/m", "bad IPv6"),
    ("redis+sentinel://a/m?ssl=true", "unknown Sentinel URL option 'ssl'"),
    ("redis+sentinel://a/m?wait_replicas=many", "wait_replicas must be a whole number"),
    ("redis+sentinel://a/m?wait_replicas", "not name=value pairs"),
    ("redis+sentinel://a/m#frag", "no #fragment"),
    ("rediss+sentinel://a/m", "TLS through sentinels) is not supported yet"),
])
def test_bad_forms_say_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(SentinelUrlError) as caught:
        parse_sentinel_url(url)
    assert says in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_scheme_detection_ignores_case() -> None:
    assert is_sentinel_url("REDIS+SENTINEL://h/m")
    assert not is_sentinel_url("redis://h:26379/0")
    assert not is_sentinel_url("rediss://h/0")


def test_redacted_hides_the_password() -> None:
    url = "redis+sentinel://u:topsecret@a:1,b:2/m/4"
    assert redact_url(url) == "redis+sentinel://u:***@a:1,b:2/m/4"
    assert "topsecret" not in redact_url(url)
    assert redact_url("redis+sentinel://a/") == "<unparseable sentinel url>"


def test_kombu_spelling() -> None:
    url, options = kombu_sentinel_settings(parse_sentinel_url(
        "redis+sentinel://u:p%3Bw@a:1,b:2/grp/2?wait_replicas=0"))
    # kombu splits its URL list on ';': a password holding one stays quoted.
    assert url == "sentinel://u:p%3Bw@a:1/2;sentinel://u:p%3Bw@b:2/2"
    assert options["master_name"] == "grp"
    assert options["kvrelay_wait_replicas"] == 0


def test_celery_settings_leave_plain_urls_alone() -> None:
    assert celery_broker_settings("redis://h:6379/0") == ("redis://h:6379/0", {})
    assert celery_broker_settings("unix:///tmp/r.sock") == ("redis+socket:///tmp/r.sock", {})
    url, options = celery_broker_settings("redis+sentinel://h/m")
    assert url == "sentinel://h:26379/0"
    assert options["master_name"] == "m"


async def test_client_refuses_a_bad_sentinel_url_with_a_typed_error() -> None:
    with pytest.raises(InvalidRequest, match="names no primary"):
        AsyncClient("redis+sentinel://localhost:26379", model="m")


def test_worker_settings_accept_and_check_the_form() -> None:
    pytest.importorskip("kvrelay_worker")
    from kvrelay_worker.settings import SettingsError, WorkerSettings

    ok = WorkerSettings.from_env({"KVRELAY_REDIS_URL": "redis+sentinel://h1,h2/m/1",
                                  "KVRELAY_MODEL": "llama-mqa"})
    assert ok.redis_url.startswith("redis+sentinel://")
    with pytest.raises(SettingsError, match=r"KVRELAY_REDIS_URL: .*port must be 1-65535"):
        WorkerSettings.from_env({"KVRELAY_REDIS_URL": "redis+sentinel://h:0/m",
                                 "KVRELAY_MODEL": "llama-mqa"})
