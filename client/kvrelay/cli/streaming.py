"""Printing a job's answer as it streams, and the one-line summary after it."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import click
import msgspec

from kvrelay import Client, Completion
from kvrelay.cli.options import SAMPLING_FLAGS, picked
from kvrelay.cli.response_format import response_format_from


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


def job_options(model: str, params: Mapping[str, Any], stream_timeout: float) -> dict[str, Any]:
    """The ``client.stream`` keywords a command's sampling (and ``--timeout``) flags stand
    for; flags left unset (None) are not sent, so the SDK's defaults apply."""
    given = picked(params, SAMPLING_FLAGS) | {"timeout": params.get("timeout"),
                                              "lora": params.get("lora"),
                                              "response_format": response_format_from(params)}
    options = {name: value for name, value in given.items() if value is not None}
    return {"model": model, "stream_timeout": stream_timeout, **options}


def answer(
    client: Client, messages: Sequence[Mapping[str, str]], options: Mapping[str, Any], as_json: bool
) -> Completion:
    """Stream the answer to stdout, or print it as one JSON object once complete."""
    if not as_json:
        return stream_to_stdout(client, messages, options)
    completion = client.generate(messages=list(messages), **options)
    click.echo(msgspec.json.encode(completion).decode())
    return completion


def with_system(system: str | None, messages: list[dict[str, str]]) -> list[dict[str, str]]:
    return ([{"role": "system", "content": system}] if system else []) + messages
