"""``--gpus 0,1,2,3``: the GPU indices that get one worker each (``kvrelay up``,
``kvrelay compose``), parsed once so both commands refuse the same mistakes."""

from __future__ import annotations

import click


class GpuIds(click.ParamType):
    """A comma-separated list of distinct GPU indices, as a tuple of ints."""

    name = "IDS"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        parts = [part.strip() for part in str(value).split(",")]
        if not all(part.isdigit() for part in parts):
            self.fail(f"expected GPU indices such as 0,1,2,3, got {value!r}", param, ctx)
        ids = tuple(int(part) for part in parts)
        if len(set(ids)) != len(ids):
            self.fail(f"a GPU is listed twice in {value!r}", param, ctx)
        return ids
