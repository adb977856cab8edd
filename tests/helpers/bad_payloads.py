"""Payloads that fail while being decoded, not while being validated."""

from __future__ import annotations

LONE_SURROGATE = "\udcff"


def nested_stop_json(job_id: str, model: str, depth: int) -> str:
    """A request as JSON text whose stop list is nested ``depth`` arrays deep (from a few
    thousand levels on, decoding it exhausts the recursion limit)."""
    return (f'{{"job_id": "{job_id}", "model": "{model}", "prompt_token_ids": [1, 2, 3], '
            f'"sampling": {{"max_tokens": 4, "stop": {"[" * depth}{"]" * depth}}}}}')
