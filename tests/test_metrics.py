"""`GET /metrics`: real turns counted, the totals of several processes summed, the queue's state, admin access."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text as sql

from app import claims, db, keys, metrics
from app.api.app import create_app
from app.catalog import Catalog
from app.settings import Settings
from app.spec import define_agent, define_model, define_prompt
from tests.conftest import ROOT, client_for, wait_for
from tests.processes import free_port, start, stop, until_ready
from tests.test_api import assert_error, read_events
from tests.test_engine import settle
from tests.tools import add

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


USAGE = {"input_tokens": 1000, "output_tokens": 200, "cached_tokens": 400}
COST = (600 * 2.0 + 400 * 0.5 + 200 * 10.0) / 1_000_000  # per request, at the model's prices


def catalog() -> Catalog:
    script: list[Any] = [
        {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}], "usage": USAGE},
        {"tool_calls": [{"name": "made_up", "arguments": {}}], "usage": USAGE},
        {"text": "It is 5.", "usage": USAGE},
    ]
    model = define_model(name="m", provider="test", script=script, input_price=2.0, cached_price=0.5, output_price=10.0)
    prompt = define_prompt(name="p", tool_description="t", model="m", prompt="Be terse.", tools=["add"])
    agent = define_agent(name="agent", side_a={"prompt": "p"})
    return Catalog(
        root=Path("."), models={"m": model}, prompts={"p": prompt}, agents={"agent": agent}, tools={"add": add}
    )


def parse(body: str) -> Series:
    """Every sample of an exposition, by name and labels."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def value(series: Series, name: str, **labels: str) -> float | None:
    return series.get((name, frozenset(labels.items())))


async def scrape(client: httpx.AsyncClient) -> Series:
    response = await client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == metrics.CONTENT_TYPE
    return parse(response.text)


def assert_turn(series: Series, turns: int = 1) -> None:
    """What one turn of `catalog()` does: three steps (add, a made-up tool, the answer), each one LLM request."""
    assert value(series, "agents_steps_total", agent="agent") == 3 * turns
    assert value(series, "agents_llm_requests_total", model="m", status="success") == 3 * turns
    assert value(series, "agents_llm_request_duration_seconds_count", model="m") == 3 * turns
    assert value(series, "agents_llm_request_duration_seconds_bucket", model="m", le="+Inf") == 3 * turns
    assert value(series, "agents_llm_tokens_total", model="m", type="input") == 3000 * turns
    assert value(series, "agents_llm_tokens_total", model="m", type="output") == 600 * turns
    assert value(series, "agents_llm_tokens_total", model="m", type="cached") == 1200 * turns
    assert value(series, "agents_llm_cost_usd_total", model="m") == pytest.approx(3 * COST * turns)
    assert value(series, "agents_tool_calls_total", tool="add", status="success") == turns
    assert value(series, "agents_tool_calls_total", tool="_unknown", status="error") == turns  # no series per name


async def test_a_turn_that_calls_tools_is_counted(app_factory: Any) -> None:
    app = await app_factory(catalog(), with_worker=True, metrics_flush_seconds=3600)
    async with client_for(app) as client:
        before = await scrape(client)
        assert value(before, "agents_lease_losses_total") == 0  # series without labels are there from the start
        assert value(before, "agents_steps_total", agent="agent") is None
        tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
        await client.post(f"/threads/{tid}/messages", json={"content": "2+3?"})
        await settle(client, tid)
        unflushed = await scrape(client)  # `serve`: what this process's worker counted and has not flushed yet
        assert_turn(unflushed)
        assert value(unflushed, "agents_threads_runnable") == 0
        assert value(unflushed, "agents_inbox_depth") == 0
        assert value(unflushed, "agents_executions_in_flight") == 0
        meter: metrics.Meter = app.state.runtime.meter
        await meter.flush(app.state.runtime.sessions)
        assert_turn(await scrape(client))  # flushed: read from the database, and not counted twice
        async with app.state.runtime.sessions() as session:
            stored = (await session.execute(sql("SELECT value FROM metrics WHERE sample = 'agents_steps_total'"))).all()
        assert stored == [(3.0,)]


async def test_a_stopping_worker_adds_what_it_counted(settings: Settings, sessions: Any) -> None:
    app = create_app(settings.model_copy(update={"metrics_flush_seconds": 3600}), catalog(), with_worker=True)
    lifespan = app.router.lifespan_context(app)
    await lifespan.__aenter__()
    try:
        async with client_for(app) as client:
            tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
            await client.post(f"/threads/{tid}/messages", json={"content": "2+3?"})
            await settle(client, tid)
        async with sessions() as session:
            assert (await session.execute(sql("SELECT count(*) FROM metrics"))).scalar_one() == 0  # not yet flushed
    finally:
        await lifespan.__aexit__(None, None, None)
    async with sessions() as session:
        rows = await session.execute(sql("SELECT sample, labels, value FROM metrics"))
        stored = {(r.sample, r.labels): r.value for r in rows}
    assert stored[("agents_steps_total", '{"agent":"agent"}')] == 3
    assert stored[("agents_tool_calls_total", '{"status":"success","tool":"add"}')] == 1


async def test_the_totals_are_the_sum_of_every_worker(app_factory: Any) -> None:
    app = await app_factory(catalog(), with_worker=True, metrics_flush_seconds=3600)
    others = [metrics.Meter(), metrics.Meter()]  # two more worker processes, on other hosts for all it matters
    for n, other in enumerate(others):
        other.steps.labels("agent").inc(10 * (n + 1))
        other.tool_calls.labels("add", "error").inc()
        other.llm_seconds.labels("m").observe(3.0)
        await other.flush(app.state.runtime.sessions)
        await other.flush(app.state.runtime.sessions)  # nothing new: nothing added
    async with client_for(app) as client:
        tid = (await client.post("/threads", json={"agent": "agent"})).json()["id"]
        await client.post(f"/threads/{tid}/messages", json={"content": "2+3?"})
        await settle(client, tid)
        series = await scrape(client)
    assert value(series, "agents_steps_total", agent="agent") == 3 + 10 + 20
    assert value(series, "agents_tool_calls_total", tool="add", status="error") == 2
    assert value(series, "agents_tool_calls_total", tool="add", status="success") == 1
    assert value(series, "agents_llm_request_duration_seconds_count", model="m") == 3 + 2
    assert value(series, "agents_llm_request_duration_seconds_bucket", model="m", le="2.5") == 3  # the test model's
    assert value(series, "agents_llm_request_duration_seconds_bucket", model="m", le="5.0") == 3 + 2


async def test_queue_gauges_describe_the_database(app_factory: Any, database_url: str) -> None:
    app = await app_factory(catalog())  # no worker: what is posted waits
    async with client_for(app) as client:
        tids = [(await client.post("/threads", json={"agent": "agent"})).json()["id"] for _ in range(2)]
        for tid in tids:
            await client.post(f"/threads/{tid}/messages", json={"content": "hi"})
        await client.post(f"/threads/{tids[0]}/messages", json={"content": "again"})
        await asyncio.sleep(0.05)
        waiting = await scrape(client)
        assert value(waiting, "agents_threads_runnable") == 2
        assert value(waiting, "agents_inbox_depth") == 3
        assert value(waiting, "agents_executions_in_flight") == 0
        assert (value(waiting, "agents_queue_oldest_seconds") or 0) > 0
        conn = await db.connect(database_url, connect_timeout=10)
        try:
            claimed = await claims.claim(conn, "test", 30)
            assert claimed is not None
            leased = await scrape(client)
            assert value(leased, "agents_threads_runnable") == 1
            assert value(leased, "agents_executions_in_flight") == 1
            await conn.execute("UPDATE inbox SET set_aside_at = now() WHERE thread_id = $1", uuid.UUID(tids[1]))
        finally:
            await conn.close()
        aside = await scrape(client)
        assert value(aside, "agents_inbox_depth") == 2 and value(aside, "agents_inbox_set_aside") == 1


async def test_metrics_need_an_admin_key(app_factory: Any, sessions: Any) -> None:
    async with sessions() as s, s.begin():
        _, admin = await keys.create(s, "ops", admin=True)
        _, user = await keys.create(s, "alice")
    app = await app_factory(catalog())
    async with client_for(app) as anonymous, client_for(app, user) as alice, client_for(app, admin) as ops:
        assert_error(await anonymous.get("/metrics"), 401, "unauthorized")
        assert_error(await alice.get("/metrics", headers={"Authorization": "Bearer sa_wrong"}), 401, "unauthorized")
        assert_error(await alice.get("/metrics"), 403, "forbidden")
        assert value(await scrape(ops), "agents_threads_runnable") == 0


async def test_open_mode_serves_the_local_admin_only_on_loopback_names(app_factory: Any) -> None:
    app = await app_factory(catalog())  # no key, loopback: the local user is the admin
    async with client_for(app) as client:
        assert (await client.get("/metrics")).status_code == 200
        assert_error(await client.get("/metrics", headers={"Host": "evil.example"}), 403, "host_not_allowed")


@pytest.mark.slow  # real API and worker processes
async def test_api_and_workers_in_separate_processes(database_url: str, tmp_path: Path) -> None:
    """`agents api` + two `agents worker`s: the workers' counts reach the API's `/metrics` through the database; the
    stream gauge is the API process's own."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SECRET_KEY")}
    env.update(
        DATABASE_URL=database_url,
        DATA_DIR=str(tmp_path / "data"),
        AGENTS_DIR=str(ROOT / "agents"),
        SECRET_KEY="k" * 48,
        METRICS_FLUSH_SECONDS="0.2",
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    api = start(["api", "--port", str(port)], env, tmp_path / "api.log")
    workers = [start(["worker", "--concurrency", "2"], env, tmp_path / f"worker{n}.log") for n in range(2)]
    try:
        await until_ready(base, api, tmp_path / "api.log")
        async with httpx.AsyncClient(base_url=base) as client:
            tids = [(await client.post("/threads", json={"agent": "assistant"})).json()["id"] for _ in range(3)]
            readers = [asyncio.create_task(read_events(base, f"/threads/{t}/events", "turn_ended")) for t in tids]

            async def streaming() -> bool:
                series = parse((await client.get("/metrics")).text)
                return value(series, "agents_stream_connections", stream="thread") == 3

            await wait_for(streaming)
            for tid in tids:
                await client.post(f"/threads/{tid}/messages", json={"content": "What is 12 * (3 + 4)?"})
            await asyncio.wait_for(asyncio.gather(*readers), 30)

            async def counted() -> Series | None:
                series = parse((await client.get("/metrics")).text)
                steps = value(series, "agents_steps_total", agent="assistant")
                closed = value(series, "agents_stream_connections", stream="thread") == 0
                return series if steps == 6 and closed else None

            series = await wait_for(counted)
        assert value(series, "agents_llm_requests_total", model="demo", status="success") == 6
        assert value(series, "agents_tool_calls_total", tool="calculate", status="success") == 3
        assert value(series, "agents_llm_request_duration_seconds_count", model="demo") == 6
        assert value(series, "agents_threads_runnable") == 0 and value(series, "agents_inbox_depth") == 0
    finally:
        for worker in workers:
            assert stop(worker) == 0
        assert stop(api) == 0, (tmp_path / "api.log").read_text()
