"""Crash recovery and one flight per thread, with `agents api` and several `agents worker` processes on real Postgres.

A worker is `kill -9`ed in the middle of an LLM call or a tool call and another worker finishes the run from what is
stored; three workers race over many threads and no thread ever runs in two places at once
(`storage-and-queue.md`, "One flight per thread" and "Crash recovery").
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from app.settings import plain_url
from tests.conftest import ROOT
from tests.processes import free_port, start, stop, until_ready

FIXTURE = ROOT / "tests" / "fixtures" / "agents_crash"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def pid_of(owner: str) -> int:
    """The process id in a lease owner (`host:pid:nonce`)."""
    return int(owner.split(":")[-2])


@dataclass
class Cluster:
    """An `agents api` process and some `agents worker` processes sharing one fresh database."""

    base: str
    db: asyncpg.Connection
    crash_dir: Path
    logs: list[Path]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def worker(self, pid: int) -> subprocess.Popen[bytes]:
        return next(p for p in self.processes[1:] if p.pid == pid)

    def output(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-4000:]}" for log in self.logs)

    async def wait(self, predicate: Callable[[], Awaitable[Any]], timeout: float, what: str) -> Any:
        """Poll until `predicate` returns something truthy; fail with every process's output after `timeout`."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            value = await predicate()
            if value:
                return value
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"{what}: not reached in {timeout} s\n{self.output()}")
            await asyncio.sleep(0.05)

    async def new_thread(self, client: httpx.AsyncClient, content: str) -> tuple[str, str]:
        """A `crashy` thread writing its records to `crash_dir`, with `content` posted; (thread id, message id)."""
        created = await client.post("/threads", json={"agent": "crashy", "env": {"CRASH_DIR": str(self.crash_dir)}})
        assert created.status_code == 201, created.text
        tid = created.json()["id"]
        posted = await client.post(f"/threads/{tid}/messages", json={"content": content})
        assert posted.status_code == 202, posted.text
        return tid, posted.json()["message_id"]

    async def settled(self, tid: str) -> asyncpg.Record:
        """Wait until the thread's turn ended and no worker holds or wants it."""

        async def done() -> asyncpg.Record | None:
            row = await self.db.fetchrow("SELECT * FROM threads WHERE id = $1", tid)
            ok = row["status"] == "idle" and row["session_turns"] == 1
            return row if ok and row["lease_owner"] is None and row["runnable_since"] is None else None

        row: asyncpg.Record = await self.wait(done, 30, f"thread {tid} settles")
        return row

    async def step_events(self, tid: str) -> list[tuple[str, int]]:
        rows = await self.db.fetch(
            "SELECT type, data FROM events WHERE thread_id = $1 AND type LIKE 'step_%' ORDER BY seq", tid
        )
        return [(r["type"], json.loads(r["data"])["step"]) for r in rows]


ClusterFactory = Callable[..., Awaitable[Cluster]]


@pytest.fixture
async def cluster(database_url: str, tmp_path: Path) -> AsyncIterator[ClusterFactory]:
    """Start `agents api` and `workers` × `agents worker` on the crash fixture agents; stopped at teardown."""
    conn = await asyncpg.connect(plain_url(database_url))
    clusters: list[Cluster] = []

    async def make(workers: int, **overrides: str) -> Cluster:
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SECRET_KEY")}
        env.update(
            DATABASE_URL=database_url,
            SECRET_KEY="k" * 48,
            DATA_DIR=str(tmp_path / "data"),
            AGENTS_DIR=str(FIXTURE),
            CRASH_DIR=str(tmp_path),
            LEASE_SECONDS="2",
            POLL_INTERVAL="0.1",
            WORKER_CONCURRENCY="4",
        )
        env.update(overrides)
        port = free_port()
        c = Cluster(f"http://127.0.0.1:{port}", conn, tmp_path, [tmp_path / "api.log"])
        clusters.append(c)
        c.processes.append(start(["api", "--port", str(port)], env, c.logs[0]))
        for i in range(workers):
            c.logs.append(tmp_path / f"worker-{i}.log")
            c.processes.append(start(["worker"], env, c.logs[-1]))
        await until_ready(c.base, c.processes[0], c.logs[0])

        async def workers_started() -> bool:
            return all("started with" in log.read_text() for log in c.logs[1:])

        await c.wait(workers_started, 30, "workers start")
        return c

    yield make
    try:
        for c in clusters:
            for proc, log in zip(c.processes, c.logs, strict=True):
                if proc.poll() is None:
                    assert stop(proc) == 0, log.read_text()
    finally:
        await conn.close()


async def test_a_worker_killed_mid_llm_call_is_replaced_and_the_pending_message_reused(
    cluster: ClusterFactory,
) -> None:
    c = await cluster(workers=2)
    async with httpx.AsyncClient(base_url=c.base) as client:
        tid, message_id = await c.new_thread(client, "slow-model")

        async def slow_call_in_flight() -> tuple[int, str] | None:
            tries = read_jsonl(c.crash_dir / "model.jsonl")
            owner = await c.db.fetchval("SELECT lease_owner FROM threads WHERE id = $1", tid)
            return (tries[0]["pid"], owner) if tries and owner else None

        victim, owner = await c.wait(slow_call_in_flight, 20, "the slow LLM call starts")
        assert pid_of(owner) == victim  # the lease names the process making the call
        pending = await c.db.fetch("SELECT id, status FROM messages WHERE thread_id = $1 AND role = 'assistant'", tid)
        assert [r["status"] for r in pending] == ["pending"]

        proc = c.worker(victim)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL

        thread = await c.settled(tid)
        stored = (await client.get(f"/threads/{tid}/messages")).json()["messages"]

    survivor = next(p.pid for p in c.processes[1:] if p.pid != victim)
    assert [t["pid"] for t in read_jsonl(c.crash_dir / "model.jsonl")] == [victim, survivor]
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant"]
    user, planned, result, reply = stored
    assert (user["id"], user["content"]) == (message_id, "slow-model")  # the input was not lost
    assert planned["id"] == str(pending[0]["id"])  # the interrupted call was made again into the same row
    assert planned["status"] == "completed" and planned["tool_calls"][0]["function"]["name"] == "note"
    assert (result["tool_call_id"], result["content"]) == (planned["tool_calls"][0]["id"], "noted hello")
    assert (reply["content"], reply["status"]) == ("noted: noted hello", "completed")
    # the redone call is the same step, not a new one
    assert thread["session_steps"] == 2
    assert [e for e in await c.step_events(tid) if e[0] == "step_completed"] == [
        ("step_completed", 1),
        ("step_completed", 2),
    ]
    llm_logs = await c.db.fetchval("SELECT count(*) FROM logs WHERE thread_id = $1 AND kind = 'llm'", tid)
    assert llm_logs == 2  # the killed call never completed, so it was never logged


async def test_a_worker_killed_mid_tool_call_is_replaced_and_the_call_answered_once(cluster: ClusterFactory) -> None:
    c = await cluster(workers=2)
    async with httpx.AsyncClient(base_url=c.base) as client:
        tid, message_id = await c.new_thread(client, "slow-tool")

        async def slow_tool_in_flight() -> tuple[int, str] | None:
            tries = read_jsonl(c.crash_dir / "tools.jsonl")
            owner = await c.db.fetchval("SELECT lease_owner FROM threads WHERE id = $1", tid)
            return (tries[0]["pid"], owner) if tries and owner else None

        victim, owner = await c.wait(slow_tool_in_flight, 20, "the slow tool starts")
        assert pid_of(owner) == victim
        proc = c.worker(victim)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL

        thread = await c.settled(tid)
        stored = (await client.get(f"/threads/{tid}/messages")).json()["messages"]

    survivor = next(p.pid for p in c.processes[1:] if p.pid != victim)
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant"]
    user, planned, result, reply = stored
    assert user["id"] == message_id
    call_id = planned["tool_calls"][0]["id"]
    tries = read_jsonl(c.crash_dir / "tools.jsonl")
    assert [(t["tool_call_id"], t["pid"]) for t in tries] == [(call_id, victim), (call_id, survivor)]
    assert tries[0]["attempt"] < tries[1]["attempt"]
    # answered exactly once, by the second try, which saw the agent's env like the first
    assert [m["tool_call_id"] for m in stored if m["role"] == "tool"] == [call_id]
    assert (result["tool_status"], result["content"]) == ("success", "slept as crashy-agent")
    assert reply["content"] == "finished: slept as crashy-agent"
    assert thread["session_steps"] == 2


async def test_racing_workers_run_each_thread_once_and_never_twice_at_once(cluster: ClusterFactory) -> None:
    count = 200
    # a long lease: this test is about the claim, not about a heartbeat starved on a busy machine
    c = await cluster(workers=3, LEASE_SECONDS="10")
    keys = [uuid.uuid4().hex for _ in range(count)]
    env = {"CRASH_DIR": str(c.crash_dir)}
    async with httpx.AsyncClient(base_url=c.base, limits=httpx.Limits(max_connections=8), timeout=30) as client:
        created = await asyncio.gather(
            *(
                client.post("/threads", json={"agent": "crashy", "env": env, "messages": [{"content": f"race {k}"}]})
                for k in keys
            )
        )
    assert {r.status_code for r in created} == {201}
    thread_of = {k: r.json()["id"] for k, r in zip(keys, created, strict=True)}

    async def all_settled() -> bool:
        done = await c.db.fetchval(
            "SELECT count(*) FROM threads WHERE status = 'idle' AND session_turns = 1"
            " AND lease_owner IS NULL AND runnable_since IS NULL"
        )
        return bool(done == count)

    await c.wait(all_settled, 60, "every thread settles")

    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in read_jsonl(c.crash_dir / "race.jsonl"):
        runs[record["key"]].append(record)
    assert sorted(runs) == sorted(keys)
    for key, records in runs.items():
        records.sort(key=lambda r: r["start"])
        assert [r["what"] for r in records] == ["llm", "tool", "llm"], key  # each call made exactly once
        assert records[1]["thread_id"] == thread_of[key]
        for before, after in itertools.pairwise(records):
            assert before["end"] <= after["start"], f"{thread_of[key]} ran in two places at once: {before} {after}"
    assert {r["pid"] for rs in runs.values() for r in rs} == {p.pid for p in c.processes[1:]}  # a real race

    histories = await c.db.fetch(
        "SELECT thread_id::text AS tid, array_agg(role ORDER BY position) AS roles,"
        " array_agg(content ORDER BY position) AS contents FROM messages GROUP BY thread_id"
    )
    replies = {h["tid"]: (h["roles"], h["contents"][-1]) for h in histories}
    assert replies == {tid: (["user", "assistant", "tool", "assistant"], f"done {k}") for k, tid in thread_of.items()}
