"""One tool call written as a JSON object: ``{"name": "f", "arguments": {...}}``.

Hermes, Llama 3 and Mistral (and the ``required`` array) all write a call this way; only
the arguments' key differs (Llama 3 says ``"parameters"``). The reader takes the object a
character at a time and gives back the name once it is known and the arguments' exact
JSON text in pieces as they arrive, so a client sees a call's arguments while the model
writes them. The call goes out once its name is known and its arguments have begun;
until then it may still turn out not to be one (its text is then the answer's); once
out, it is a call, and output that breaks it later only ends it.
"""

from __future__ import annotations

import enum
import json

from kvrelay_worker.engine.tools.json_value import JsonValue, Step

_WHITESPACE = frozenset(" \t\n\r")
ARGUMENT_KEYS = ("arguments", "parameters")


class Read(enum.Enum):
    MORE = "more"  # consumed; the object goes on
    DONE = "done"  # consumed; it closed the object
    ERROR = "error"  # not consumed: the object cannot go on


class _At(enum.Enum):
    OPEN = 0  # before "{"
    KEY_OR_CLOSE = 1
    KEY = 2  # inside a key (``_value`` reads the string)
    COLON = 3
    VALUE = 4  # inside a member's value
    COMMA_OR_CLOSE = 5
    NEXT_KEY = 6  # after ","


class CallObjectReader:
    """Reads one call object; ``take_name`` / ``take_arguments`` give what it found."""

    def __init__(self) -> None:
        self._at = _At.OPEN
        self._value: JsonValue | None = None
        self._raw: list[str] = []  # the current key's or value's text
        self._key: str | None = None
        self._name: str | None = None
        self._name_given = False
        # Arguments read before the name (``{"arguments": ..., "name": ...}``) wait for it.
        self._args: list[str] = []
        self._saw_arguments = False
        self._closed = False
        self.consumed: list[str] = []  # every character taken, for the fallback to text

    @property
    def opened(self) -> bool:
        """Whether the call's name went out: from then on it is a call."""
        return self._name_given

    def push(self, ch: str) -> Read:
        result = self._push(ch)
        if result is not Read.ERROR:
            self.consumed.append(ch)
        return result

    @property
    def ready_name(self) -> str | None:
        """The name ``take_name`` would give now: once it is known and the arguments have
        begun (or the object closed without them), so a name cut off alone stays text."""
        if self._name is None or self._name_given:
            return None
        if not (self._args or self._saw_arguments or self._closed):
            return None
        return self._name

    def take_name(self) -> str | None:
        """The call's name, once (see ``ready_name``)."""
        name = self.ready_name
        if name is not None:
            self._name_given = True
        return name

    def take_arguments(self) -> str:
        """Arguments text read since the last call (none before the name is out)."""
        if not self._name_given or not self._args:
            return ""
        text = "".join(self._args)
        self._args.clear()
        return text

    def close_arguments(self) -> str:
        """``{}`` for a finished call that had no arguments member, else nothing."""
        return "" if self._saw_arguments else "{}"

    def _push(self, ch: str) -> Read:
        at = self._at
        if at is _At.VALUE or at is _At.KEY:
            return self._push_member(ch)
        if ch in _WHITESPACE:
            return Read.MORE
        if at is _At.OPEN:
            if ch != "{":
                return Read.ERROR
            self._at = _At.KEY_OR_CLOSE
            return Read.MORE
        if at is _At.KEY_OR_CLOSE or at is _At.NEXT_KEY:
            if ch == "}" and at is _At.KEY_OR_CLOSE:
                return self._close()
            if ch != '"':
                return Read.ERROR
            self._start_member(_At.KEY)
            return self._push_member(ch)
        if at is _At.COLON:
            if ch != ":":
                return Read.ERROR
            self._start_member(_At.VALUE)
            return Read.MORE
        # COMMA_OR_CLOSE
        if ch == ",":
            self._at = _At.NEXT_KEY
            return Read.MORE
        if ch == "}":
            return self._close()
        return Read.ERROR

    def _start_member(self, at: _At) -> None:
        self._at = at
        self._value = JsonValue()
        self._raw = []

    def _push_member(self, ch: str) -> Read:
        assert self._value is not None
        step = self._value.push(ch)
        if step is Step.ERROR:
            return Read.ERROR
        if step is Step.ENDED_BEFORE:  # a number ended: ``ch`` follows the member
            self._member_done()
            return self._push(ch)
        if self._value.started:
            self._raw.append(ch)
            if self._at is _At.VALUE and self._key in ARGUMENT_KEYS and not self._saw_arguments:
                self._args.append(ch)
        if step is Step.DONE:
            self._member_done()
        return Read.MORE

    def _member_done(self) -> None:
        text = "".join(self._raw)
        if self._at is _At.KEY:
            self._key = json.loads(text)
            self._at = _At.COLON
            return
        if self._key in ARGUMENT_KEYS:
            self._saw_arguments = True
        elif self._key == "name" and self._name is None:
            value = json.loads(text)
            if isinstance(value, str) and value:
                self._name = value
        self._at = _At.COMMA_OR_CLOSE

    def _close(self) -> Read:
        if self._name is None:
            return Read.ERROR  # an object without a name is no call
        self._closed = True
        return Read.DONE
