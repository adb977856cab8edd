"""Printing a job's answer as it streams, and the one-line summary after it."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import click

from kvrelay import Client, Completion


def stream_to_stdout(
    client: Client, messages: Sequence[Mapping[str, str]], options: Mapping[str, Any]
) -> Completion:
    """Send one chat job and print its text as it arrives; the finished ``Completion``.

    Leaving early (Ctrl-C) closes the stream, which aborts the job on the worker.
    """
    with client.stream(messages=list(messages), **options) as stream:
        for chunk in stream:
            if chunk.index == 0 and chunk.text:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
        completion = stream.final()
    sys.stdout.write("\n")
    sys.stdout.flush()
    return completion


def summary(completion: Completion) -> str:
    """``12 tokens in 0.84s (14.3 tokens/s), first token after 0.21s, finish: stop``."""
    tokens = completion.usage.completion_tokens
    timings = completion.timings
    decode_rate = (tokens - 1) / timings.decode if timings.decode > 0 and tokens > 1 else 0.0
    parts = [f"{tokens} tokens in {timings.total:.2f}s"]
    if decode_rate:
        parts[0] += f" ({decode_rate:.1f} tokens/s)"
    parts.append(f"first token after {timings.ttft:.2f}s")
    parts.append(f"finish: {completion.finish_reason}")
    if completion.worker:
        parts.append(f"worker {completion.worker}")
    return ", ".join(parts)


def print_summary(completion: Completion) -> None:
    click.secho(f"[{summary(completion)}]", err=True, dim=True)


def sampling_kwargs(
    *,
    model: str,
    max_tokens: int,
    temperature: float,
    top_p: float,
    seed: int | None,
    stream_timeout: float,
) -> dict[str, Any]:
    """The ``client.stream`` keywords the CLI's sampling flags stand for."""
    options: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "stream_timeout": stream_timeout,
    }
    if seed is not None:
        options["seed"] = seed
    return options


def with_system(system: str | None, messages: list[dict[str, str]]) -> list[dict[str, str]]:
    return ([{"role": "system", "content": system}] if system else []) + messages
