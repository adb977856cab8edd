"""``kvrelay chat``: an interactive conversation that keeps its history.

Each turn sends the whole conversation (the worker applies the model's chat template,
and its prefix cache makes the repeated history cheap). Ctrl-C during an answer stops
that answer (the job is aborted) and keeps the conversation; at the prompt it leaves.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import click

from kvrelay import BrokerUnavailable, Client, Completion, KvrelayError, UnknownModel
from kvrelay.cli.errors import CliError
from kvrelay.cli.options import client_options, sampling_options
from kvrelay.cli.streaming import sampling_kwargs, stream_to_stdout, summary, with_system
from kvrelay.cli.target import (
    CONNECT_HINT,
    model_for,
    namespace,
    redis_url_for,
    unknown_model,
)

HELP_TEXT = "Commands: /reset forgets the conversation, /exit leaves (so does Ctrl-D)."


@dataclass
class ChatSession:
    """The conversation so far; a turn is kept only once its answer is complete."""

    system: str | None = None
    history: list[dict[str, str]] = field(default_factory=list)

    def messages_for(self, text: str) -> list[dict[str, str]]:
        return with_system(self.system, [*self.history, {"role": "user", "content": text}])

    def record(self, text: str, answer: str) -> None:
        self.history += [
            {"role": "user", "content": text},
            {"role": "assistant", "content": answer},
        ]

    def reset(self) -> None:
        self.history.clear()


def ask(client: Client, session: ChatSession, text: str, options: Mapping[str, Any]) -> Completion:
    completion = stream_to_stdout(client, session.messages_for(text), options)
    session.record(text, completion.text)
    return completion


def _read_line(interactive: bool) -> str | None:
    if interactive:
        click.secho("> ", nl=False, err=True, bold=True)
    line = sys.stdin.readline()
    return None if line == "" else line.rstrip("\n")


@click.command("chat")
@client_options
@sampling_options(temperature=0.7)
@click.option("-q", "--quiet", is_flag=True, help="No summary line after each answer.")
def chat(
    model: str | None,
    redis_url: str | None,
    stream_timeout: float,
    max_tokens: int,
    temperature: float,
    top_p: float,
    seed: int | None,
    system: str | None,
    quiet: bool,
) -> None:
    """Talk with a model; the conversation is kept until /reset or the end."""
    url, record = redis_url_for(redis_url)
    interactive = sys.stdin.isatty()
    session = ChatSession(system=system)
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
            if interactive:
                click.echo(f"Chatting with {name}. {HELP_TEXT}", err=True)
            _loop(client, session, options, interactive, quiet)
    except BrokerUnavailable as exc:
        raise CliError(f"{exc}; {CONNECT_HINT}") from None


def _loop(
    client: Client,
    session: ChatSession,
    options: Mapping[str, Any],
    interactive: bool,
    quiet: bool,
) -> None:
    while True:
        try:
            text = _read_line(interactive)
        except KeyboardInterrupt:
            click.echo(err=True)
            return
        if text is None or text.strip() in ("/exit", "/quit"):
            return
        if not text.strip():
            continue
        if text.strip() == "/reset":
            session.reset()
            click.echo("(conversation forgotten)", err=True)
            continue
        if text.strip() == "/help":
            click.echo(HELP_TEXT, err=True)
            continue
        try:
            completion = ask(client, session, text, options)
        except KeyboardInterrupt:
            click.echo("\n(answer stopped)", err=True)
            continue
        except UnknownModel:
            raise unknown_model(client, str(options["model"])) from None
        except BrokerUnavailable:
            raise
        except KvrelayError as exc:  # this answer failed; the conversation goes on
            CliError(str(exc)).show()
            continue
        if not quiet:
            click.secho(f"[{summary(completion)}]", err=True, dim=True)
