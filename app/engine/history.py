"""The thread's messages as one execution keeps them between its steps.

A step needs the whole history (to build the request and find unfinished work), but reading and mapping every row
again would make a step of a 1,000-message thread cost far more than one of a 10-message thread. So an execution
keeps the rows it read and, at each step, reads only those written since (`messages.changed`: revisions are stamped
by the database under the thread row lock, which the step holds too). A deletion (`messages.remove`, rare) bumps a
counter on the thread row and makes the next step read everything again.
"""

from __future__ import annotations

import bisect

from sqlalchemy.ext.asyncio import AsyncSession

from app import messages, tables


class History:
    """One execution's copy of a thread's messages, in position order."""

    def __init__(self) -> None:
        self._removed = -1  # `threads.messages_removed` when last read in full
        self._reset()

    def _reset(self) -> None:
        self._rows: list[tables.Message] = []
        self._positions: list[int] = []  # `position` of each row of `_rows`, for bisecting
        self._index: dict[object, int] = {}  # message id -> its index in `_rows`
        self._rev = 0  # the highest revision read

    async def rows(self, session: AsyncSession, thread: tables.Thread) -> list[tables.Message]:
        """The messages now, in order (the caller holds the thread row lock)."""
        if thread.messages_removed != self._removed:
            self._reset()
            self._removed = thread.messages_removed
        for row, rev in await messages.changed(session, thread.id, self._rev):
            self._rev = max(self._rev, rev)
            self._put(row)
        return list(self._rows)

    def since(self, position: int) -> list[tables.Message]:
        """The rows at or after `position` (a turn's rows), in order."""
        return self._rows[bisect.bisect_left(self._positions, position) :]

    def _put(self, row: tables.Message) -> None:
        at = self._index.get(row.id)
        if at is not None:  # an update: same position
            self._rows[at] = row
            return
        if not self._positions or row.position > self._positions[-1]:  # the usual case: a new last row
            self._index[row.id] = len(self._rows)
            self._rows.append(row)
            self._positions.append(row.position)
            return
        at = bisect.bisect_left(self._positions, row.position)
        self._rows.insert(at, row)
        self._positions.insert(at, row.position)
        self._index = {r.id: i for i, r in enumerate(self._rows)}
