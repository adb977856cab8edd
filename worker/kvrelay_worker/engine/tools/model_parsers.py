"""Which call syntax and reasoning syntax a worker's model writes, decided once at start.

``KVRELAY_TOOL_PARSER`` and ``KVRELAY_REASONING_PARSER`` say it: ``auto`` reads the
model's chat template (``detect``), ``none`` turns that parsing off, and a format's name
forces it (a fine-tune whose template does not show its format). Torch-free: the
settings check their values with ``check_parser_setting`` before the model loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvrelay_worker.engine.tools.detect import detect_reasoning_format, detect_tool_format
from kvrelay_worker.engine.tools.plan import REASONING_FORMATS, TOOL_FORMATS

AUTO = "auto"
NONE = "none"


def check_parser_setting(value: str, formats: tuple[str, ...], variable: str) -> None:
    """``ValueError`` naming ``variable`` unless ``value`` is auto, none or a format."""
    if value not in (AUTO, NONE, *formats):
        raise ValueError(f"{variable} must be one of {', '.join((AUTO, NONE, *formats))}, "
                         f"got {value!r}")


def _resolve(setting: str, detected: str | None) -> str | None:
    if setting == AUTO:
        return detected
    return None if setting == NONE else setting


@dataclass(frozen=True)
class ModelParsers:
    """The call syntax (one of ``TOOL_FORMATS``) and reasoning syntax (one of
    ``REASONING_FORMATS``) the model writes; None: it has none."""

    tool_format: str | None = None
    reasoning_format: str | None = None

    @classmethod
    def resolve(cls, chat_template: str | None, tool_setting: str = AUTO,
                reasoning_setting: str = AUTO) -> ModelParsers:
        """The settings applied to the model's template."""
        check_parser_setting(tool_setting, TOOL_FORMATS, "KVRELAY_TOOL_PARSER")
        check_parser_setting(reasoning_setting, REASONING_FORMATS, "KVRELAY_REASONING_PARSER")
        return cls(_resolve(tool_setting, detect_tool_format(chat_template)),
                   _resolve(reasoning_setting, detect_reasoning_format(chat_template)))
