"""``kvrelay gateway`` and ``kvrelay up --http``: flags, variables and refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvrelay.cli.main import main
from kvrelay.gateway.settings import GatewaySettings, parse_api_keys


def test_up_http_needs_serve(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["up", "--http", "8000"]) == 2
    assert "--http needs --serve" in capsys.readouterr().err


def test_gateway_help_lists_its_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gateway", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--port", "--host", "--redis-url", "--api-keys-file", "--max-queue",
                 "--job-timeout"):
        assert flag in out


def test_settings_from_variables(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# comment\nk1=alice\n\n  k2=bob  \n")
    settings = GatewaySettings.from_env({
        "KVRELAY_REDIS_URL": "redis://r:1/2", "KVRELAY_GATEWAY_API_KEYS_FILE": str(keys),
        "KVRELAY_GATEWAY_API_KEYS": "k3=carol,k1=dave", "KVRELAY_GATEWAY_MAX_QUEUE": "5",
        "KVRELAY_GATEWAY_JOB_TIMEOUT": "2.5"})
    assert settings.redis_url == "redis://r:1/2"
    assert dict(settings.api_keys) == {"k1": "dave", "k2": "bob", "k3": "carol"}
    assert settings.max_queue == 5
    assert settings.job_timeout == 2.5


@pytest.mark.parametrize("text", ["lonely", "=tenant", "key="])
def test_a_malformed_key_line_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="key=tenant"):
        parse_api_keys(text, where="keys")


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf")])
def test_timeouts_must_be_finite_and_positive(value: float) -> None:
    with pytest.raises(ValueError, match="job_timeout"):
        GatewaySettings(job_timeout=value)
