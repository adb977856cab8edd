"""``kvrelay generate``: one prompt, the answer streamed to stdout (or one JSON object)."""

from __future__ import annotations

import sys

import click
import msgspec

from kvrelay import BrokerUnavailable, Client, KvrelayError, UnknownModel
from kvrelay.cli.errors import CliError
from kvrelay.cli.finite_float import FiniteFloatRange
from kvrelay.cli.options import client_options, sampling_options
from kvrelay.cli.streaming import print_summary, sampling_kwargs, stream_to_stdout, with_system
from kvrelay.cli.target import (
    CONNECT_HINT,
    model_for,
    namespace,
    redis_url_for,
    unknown_model,
)


@click.command("generate")
@click.argument("prompt")
@client_options
@sampling_options(temperature=0.7)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object (text, finish reason, usage, timings) at the end.",
)
@click.option(
    "--timeout",
    type=FiniteFloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Fail if the job has not finished after this long.",
)
@click.option("-q", "--quiet", is_flag=True, help="No summary line on stderr.")
def generate(
    prompt: str,
    model: str | None,
    redis_url: str | None,
    stream_timeout: float,
    max_tokens: int,
    temperature: float,
    top_p: float,
    seed: int | None,
    system: str | None,
    as_json: bool,
    timeout: float | None,
    quiet: bool,
) -> None:
    """Ask PROMPT (as a chat message; '-' reads it from stdin) and stream the answer."""
    if prompt == "-":
        prompt = sys.stdin.read()
    if not prompt.strip():
        raise CliError("the prompt is empty")
    url, record = redis_url_for(redis_url)
    try:
        with Client(url, namespace=namespace()) as client:
            name = model_for(model, record, client)
            options = sampling_kwargs(
                model=name,
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=top_p,
                seed=seed,
                stream_timeout=stream_timeout,
            )
            if timeout is not None:
                options["timeout"] = timeout
            messages = with_system(system, [{"role": "user", "content": prompt}])
            try:
                if as_json:
                    completion = client.generate(messages=messages, **options)
                    click.echo(msgspec.json.encode(completion).decode())
                    return
                completion = stream_to_stdout(client, messages, options)
            except UnknownModel:
                raise unknown_model(client, name) from None
    except BrokerUnavailable as exc:
        raise CliError(f"{exc}; {CONNECT_HINT}") from None
    except KvrelayError as exc:
        raise CliError(str(exc)) from None
    if not quiet:
        print_summary(completion)
