"""What a turn took, as this worker saw it, for the one INFO line said when it ends: its LLM requests' tokens and
cost, added as each request's log row is made (no query), and its duration. A turn that moved between processes (a
crash, a blocking subagent's result resumed elsewhere) counts what this process ran of it."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from app import tables

KEPT = 10_000  # tallies of turns still open (parked, or whose lease was lost): the oldest are dropped past this


@dataclass
class Tally:
    started: float = field(default_factory=time.monotonic)
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = None  # None while no request had a price (the model has no `input_price`/`output_price`)

    def add(self, row: tables.Log) -> None:
        self.requests += 1
        self.input_tokens += row.input_tokens or 0
        self.output_tokens += row.output_tokens or 0
        if row.cost is not None:
            self.cost = (self.cost or 0.0) + row.cost

    def line(self, thread: tables.Thread, outcome: str) -> str:
        """The turn's log line: names, counts and the outcome only (never a message's text, never a variable)."""
        cost = "unknown" if self.cost is None else f"{self.cost:.6f}"
        return (
            f"turn ended: thread={thread.id} agent={thread.agent} side={thread.side or 'a'} "
            f"steps={thread.turn_steps} requests={self.requests} tokens_in={self.input_tokens} "
            f"tokens_out={self.output_tokens} cost_usd={cost} duration_s={time.monotonic() - self.started:.3f} "
            f"outcome={outcome}"
        )


class Tallies:
    """The open turns' tallies, by thread."""

    def __init__(self) -> None:
        self._open: dict[uuid.UUID, Tally] = {}

    def start(self, thread_id: uuid.UUID) -> None:
        """A turn starts: count from now."""
        self._open.pop(thread_id, None)
        self.of(thread_id)

    def of(self, thread_id: uuid.UUID) -> Tally:
        """The thread's open tally; a new one when it has none here (the turn began in another process)."""
        found = self._open.get(thread_id)
        if found is None:
            found = self._open[thread_id] = Tally()
            if len(self._open) > KEPT:
                del self._open[next(iter(self._open))]
        return found

    def end(self, thread_id: uuid.UUID) -> Tally:
        """The ended turn's tally, no longer kept."""
        return self._open.pop(thread_id, None) or Tally()

    def reopen(self, thread_id: uuid.UUID, tally: Tally) -> None:
        """An ended turn's tally kept again: the transaction that ended the turn did not commit."""
        self._open[thread_id] = tally
