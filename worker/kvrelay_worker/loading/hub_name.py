"""Reading ``org/name[@revision][:QUANT]`` as a Hugging Face Hub repository, and the name a
model is served under, without touching the network.

Torch- and hub-free on purpose: the worker's settings derive the served name (the queue)
from here before anything is loaded, and the CLI checks a name without downloading it.
Only strings that cannot be anything else are read as repository names: a registry name
or an existing local path is tried first by the callers (``model_source.resolve_model``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

# One part of a repository id as the hub accepts it: letters, digits, ``-``, ``_`` and
# ``.``, neither first nor last a separator, at most 96 characters.
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_HUB_NAME = re.compile(
    rf"(?P<repo>{_PART}/{_PART})"
    r"(?:@(?P<revision>[A-Za-z0-9._/-]+))?"  # a branch, a tag (refs/pr/1 too) or a commit
    r"(?::(?P<quant>[A-Za-z0-9._-]+))?"  # a GGUF quantization tag, as llama.cpp and Ollama
)
# What users paste from the hub's web page or from Ollama's ``hf.co/org/name:Q4_K_M``.
_URL_PREFIXES = ("https://huggingface.co/", "http://huggingface.co/", "huggingface.co/",
                 "https://hf.co/", "hf.co/")
_MODEL_CACHE_PREFIX = "models--"


@dataclass(frozen=True)
class HubName:
    """A repository on a Hugging Face Hub, at a revision, with an optional GGUF pick."""

    repo_id: str  # "org/name"
    revision: str | None = None  # None: the repository's default branch
    quant: str | None = None  # "Q4_K_M": the .gguf file whose name carries that tag

    @property
    def served_name(self) -> str:
        """``org/name`` (with ``:QUANT`` for a GGUF pick: other weights, another queue).

        The revision is left out: workers of one model at two revisions would share a
        queue, so pin the same revision everywhere (or set ``--model-name``)."""
        return self.repo_id + (f":{self.quant}" if self.quant else "")

    def __str__(self) -> str:
        revision = f"@{self.revision}" if self.revision else ""
        return f"{self.repo_id}{revision}" + (f":{self.quant}" if self.quant else "")


def parse_hub_name(text: str) -> HubName | None:
    """``org/name[@revision][:QUANT]`` as a HubName; None when ``text`` is not one.

    Paths (``/abs``, ``./rel``, ``~/x``, Windows drives) are never repository names.
    """
    for prefix in _URL_PREFIXES:
        if text.startswith(prefix):
            text = text[len(prefix):]
            break
    match = _HUB_NAME.fullmatch(text)
    if match is None:
        return None
    repo = match["repo"]
    revision = match["revision"]
    if "--" in repo or ".." in repo or (revision is not None and ".." in revision):
        return None  # the hub refuses these; read as a (missing) path instead
    return HubName(repo, revision, match["quant"])


def is_hub_name(text: str) -> bool:
    return parse_hub_name(text) is not None


def hub_cache_repo_id(folder: Path) -> str | None:
    """``org/name`` for a snapshot folder of the Hugging Face cache
    (``.../models--org--name/snapshots/<commit>``); None for any other folder."""
    snapshots = folder.parent
    repo_folder = snapshots.parent.name
    if snapshots.name != "snapshots" or not repo_folder.startswith(_MODEL_CACHE_PREFIX):
        return None
    parts = repo_folder[len(_MODEL_CACHE_PREFIX):].split("--")
    return "/".join(parts) if len(parts) == 2 and all(parts) else None


def local_served_name(path: Path) -> str:
    """The served name of an existing folder or file.

    A folder is served under its own name, or as ``org/name`` when it is a snapshot of the
    Hugging Face cache (its own name is a commit hash). A file is served under the name it
    was given by (``.gguf`` dropped), not the name of what a link points to: in the
    Hugging Face cache that is a content hash.
    """
    if path.is_dir():
        resolved = path.expanduser().resolve()
        return hub_cache_repo_id(resolved) or resolved.name
    name = Path(os.path.abspath(path.expanduser())).name
    return name[: -len(".gguf")] if name.endswith(".gguf") else name


def default_served_name(model: str) -> str:
    """The name a worker serves ``model`` under when ``KVRELAY_MODEL_NAME`` is not set:
    a path's name, a repository's ``org/name``, else the model string itself."""
    path = Path(model).expanduser()
    if path.exists():
        return local_served_name(path)
    hub = parse_hub_name(model)
    return hub.served_name if hub is not None else model
