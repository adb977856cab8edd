"""``kvrelay generate``: one prompt, the answer streamed to stdout (or one JSON object)."""

from __future__ import annotations

import sys
from typing import Any

import click

from kvrelay import BrokerUnavailable, KvrelayError, UnknownModel
from kvrelay.cli.errors import CliError
from kvrelay.cli.options import client_options, sampling_options
from kvrelay.cli.streaming import answer, job_options, print_summary, with_system
from kvrelay.cli.target import connected, unknown_model


@click.command("generate")
@click.argument("prompt")
@client_options
@sampling_options(temperature=0.7)
@click.option("-q", "--quiet", is_flag=True, help="No summary line on stderr.")
def generate(prompt: str, **params: Any) -> None:
    """Ask PROMPT (as a chat message; '-' reads it from stdin) and stream the answer."""
    if prompt == "-":
        prompt = sys.stdin.read()
    if not prompt.strip():
        raise CliError("the prompt is empty")
    with connected(params["redis_url"], params["model"]) as (client, name):
        options = job_options(name, params, params["stream_timeout"])
        messages = with_system(params["system"], [{"role": "user", "content": prompt}])
        try:
            completion = answer(client, messages, options, params["as_json"])
        except UnknownModel:
            raise unknown_model(client, name) from None
        except KvrelayError as exc:
            if isinstance(exc, BrokerUnavailable):
                raise  # `connected` adds how to reach a stack
            raise CliError(str(exc)) from None
    if not (params["quiet"] or params["as_json"]):
        print_summary(completion)
