"""Prometheus metrics (`GET /metrics`): the work the workers did, and the state the database holds.

Work is counted in memory where it happens, by the process doing it (a `Meter`: no statement on the engine's path).
Each worker adds what it counted since its last flush to the `metrics` table every `METRICS_FLUSH_SECONDS`, in one
statement, so the table holds the totals of every process on every host, and a restart loses nothing flushed (a
crash loses at most one interval's counts). `GET /metrics`, in any API process, reads those totals, adds what its
own process counted and has not flushed yet (`agents serve`), the database's state from one query (computed at
scrape time, so it is right whichever process scrapes) and its own open streams.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Container, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import queue, statements, tables

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # the Prometheus text format
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)  # LLM requests take seconds
UNKNOWN_TOOL = "_unknown"  # the label of a call to a tool the model was not offered (names it made up)

Key = tuple[str, str]  # a sample: its name and its labels as canonical JSON


def _labels(labels: dict[str, str]) -> str:
    return json.dumps(labels, sort_keys=True, separators=(",", ":"))


class Meter:
    """One process's series: counters and histograms of the work done here (`work`, flushed to the database by the
    process's worker) and the open streams of its API (`local`: this process alone, never flushed)."""

    def __init__(self) -> None:
        self.work = CollectorRegistry(auto_describe=False)
        self.local = CollectorRegistry(auto_describe=False)
        work = self.work
        self.steps = Counter(
            "agents_steps", "Steps completed (an LLM call and its tool calls).", ["agent"], registry=work
        )
        self.llm_requests = Counter(
            "agents_llm_requests", "LLM requests, every attempt at every model.", ["model", "status"], registry=work
        )
        self.llm_seconds = Histogram(
            "agents_llm_request_duration_seconds",
            "LLM request latency, from the request to the last chunk.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=work,
        )
        self.llm_tokens = Counter(
            "agents_llm_tokens", "Tokens of answered LLM requests, by type.", ["model", "type"], registry=work
        )
        self.llm_cost = Counter(
            "agents_llm_cost_usd", "Cost of answered LLM requests at the model's prices.", ["model"], registry=work
        )
        self.tool_calls = Counter(
            "agents_tool_calls", "Tool calls finished, by status.", ["tool", "status"], registry=work
        )
        self.lease_losses = Counter(
            "agents_lease_losses", "Executions stopped because their lease was lost.", registry=work
        )
        self.transactions_rerun = Counter(
            "agents_transactions_rerun",
            "Engine transactions run again fenced: sent as one statement, or locked in their first read, they found "
            "the thread row changed, locked or its lease gone (`stale`), or needed more (`unsent`).",
            ["how", "why"],
            registry=work,
        )
        self.janitor_repairs = Counter(
            "agents_janitor_repairs", "Threads the janitor found stranded and repaired.", ["repair"], registry=work
        )
        self.janitor_deleted = Counter(
            "agents_janitor_deleted", "Rows the janitor's retention sweeps deleted.", ["what"], registry=work
        )
        self.streams = Gauge(
            "agents_stream_connections", "Open SSE streams of this API process.", ["stream"], registry=self.local
        )
        self.lock = asyncio.Lock()  # a flush and a scrape of one process never interleave (no count seen twice)
        self._flushed: dict[Key, float] = {}  # each sample's value as last added to the database
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}

    def llm_request(self, row: tables.Log) -> None:
        """Count one LLM request from its `logs` row (the one source of what it cost)."""
        model, latency, cost = row.model or "", row.latency_ms, row.cost
        self._child(self.llm_requests, model, row.status).inc()
        if latency is not None:
            self._child(self.llm_seconds, model).observe(latency / 1000)
        tokens = (
            ("input", row.input_tokens),
            ("output", row.output_tokens),
            ("cached", row.cached_tokens),
            ("reasoning", row.reasoning_tokens),
        )
        for kind, count in tokens:
            if count:
                self._child(self.llm_tokens, model, kind).inc(count)
        if cost:
            self._child(self.llm_cost, model).inc(cost)

    def step(self, agent: str) -> None:
        self._child(self.steps, agent).inc()

    def tool_call(self, tool: str, status: str, offered: Container[str]) -> None:
        """Count a finished tool call; a tool the model was not offered counts as `_unknown` (a name it made up
        must not become a series)."""
        self._child(self.tool_calls, tool if tool in offered else UNKNOWN_TOOL, status).inc()

    def _child(self, metric: Counter | Histogram, *labels: str) -> Any:
        """`metric.labels(*labels)`, kept: the engine counts every step, and `labels` costs a lock and checks."""
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def unflushed(self) -> dict[Key, tuple[str, float, float]]:
        """Every work sample of this process: (family, value, value not yet in the database), zeros included."""
        found: dict[Key, tuple[str, float, float]] = {}
        for family in self.work.collect():
            for sample in family.samples:
                if sample.name.endswith("_created"):  # a process's start time: not a sum over processes
                    continue
                key = (sample.name, _labels(sample.labels))
                found[key] = (family.name, sample.value, sample.value - self._flushed.get(key, 0.0))
        return found

    async def flush(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        """Add what this process counted since the last flush to the database's totals (kept for the next flush
        if the database cannot take it now)."""
        async with self.lock:
            pending = {key: entry for key, entry in self.unflushed().items() if entry[2]}
            if not pending:
                return
            keys = sorted(pending)  # every worker locks the rows in one order: no deadlock between flushes
            async with sessions() as session, session.begin():
                await (await statements.driver(session)).execute(
                    _ADD,
                    [pending[k][0] for k in keys],
                    [k[0] for k in keys],
                    [k[1] for k in keys],
                    [pending[k][2] for k in keys],
                )
            for key in keys:
                self._flushed[key] = pending[key][1]


# ADD: a flush: each process adds its deltas, so the rows are the totals of every process that ever ran; `updated_at`
# says when a series last moved (`retention`: one that stopped moving expires).
_ADD = """
    INSERT INTO metrics (family, sample, labels, value)
    SELECT * FROM unnest(CAST($1 AS text[]), CAST($2 AS text[]), CAST($3 AS text[]), CAST($4 AS float8[]))
    ON CONFLICT (sample, labels) DO UPDATE SET value = metrics.value + excluded.value, updated_at = now()
"""

_TOTALS = "SELECT family, sample, labels, value FROM metrics"

# EXPIRE: retention (`METRIC_RETENTION_DAYS`, `app/retention.py`): a series goes whole, every sample of a label set (a
# histogram's buckets differ by `le` alone), when none of them was added to within `$1` seconds; at most `$2` series
# at once. The age is checked again on each row deleted, so a flush that lands meanwhile keeps its row.
_EXPIRE = """
    WITH gone AS (
        DELETE FROM metrics m USING (
            SELECT family, CAST(labels AS jsonb) - 'le' AS series FROM metrics
            GROUP BY 1, 2 HAVING max(updated_at) < now() - make_interval(secs => $1) LIMIT $2
        ) stale
        WHERE m.family = stale.family AND CAST(m.labels AS jsonb) - 'le' = stale.series
          AND m.updated_at < now() - make_interval(secs => $1)
        RETURNING 1
    )
    SELECT count(*) FROM gone
"""


async def expire(session: AsyncSession, age_seconds: float, batch: int) -> int:
    """Delete up to `batch` series no worker added to within `age_seconds`; returns how many rows went."""
    return int(await (await statements.driver(session)).fetchval(_EXPIRE, float(age_seconds), batch))


_GAUGES = (
    ("runnable", "agents_threads_runnable", "Threads with work waiting for a worker (runnable, no live lease)."),
    ("oldest", "agents_queue_oldest_seconds", "How long the longest-waiting runnable thread has waited."),
    ("in_flight", "agents_executions_in_flight", "Thread executions running: live leases, across all workers."),
    ("inbox", "agents_inbox_depth", "Inputs waiting in thread inboxes, not yet delivered."),
    ("set_aside", "agents_inbox_set_aside", "Inputs set aside because their delivery kept failing."),
)

_SUFFIXES = {"_bucket": 0, "_count": 1, "_sum": 2}


def _order(key: Key) -> tuple[str, int, float]:
    """Samples of one label set together, a histogram's buckets by `le`, then its count and sum."""
    labels = json.loads(key[1])
    le = labels.pop("le", None)
    rank = next((r for suffix, r in _SUFFIXES.items() if key[0].endswith(suffix)), 0)
    return _labels(labels), rank, float(le) if le is not None else 0.0


class _Snapshot(Collector):
    """A collector of families already read (`generate_latest` asks a collector for them)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self._families


async def exposition(session: AsyncSession, meter: Meter) -> bytes:
    """Every series in the Prometheus text format: the database's totals of work plus this process's unflushed
    counts, the queue's state, this process's streams."""
    driver = await statements.driver(session, flush=False)
    async with meter.lock:
        rows = await driver.fetch(_TOTALS)
        unflushed = meter.unflushed()
    state = await queue.state(driver)
    totals: dict[Key, float] = {key: entry[2] for key, entry in unflushed.items()}
    family_of: dict[Key, str] = {key: entry[0] for key, entry in unflushed.items()}
    for row in rows:
        key = (row["sample"], row["labels"])
        totals[key] = totals.get(key, 0.0) + row["value"]
        family_of[key] = row["family"]
    families: list[Metric] = []
    for family in meter.work.collect():
        metric = Metric(family.name, family.documentation, family.type)
        for key in sorted((k for k in totals if family_of[k] == family.name), key=_order):
            labels: dict[str, Any] = json.loads(key[1])
            metric.add_sample(key[0], labels, totals[key])
        families.append(metric)
    families.extend(GaugeMetricFamily(name, text, value=state[column]) for column, name, text in _GAUGES)
    families.extend(meter.local.collect())
    return generate_latest(_Snapshot(families))
