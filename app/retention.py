"""Retention: everything the database holds that is not the conversation expires (issue 36). The workers' janitor
runs each rule every `CLEANUP_INTERVAL` seconds (`app/worker.py`); deletes are idempotent, so any worker may.

What goes, and after which setting:

- `events`, `lifecycle_events`: older than `EVENT_RETENTION_DAYS` (`events.expire`; a stream resuming from before
  that gets `events_missed`).
- `logs` (LLM requests, tool calls, hook errors: `GET /threads/{id}/logs`, `state.get_logs`): older than
  `LOG_RETENTION_DAYS`.
- `metrics`: a series (a family's label set, a histogram's buckets with it) no worker added to for
  `METRIC_RETENTION_DAYS` — labels nothing produces any more (a renamed agent, a retired model). Totals restart from
  zero if the series comes back, which Prometheus reads as a counter reset.
- `inbox`: delivered input is deleted by its delivery (`queue.take_inbox`; an effect's row by the transaction that
  records its end), so what remains is input waiting and input set aside because its delivery kept failing; the
  latter goes `SET_ASIDE_RETENTION_DAYS` after it was set aside. Nothing deduplicates on inbox rows.
- `effects`: finished ones (`done`, `failed`, `cancelled`) `EFFECT_RETENTION_DAYS` after they finished; `GET` of one
  then answers 404 as for any unknown effect.

Threads, messages, files and their content stay until the thread is deleted (blobs nothing points at any more are
collected by `blobs.collect`). Each table's statement is in its module; each deletes at most `batch` rows, picked by
a subselect (`ctid`, or the key), and each batch commits on its own, so a large backlog (the first sweep after an
upgrade) never holds long locks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import effects, events, logs, metrics, statements
from app.settings import Settings

BATCH = 5_000  # rows per delete statement
DAY = 86_400.0

Expire = Callable[[AsyncSession, float, int], Awaitable[int]]


@dataclasses.dataclass(frozen=True)
class Rule:
    """One kind of row that expires: `what` labels `agents_janitor_deleted`, `age` in seconds."""

    what: str
    age: float
    expire: Expire

    def now(self) -> Rule:
        """The same rule with no age left: everything it covers goes (the storage benchmark's last sweep)."""
        return dataclasses.replace(self, age=0.0)


# SET_ASIDE: input whose delivery failed, kept so its sender can see why (`GET …/messages`, a waiting post) until
# the setting passes; the inbox holds nothing else that is old (delivered rows are deleted by their delivery). Here,
# not in `queue.py`, as the only inbox statement that is no part of delivery.
_SET_ASIDE = """
    WITH gone AS (
        DELETE FROM inbox WHERE id IN (
            SELECT id FROM inbox WHERE set_aside_at < now() - make_interval(secs => $1) LIMIT $2
        )
        RETURNING 1
    )
    SELECT count(*) FROM gone
"""


async def expire_set_aside(session: AsyncSession, age: float, batch: int) -> int:
    """Delete one batch of inbox rows set aside more than `age` seconds ago; how many went."""
    return int(await (await statements.driver(session)).fetchval(_SET_ASIDE, age, batch))


def rules(settings: Settings) -> list[Rule]:
    """Every retention rule, with the ages the settings give."""
    return [
        Rule("events", settings.event_retention_days * DAY, events.expire),
        Rule("logs", settings.log_retention_days * DAY, logs.expire),
        Rule("metrics", settings.metric_retention_days * DAY, metrics.expire),
        Rule("inbox", settings.set_aside_retention_days * DAY, expire_set_aside),
        Rule("effects", settings.effect_retention_days * DAY, effects.expire),
    ]


async def sweep(sessions: async_sessionmaker[AsyncSession], rule: Rule, batch: int = BATCH) -> int:
    """Apply one rule until a batch comes back short, each batch in its own transaction; how many rows went."""
    total = 0
    while True:
        async with sessions() as session, session.begin():
            gone = await rule.expire(session, rule.age, batch)
        total += gone
        if gone < batch:
            return total
