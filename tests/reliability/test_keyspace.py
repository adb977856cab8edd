"""Namespaced names: one prefix per tenant, hash tags kept, prefix cache kept apart."""

from __future__ import annotations

import pytest

from kvrelay import AsyncClient, InvalidRequest
from kvrelay.acl import tenant_acl_rules
from kvrelay.keys import Keyspace, NamespaceError

JOB = "j1"


def _names(keys: Keyspace) -> list[str]:
    return [keys.control_channel, keys.workers, keys.worker_heartbeat("w"), keys.queue("m"),
            keys.running_jobs("m"), keys.events_channel(JOB), keys.event_log(JOB),
            keys.abort_flag(JOB), keys.job_record(JOB), keys.lease(JOB),
            keys.requeue_marker(JOB)]


def test_default_namespace_keeps_todays_names() -> None:
    keys = Keyspace()
    assert keys.prefix == "kvrelay:"
    assert keys.queue("m") == keys.celery_queue("m") == "kvrelay:queue:m"
    assert keys.event_log(JOB) == "kvrelay:log:{j1}"
    assert "global_keyprefix" not in keys.celery_transport_options()


def test_every_name_of_a_namespace_shares_its_prefix() -> None:
    alpha = Keyspace("alpha")
    assert alpha.prefix == "kvrelay:ns:alpha:"
    names = _names(alpha)
    assert len(set(names)) == len(names)
    assert all(name.startswith(alpha.prefix) for name in names)
    # A job's keys keep the job id as their hash tag (one Redis Cluster slot).
    for name in names[5:]:
        assert name.endswith("{j1}")
    # Celery reaches the same Redis list through kombu's global prefix.
    options = alpha.celery_transport_options()
    assert options["global_keyprefix"] + alpha.celery_queue("m") == alpha.queue("m")
    assert all((options["global_keyprefix"] + options[k]).startswith(alpha.prefix)
               for k in ("unacked_key", "unacked_index_key", "unacked_mutex_key"))


def test_no_tenant_sees_anothers_or_the_default_names() -> None:
    spaces = [Keyspace(), Keyspace("a"), Keyspace("ab"), Keyspace("queue"), Keyspace("ev")]
    for tenant in spaces[1:]:
        for other in spaces:
            if other is not tenant:
                assert not any(name.startswith(tenant.prefix) for name in _names(other))


@pytest.mark.parametrize("bad", ["a:b", "{x}", "a b", "a*", "x" * 65, "é"])
def test_unsafe_namespaces_are_refused(bad: str) -> None:
    with pytest.raises(NamespaceError):
        Keyspace(bad)
    with pytest.raises(InvalidRequest, match="namespace"):
        AsyncClient("redis://localhost:1/0", namespace=bad)


def test_prefix_cache_salt_differs_per_namespace() -> None:
    from kvrelay_worker.engine.kv.kv_cache import root_hash

    roots = {root_hash("m", Keyspace(ns).cache_salt(salt))
             for ns in ("", "alpha", "beta") for salt in (None, "s")}
    assert len(roots) == 6
    assert Keyspace().cache_salt("s") == "s"  # the default namespace is unchanged


def test_acl_rules_confine_to_the_prefix() -> None:
    rules = tenant_acl_rules(Keyspace("alpha"))
    assert "~kvrelay:ns:alpha:*" in rules
    assert "&kvrelay:ns:alpha:*" in rules
    assert "-@all" in rules
    assert not any(r in rules for r in ("+keys", "+scan", "+flushall", "+psubscribe", "+@all"))
    with pytest.raises(ValueError, match="default namespace"):
        tenant_acl_rules(Keyspace())


def test_docs_show_the_same_acl_rules() -> None:
    from pathlib import Path

    page = Path(__file__).resolve().parents[2] / "docs" / "behaviour.md"
    block = page.read_text(encoding="utf-8").split("ACL SETUSER acme on >PASSWORD ", 1)[1].split("```", 1)[0]
    assert block.split() == tenant_acl_rules(Keyspace("acme"))
