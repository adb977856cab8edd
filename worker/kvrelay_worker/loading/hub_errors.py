"""What went wrong reaching a repository, said as the fix: one line, never a traceback.

``huggingface_hub`` raises its own exceptions (some wrapped in others: a file download that
falls back to the cache raises "not found locally" *from* the HTTP error that sent it
there); the CLI and the worker's start-up show any ``ValueError`` as is, so each cause
becomes a ``HubAccessError`` whose message names the variable, command or spelling that
would work.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kvrelay_worker.loading.hub_name import HubName
from kvrelay_worker.models.errors import UnknownModelError

# Connection and timeout errors of the HTTP libraries huggingface_hub versions use.
_TRANSPORT_ERRORS = (("httpx2", ("TransportError",)), ("httpx", ("TransportError",)),
                     ("requests.exceptions", ("ConnectionError", "Timeout")))
LOGIN_HINT = "set HF_TOKEN=hf_... (a token of an account with access) or run `huggingface-cli login`"


class HubAccessError(UnknownModelError):
    """The repository could not be listed or downloaded (missing, gated, offline, ...)."""


@contextmanager
def hub_errors(name: HubName, endpoint: str, cache_dir: Path, offline: bool,
               kind: str = "repository") -> Iterator[None]:
    """Turn the hub's exceptions raised inside into HubAccessError."""
    try:
        yield
    except HubAccessError:
        raise
    except Exception as exc:  # classified below, re-raised when unknown
        error = explain(exc, name, endpoint, cache_dir, offline, kind)
        if error is None:
            raise
        raise error from exc


def explain(exc: BaseException, name: HubName, endpoint: str, cache_dir: Path, offline: bool,
            kind: str = "repository") -> HubAccessError | None:
    """The HubAccessError for ``exc`` (or for the hub error it was raised from); None when
    ``exc`` is no hub or network trouble."""
    from huggingface_hub import errors

    repo = name.repo_id
    page = f"{endpoint}/{repo}"
    for cause in _chain(exc):
        if isinstance(cause, errors.GatedRepoError):
            return HubAccessError(
                f"{repo} is gated: accept its conditions on {page} while logged in, then "
                f"{LOGIN_HINT} (a token already given has no access to it yet)")
        if isinstance(cause, errors.RevisionNotFoundError):
            return HubAccessError(
                f"{repo} has no revision {name.revision!r}: give a branch, a tag or a commit "
                f"of the repository ({repo}@main), as listed on {page}/tree/main")
        if isinstance(cause, errors.RepositoryNotFoundError):
            return HubAccessError(
                f"no {kind} {repo} on {endpoint} (nor a local folder of that name): check "
                f"the exact name (org/name, as in {page}); if it is private, {LOGIN_HINT}")
        if isinstance(cause, getattr(errors, "FileMetadataError", ())):  # newer clients
            return HubAccessError(
                f"{endpoint} does not answer like a Hugging Face Hub ({_first_line(cause)}): "
                "check HF_ENDPOINT")
        if isinstance(cause, errors.HfHubHTTPError):
            status = getattr(cause.response, "status_code", "?")
            hint = f"; {LOGIN_HINT}" if status in (401, 403) else ""
            return HubAccessError(f"{endpoint} refused {name} (HTTP {status}){hint}")
    if not any(is_network_error(cause) for cause in _chain(exc)):
        return None
    cached_hint = (f"{name} is not in the Hugging Face cache ({cache_dir}, set by HF_HOME or "
                   "HF_HUB_CACHE)")
    if offline:
        return HubAccessError(
            f"{cached_hint} and HF_HUB_OFFLINE is set, so nothing is downloaded: unset "
            f"HF_HUB_OFFLINE to download it once (or run `huggingface-cli download {repo}` "
            "with the same HF_HOME where the hub is reachable)")
    return HubAccessError(
        f"cannot reach {endpoint} ({_first_line(exc)}) and {cached_hint}: check the "
        "network and HF_ENDPOINT; once it is cached, HF_HUB_OFFLINE=1 needs no hub")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what it was raised from or during, outermost first."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_network_error(exc: BaseException) -> bool:
    """A connection, DNS or timeout failure of whichever HTTP library the hub client uses."""
    from huggingface_hub import errors

    if isinstance(exc, errors.HfHubHTTPError):
        return False
    # OfflineModeIsEnabled is a ConnectionError; "not in the cache after the hub failed"
    # is a LocalEntryNotFoundError raised from the failure itself.
    if isinstance(exc, (ConnectionError, TimeoutError, socket.gaierror,
                        errors.LocalEntryNotFoundError)):
        return True
    for module_name, names in _TRANSPORT_ERRORS:  # only libraries already imported: in use
        module = sys.modules.get(module_name)
        for attr in names:
            kind = getattr(module, attr, None) if module else None
            if isinstance(kind, type) and isinstance(exc, kind):
                return True
    return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
