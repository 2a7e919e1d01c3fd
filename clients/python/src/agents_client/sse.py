"""Server-Sent Events framing (the WHATWG `text/event-stream` rules): lines in, complete frames out."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Frame:
    event: str
    id: str | None
    data: str


class Decoder:
    """Reads one connection's lines; a frame is complete at its blank line (a partial one at a drop is lost)."""

    def __init__(self) -> None:
        self._event = ""
        self._id: str | None = None
        self._data: list[str] = []

    def feed(self, line: str) -> Frame | None:
        """The frame `line` completes, if any."""
        if not line:
            if not self._data and not self._event:
                return None
            frame = Frame(self._event or "message", self._id, "\n".join(self._data))
            self._event, self._id, self._data = "", None, []
            return frame
        if line.startswith(":"):
            return None  # a comment: the keep-alive
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            self._event = value
        elif field == "data":
            self._data.append(value)
        elif field == "id" and "\0" not in value:
            self._id = value
        return None
