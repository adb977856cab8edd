"""``LogWindow``: which of a job's log entries fit under the log's byte cap.

Redis trims a stream by entry count, not by size. The publisher, the log's only writer
while it holds the job, knows the size of every entry it wrote (and, from the claim, of
those before), so it tells the append script the oldest seq to keep.
"""

from __future__ import annotations

from collections import deque


class LogWindow:
    """The (seq, bytes) of a job's log entries, oldest first, and their total."""

    def __init__(self, max_bytes: int, entries: list[tuple[int, int]] | None = None) -> None:
        self.max_bytes = max_bytes
        self._entries: deque[tuple[int, int]] = deque(entries or ())
        self.total = sum(size for _, size in self._entries)

    def add(self, seq: int, size: int) -> int:
        """Count entry ``seq``; the oldest seq to keep (0 when nothing must go). The
        newest entry is always kept, whatever its size."""
        self._entries.append((seq, size))
        self.total += size
        trimmed = False
        while self.total > self.max_bytes and len(self._entries) > 1:
            _, dropped = self._entries.popleft()
            self.total -= dropped
            trimmed = True
        return self._entries[0][0] if trimmed else 0
