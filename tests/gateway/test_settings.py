"""The gateway's variables: NaN, infinity and non-positive timeouts are refused by name
(a NaN timeout would never fire), unset ones keep the defaults."""

from __future__ import annotations

import pytest

from kvrelay.gateway.settings import GatewaySettings


@pytest.mark.parametrize("name", ["KVRELAY_GATEWAY_JOB_TIMEOUT", "KVRELAY_GATEWAY_STREAM_TIMEOUT",
                                  "KVRELAY_GATEWAY_RECONNECT_TIMEOUT"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-3", "soon"])
def test_bad_timeouts_are_refused_by_name(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        GatewaySettings.from_env({name: value})


def test_unset_timeouts_keep_their_defaults_and_set_ones_are_read() -> None:
    default = GatewaySettings.from_env({})
    assert (default.job_timeout, default.stream_timeout, default.reconnect_timeout) == \
        (600.0, 60.0, 30.0)
    read = GatewaySettings.from_env({"KVRELAY_GATEWAY_JOB_TIMEOUT": "12.5",
                                     "KVRELAY_GATEWAY_STREAM_TIMEOUT": "7",
                                     "KVRELAY_GATEWAY_RECONNECT_TIMEOUT": "1.5"})
    assert (read.job_timeout, read.stream_timeout, read.reconnect_timeout) == (12.5, 7.0, 1.5)


def test_tenant_namespaces_are_read_and_unsafe_ones_refused() -> None:
    settings = GatewaySettings.from_env({"KVRELAY_NAMESPACE": "shared",
                                         "KVRELAY_GATEWAY_TENANT_NAMESPACES": "a=team-a,b=team-b"})
    assert settings.namespace_of("a") == "team-a"
    assert settings.namespace_of("someone-else") == "shared"
    assert settings.namespaces == ["shared", "team-a", "team-b"]
    for bad in ("a=team:a", "a=", "a={x}"):
        with pytest.raises(ValueError, match=r"KVRELAY_GATEWAY_TENANT_NAMESPACES|namespace"):
            GatewaySettings.from_env({"KVRELAY_GATEWAY_TENANT_NAMESPACES": bad})
