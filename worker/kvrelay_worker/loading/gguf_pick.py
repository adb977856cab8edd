"""Pick one ``.gguf`` file of a repository by its quantization tag (``org/name:Q4_K_M``).

The convention of llama.cpp (``-hf org/name:Q4_K_M``) and Ollama (``hf.co/org/name:Q4_K_M``):
a GGUF repository holds one file per quantization, each name carrying its tag
(``Llama-3.2-1B-Instruct-Q4_K_M.gguf``, ``qwen2.5-0.5b-instruct-q8_0.gguf``). A tag matches
a file when it stands in the file's path between separators (``-``, ``.``, ``/``), case
aside: ``Q4_K`` does not match ``...-Q4_K_M.gguf``, whose tag is longer.
"""

from __future__ import annotations

import re

from kvrelay_worker.models.errors import UnknownModelError

GGUF_SUFFIX = ".gguf"
# Tags as llama.cpp names its file types: Q4_K_M, IQ3_XS, Q8_0, TQ1_0, F16, BF16, F32,
# with Unsloth's "UD-" prefix for its dynamic quantizations.
_TAG = re.compile(r"(?:^|(?<=[-./]))((?:UD-)?(?:I?Q\d+(?:_[A-Z0-9]+)*|TQ\d_\d|BF16|F16|F32))"
                  r"(?=$|[-./])", re.IGNORECASE)


def gguf_files(files: list[str]) -> list[str]:
    """The repository's ``.gguf`` files, in its order."""
    return [name for name in files if name.lower().endswith(GGUF_SUFFIX)]


def gguf_tag(path: str) -> str | None:
    """The quantization tag a file name carries (upper-cased), or None."""
    stem = path[: -len(GGUF_SUFFIX)] if path.lower().endswith(GGUF_SUFFIX) else path
    found = _TAG.findall(stem.rsplit("/", 1)[-1]) or _TAG.findall(stem)
    return found[-1].upper() if found else None


def available_tags(files: list[str]) -> list[str]:
    """One entry per GGUF file: its tag, or its name when it carries none."""
    return sorted({gguf_tag(name) or name for name in gguf_files(files)})


def pick_gguf(files: list[str], tag: str, repo: str) -> str:
    """The one ``.gguf`` file of ``files`` carrying ``tag``; UnknownModelError listing the
    tags there are when none or several do."""
    pattern = re.compile(rf"(?:^|(?<=[-./])){re.escape(tag.lower())}(?=$|[-./])")
    ggufs = gguf_files(files)
    matches = [name for name in ggufs if pattern.search(name.lower()[: -len(GGUF_SUFFIX)])]
    if len(matches) == 1:
        return matches[0]
    if not ggufs:
        raise UnknownModelError(
            f"{repo} holds no .gguf file, so {repo}:{tag} names nothing; drop :{tag} to load "
            "its safetensors weights"
        )
    if not matches:
        raise UnknownModelError(
            f"{repo} has no .gguf file tagged {tag}; its tags: "
            + ", ".join(available_tags(files)) + f" (ask for {repo}:<tag>)"
        )
    raise UnknownModelError(
        f"{len(matches)} .gguf files of {repo} carry the tag {tag}: {', '.join(matches)}; "
        "split GGUF files (-00001-of-0000N) are not supported, and a more precise tag "
        "picks one of the others"
    )


def single_gguf(files: list[str], repo: str) -> str:
    """The repository's only ``.gguf`` file, for a name without a tag; UnknownModelError
    listing the tags when there are several."""
    ggufs = gguf_files(files)
    if len(ggufs) == 1:
        return ggufs[0]
    raise UnknownModelError(
        f"{repo} holds {len(ggufs)} .gguf files: pick one by its quantization, "
        + ", ".join(f"{repo}:{tag}" for tag in available_tags(files))
    )
