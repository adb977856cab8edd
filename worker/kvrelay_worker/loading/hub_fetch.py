"""Fetch a Hugging Face Hub repository by name into the shared Hugging Face cache.

Any repository, not only models: a LoRA adapter or a tokenizer is fetched the same way
(``fetch_repo("org/name@rev", allow_patterns=[...])`` is a local folder). Everything goes
through ``huggingface_hub`` into its own cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``), so
what ``huggingface-cli download`` or transformers fetched is reused and the other way round,
and the hub's settings hold: ``HF_TOKEN`` (or the token ``huggingface-cli login`` stored),
``HF_ENDPOINT`` (a mirror, or a test server), ``HF_HUB_OFFLINE`` (the cache alone: nothing
is asked of the network). They are read at each call, not when huggingface_hub was imported.

The progress bar is huggingface_hub's own, on stderr: shown only when stderr is a
terminal, off with ``HF_HUB_DISABLE_PROGRESS_BARS=1`` (or ``progress=False``).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from kvrelay_worker.loading.hub_errors import HubAccessError, hub_errors, is_network_error
from kvrelay_worker.loading.hub_name import HubName, parse_hub_name

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://huggingface.co"
_COMMIT = re.compile(r"[0-9a-f]{40}")
_TRUE = {"1", "on", "yes", "true"}


@dataclass(frozen=True)
class HubSettings:
    """The hub settings of this process, as its environment says now."""

    endpoint: str
    cache_dir: Path
    offline: bool

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HubSettings:
        from huggingface_hub import constants

        env = os.environ if env is None else env
        endpoint = env.get("HF_ENDPOINT", "").strip().rstrip("/") or DEFAULT_ENDPOINT
        offline_flag = env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE") or ""
        # Offline as imported counts too: huggingface_hub then refuses every request itself.
        offline = offline_flag.strip().lower() in _TRUE or bool(constants.HF_HUB_OFFLINE)
        return cls(endpoint, _cache_dir(env, constants.HF_HUB_CACHE), offline)


def _cache_dir(env: Mapping[str, str], imported_default: str) -> Path:
    """HF_HUB_CACHE, else HF_HOME/hub, else where huggingface_hub's defaults put it."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(variable):
            return Path(env[variable]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    return Path(imported_default).expanduser()


class HubRepo:
    """One repository at one revision: list its files, fetch some of them.

    Listing asks the hub (one metadata request); offline, or when the hub cannot be
    reached, it lists the snapshot already in the cache. ``fetch`` downloads only what is
    missing from the cache: a second fetch of the same files asks for no file at all.
    """

    def __init__(self, name: HubName, *, repo_type: str = "model", progress: bool = True,
                 settings: HubSettings | None = None) -> None:
        self.name = name
        self.repo_type = repo_type
        self.progress = progress
        self.settings = settings or HubSettings.from_env()

    def _errors(self) -> AbstractContextManager[None]:
        s = self.settings
        return hub_errors(self.name, s.endpoint, s.cache_dir, s.offline, self.repo_type)

    def files(self) -> list[str]:
        """Every file of the repository at this revision (paths with ``/``)."""
        if not self.settings.offline:
            from huggingface_hub import HfApi

            with self._errors():
                try:
                    info = HfApi(endpoint=self.settings.endpoint).repo_info(
                        self.name.repo_id, revision=self.name.revision, repo_type=self.repo_type)
                    siblings = getattr(info, "siblings", None) or []
                    return [sibling.rfilename for sibling in siblings]
                except Exception as exc:
                    cached = self.cached_snapshot() if is_network_error(exc) else None
                    if cached is None:
                        raise
                    log.warning("%s: %s unreachable (%s); using the cached snapshot %s",
                                self.name, self.settings.endpoint, exc, cached)
                    return _listing(cached)
        cached = self.cached_snapshot()
        if cached is None:
            with self._errors():
                raise ConnectionError("HF_HUB_OFFLINE is set and the repository is not cached")
        return _listing(cached)

    def fetch(self, allow_patterns: list[str] | None = None) -> Path:
        """The snapshot folder, holding at least the files ``allow_patterns`` match (all
        files with None), downloaded into the cache as needed."""
        from huggingface_hub import snapshot_download

        s = self.settings
        log.info("fetching %s (%s) from %s into %s", self.name,
                 "all files" if allow_patterns is None else f"{len(allow_patterns)} patterns",
                 "the cache alone" if s.offline else s.endpoint, s.cache_dir)
        with self._errors():
            folder = snapshot_download(
                self.name.repo_id,
                repo_type=self.repo_type,
                revision=self.name.revision,
                cache_dir=str(s.cache_dir),
                endpoint=s.endpoint,
                allow_patterns=allow_patterns,
                local_files_only=s.offline,
                tqdm_class=None if self._show_progress() else _Silent,
            )
        return Path(folder)

    def _show_progress(self) -> bool:
        """huggingface_hub's bar, on a terminal only (a worker's log file gets none), unless
        turned off (``progress=False``, ``HF_HUB_DISABLE_PROGRESS_BARS=1``)."""
        disabled = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "").strip().lower() in _TRUE
        return self.progress and not disabled and sys.stderr.isatty()

    def cached_snapshot(self) -> Path | None:
        """The cache's snapshot folder for this revision, if one was fetched before."""
        repo_folder = self.settings.cache_dir / (
            f"{self.repo_type}s--" + self.name.repo_id.replace("/", "--"))
        revision = self.name.revision or "main"
        commit = revision if _COMMIT.fullmatch(revision) else None
        ref = repo_folder / "refs" / revision
        if commit is None and ref.is_file():
            commit = ref.read_text(encoding="utf-8").strip()
        folder = repo_folder / "snapshots" / commit if commit else None
        return folder if folder is not None and folder.is_dir() else None


def _listing(folder: Path) -> list[str]:
    return sorted(path.relative_to(folder).as_posix()
                  for path in folder.rglob("*") if path.is_file())


class _Silent(tqdm):
    """A progress bar that never shows (``progress=False``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("name", None)  # huggingface_hub's own bar class takes a name; tqdm not
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)


def fetch_repo(name: str | HubName, allow_patterns: list[str] | None = None, *,
               repo_type: str = "model", progress: bool = True) -> Path:
    """Resolve ``org/name[@revision]`` to a local folder: the cache's snapshot of that
    repository, with the files ``allow_patterns`` (fnmatch patterns; None: all) fetched.

    Raises HubAccessError (a ValueError) saying what to do when the repository is missing,
    gated, at an unknown revision, or not cached while offline.
    """
    hub = name if isinstance(name, HubName) else parse_hub_name(name)
    if hub is None:
        raise HubAccessError(f"{name!r} is not a repository name (org/name[@revision])")
    return HubRepo(hub, repo_type=repo_type, progress=progress).fetch(allow_patterns)
