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
from kvrelay.cli.streaming import answer, job_options, summary, with_system
from kvrelay.cli.target import connected, unknown_model

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


def ask(
    client: Client, session: ChatSession, text: str, options: Mapping[str, Any], as_json: bool
) -> Completion:
    completion = answer(client, session.messages_for(text), options, as_json)
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
def chat(**params: Any) -> None:
    """Talk with a model; the conversation is kept until /reset or the end."""
    interactive = sys.stdin.isatty()
    session = ChatSession(system=params["system"])
    with connected(params["redis_url"], params["model"]) as (client, name):
        options = job_options(name, params, params["stream_timeout"])
        if interactive:
            click.echo(f"Chatting with {name}. {HELP_TEXT}", err=True)
        _loop(client, session, options, interactive, params)


def _loop(
    client: Client,
    session: ChatSession,
    options: Mapping[str, Any],
    interactive: bool,
    params: Mapping[str, Any],
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
            completion = ask(client, session, text, options, params["as_json"])
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
        if not (params["quiet"] or params["as_json"]):
            click.secho(f"[{summary(completion)}]", err=True, dim=True)
