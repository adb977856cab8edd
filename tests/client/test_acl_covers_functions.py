"""Every command kvrelay's functions call is one a tenant's user may run.

Redis checks each ``redis.call`` inside a function against the caller's ACL, so a
command missing from ``TENANT_COMMANDS`` fails only for tenants, and only when that line
of Lua runs (a ``TTL`` in the publisher's batch once refused every tenant batch).
"""

from __future__ import annotations

import re

from kvrelay.acl import TENANT_COMMANDS
from kvrelay.lua_library import LIBRARY

CALLED = re.compile(r"redis\.p?call\(\s*'([A-Za-z]+)'")


def test_every_command_the_library_calls_is_granted_to_tenants() -> None:
    called = {name.lower() for name in CALLED.findall(LIBRARY.text)}
    assert len(called) > 20  # the pattern still finds the library's calls
    assert called - set(TENANT_COMMANDS) == set()
