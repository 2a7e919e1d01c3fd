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

from app import catalog, crypto, db, environment, keys, messages, threads
from app.settings import Settings
from tests.conftest import ROOT
from tests.processes import free_port, start, stop, until_ready

pytestmark = pytest.mark.slow  # real API and worker processes, killed with -9

FIXTURE = ROOT / "tests" / "fixtures" / "agents_crash"
SECRET_KEY = "crash-" + "k" * 42


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def pid_of(owner: str) -> int:
    """The process id in a lease owner (`host:pid:nonce`)."""
    return int(owner.split(":")[-2])


@dataclass
class Cluster:
    """`agents worker` processes (and an `agents api` process) sharing one fresh database."""

    db: asyncpg.Connection
    crash_dir: Path
    base: str = ""
    processes: list[tuple[subprocess.Popen[bytes], Path]] = field(default_factory=list)

    @property
    def workers(self) -> list[subprocess.Popen[bytes]]:
        return [p for p, log in self.processes if log.name.startswith("worker")]

    def worker(self, pid: int) -> subprocess.Popen[bytes]:
        return next(p for p in self.workers if p.pid == pid)

    def output(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-4000:]}" for _, log in self.processes)

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

    async def new_thread(self, client: httpx.AsyncClient, content: str, agent: str = "crashy") -> tuple[str, str]:
        """A `crashy` thread writing its records to `crash_dir`, with `content` posted; (thread id, message id)."""
        created = await client.post("/threads", json={"agent": agent, "env": {"CRASH_DIR": str(self.crash_dir)}})
        assert created.status_code == 201, created.text
        tid = created.json()["id"]
        posted = await client.post(f"/threads/{tid}/messages", json={"content": content})
        assert posted.status_code == 202, posted.text
        return tid, posted.json()["message_id"]

    async def thread_row(self, tid: str) -> asyncpg.Record:
        row = await self.db.fetchrow("SELECT * FROM threads WHERE id = $1", tid)
        assert row is not None, f"no thread {tid}"
        return row

    async def settled(self, tid: str) -> asyncpg.Record:
        """Wait until the thread's turn ended and no worker holds or wants it."""

        async def done() -> asyncpg.Record | None:
            row = await self.thread_row(tid)
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
async def cluster(fresh_database_url: str, tmp_path: Path) -> AsyncIterator[ClusterFactory]:
    """Start `workers` × `agents worker` (and `agents api`) on the crash fixture agents, on a database of their own
    (processes that are killed mid-write); stopped at teardown."""
    conn = await db.connect(fresh_database_url)
    clusters: list[Cluster] = []

    async def make(workers: int, *, api: bool = True, **overrides: str) -> Cluster:
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SECRET_KEY")}
        env.update(
            DATABASE_URL=fresh_database_url,
            SECRET_KEY=SECRET_KEY,
            DATA_DIR=str(tmp_path / "data"),
            AGENTS_DIR=str(FIXTURE),
            CRASH_DIR=str(tmp_path),
            LEASE_SECONDS="2",
            POLL_INTERVAL="0.1",
            WORKER_CONCURRENCY="4",
        )
        env.update(overrides)
        c = Cluster(conn, tmp_path)
        clusters.append(c)
        if api:
            port = free_port()
            c.base = f"http://127.0.0.1:{port}"
            c.processes.append((start(["api", "--port", str(port)], env, tmp_path / "api.log"), tmp_path / "api.log"))
        for i in range(workers):
            log = tmp_path / f"worker-{len(clusters)}-{i}.log"
            c.processes.append((start(["worker"], env, log), log))
        if api:
            await until_ready(c.base, *c.processes[0])

        async def workers_started() -> bool:
            return all("started with" in log.read_text() for _, log in c.processes if log.name.startswith("worker"))

        await c.wait(workers_started, 30, "workers start")
        return c

    yield make
    try:
        for c in clusters:
            for proc, log in c.processes:
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

    survivor = next(p.pid for p in c.workers if p.pid != victim)
    assert [t["pid"] for t in read_jsonl(c.crash_dir / "model.jsonl")] == [victim, survivor]
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant"]
    user, planned, result, reply = stored
    assert (user["id"], user["content"]) == (message_id, "slow-model")  # the input was not lost
    assert planned["id"] == str(pending[0]["id"])  # the interrupted call was made again into the same row
    assert planned["status"] == "completed" and planned["tool_calls"][0]["function"]["name"] == "note"
    assert (result["tool_call_id"], result["content"]) == (planned["tool_calls"][0]["id"], "noted hello")
    assert (reply["content"], reply["status"]) == ("noted: noted hello", "completed")
    # the redone call is the same step again, not a new one
    assert thread["session_steps"] == 2
    assert await c.step_events(tid) == [
        ("step_started", 1),
        ("step_started", 1),
        ("step_completed", 1),
        ("step_started", 2),
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

    survivor = next(p.pid for p in c.workers if p.pid != victim)
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


async def test_a_crash_amid_parallel_tool_calls_reruns_only_the_unanswered_one(cluster: ClusterFactory) -> None:
    """`note` and `slow_tool` of one answer run at once; `note`'s result is stored while `slow_tool` still runs, so
    after a kill -9 the next worker runs `slow_tool` again and not `note`."""
    c = await cluster(workers=2)
    async with httpx.AsyncClient(base_url=c.base) as client:
        tid, _ = await c.new_thread(client, "parallel", agent="crashy_parallel")

        async def note_answered_slow_tool_running() -> int | None:
            tries = read_jsonl(c.crash_dir / "tools.jsonl")
            answered = await c.db.fetchval(
                "SELECT count(*) FROM messages WHERE thread_id = $1 AND role = 'tool'", uuid.UUID(tid)
            )
            return tries[0]["pid"] if tries and answered == 1 else None

        victim = await c.wait(note_answered_slow_tool_running, 20, "note answered while slow_tool runs")
        proc = c.worker(victim)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
        await c.settled(tid)
        stored = (await client.get(f"/threads/{tid}/messages")).json()["messages"]
        logged = (await client.get(f"/threads/{tid}/logs", params={"kind": "tool"})).json()["logs"]

    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "tool", "assistant"]
    planned = [call["id"] for call in stored[1]["tool_calls"]]
    assert [m["tool_call_id"] for m in stored if m["role"] == "tool"] == planned  # each answered once, in order
    assert stored[-1]["content"] == "finished: noted quick | slept as crashy-agent"
    survivor = next(p.pid for p in c.workers if p.pid != victim)
    tries = read_jsonl(c.crash_dir / "tools.jsonl")  # slow_tool's tries; `note` ran once (one log row)
    assert [(t["tool_call_id"], t["pid"]) for t in tries] == [(planned[1], victim), (planned[1], survivor)]
    assert sorted(row["tool"] for row in logged) == ["note", "slow_tool"]


async def create_threads(database_url: str, crash_dir: Path, contents: list[str]) -> list[str]:
    """`crashy` threads, each with one message queued, made runnable together by one commit (the API in-process)."""
    agent = catalog.load(FIXTURE).agent("crashy")
    fernet = crypto.server_key(Settings(database_url=database_url, secret_key=SECRET_KEY))
    engine = db.create_engine(database_url, 1)
    try:
        async with db.sessionmaker(engine)() as session, session.begin():
            ids = []
            for content in contents:
                thread = await threads.create(session, agent, keys.OPEN)
                await environment.set_thread(session, fernet, thread.id, {"CRASH_DIR": str(crash_dir)}, set())
                await messages.enqueue(session, thread, "user", content, posted=True)
                ids.append(str(thread.id))
    finally:
        await engine.dispose()
    return ids


async def test_racing_workers_run_each_thread_once_and_never_twice_at_once(
    cluster: ClusterFactory, fresh_database_url: str
) -> None:
    count = 200
    # a long lease: this test is about the claim, not about a heartbeat starved on a busy machine
    c = await cluster(workers=3, api=False, LEASE_SECONDS="10")
    race_keys = [uuid.uuid4().hex for _ in range(count)]
    ids = await create_threads(fresh_database_url, c.crash_dir, [f"race {k}" for k in race_keys])
    thread_of = dict(zip(race_keys, ids, strict=True))

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
    for key, records in runs.items():
        records.sort(key=lambda r: r["start"])
        for before, after in itertools.pairwise(records):
            assert before["end"] <= after["start"], f"{thread_of[key]} ran in two places at once: {before} {after}"
    assert {key: len(records) for key, records in runs.items()} == dict.fromkeys(race_keys, 1)  # each ran once
    assert {r["pid"] for rs in runs.values() for r in rs} == {p.pid for p in c.workers}  # a real race

    histories = await c.db.fetch(
        "SELECT thread_id::text AS tid, array_agg(role ORDER BY position) AS roles,"
        " array_agg(content ORDER BY position) AS contents FROM messages GROUP BY thread_id"
    )
    replies = {h["tid"]: (h["roles"], h["contents"][-1]) for h in histories}
    assert replies == {tid: (["user", "assistant"], f"done {k}") for k, tid in thread_of.items()}


async def test_three_crashes_at_one_step_fail_the_session_instead_of_looping(cluster: ClusterFactory) -> None:
    c = await cluster(workers=4)
    async with httpx.AsyncClient(base_url=c.base) as client:
        tid, message_id = await c.new_thread(client, "hang")
        for crash in range(1, 4):

            async def hanging(n: int = crash) -> int | None:
                tries = read_jsonl(c.crash_dir / "hang.jsonl")
                return tries[n - 1]["pid"] if len(tries) >= n else None

            victim = await c.wait(hanging, 20, f"try {crash} hangs")
            proc = c.worker(victim)
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(10) == -signal.SIGKILL

        async def failed() -> asyncpg.Record | None:
            row = await c.thread_row(tid)
            return row if row["session_status"] == "failure" and row["lease_owner"] is None else None

        thread = await c.wait(failed, 20, "the session fails")
        stored = (await client.get(f"/threads/{tid}/messages")).json()["messages"]
        errors = await c.db.fetch("SELECT data FROM events WHERE thread_id = $1 AND type = 'error'", tid)

    assert len(read_jsonl(c.crash_dir / "hang.jsonl")) == 3  # the fourth claim did not call the model again
    assert (thread["session_reason"], thread["status"]) == ("crashed", "idle")
    assert [(m["id"], m["role"], m["status"]) for m in stored] == [
        (message_id, "user", "completed"),
        (stored[1]["id"], "assistant", "failed"),
    ]
    assert "crashed 3 times at step 1" in json.loads(errors[0]["data"])["message"]
    logs = "\n".join(log.read_text() for _, log in c.processes)  # what an operator sees: stderr of the workers
    assert f"ERROR app.engine.run: thread {tid}: The run crashed 3 times at step 1" in logs
    for attempt in (2, 3):
        assert f"WARNING app.engine.run: thread {tid}: its last execution never finished" in logs
        assert f"running it again (attempt {attempt} of 3)" in logs


async def test_the_parent_gets_its_blocking_childs_result_after_a_kill_9(cluster: ClusterFactory) -> None:
    c = await cluster(workers=1)
    async with httpx.AsyncClient(base_url=c.base) as client:
        created = await client.post("/threads", json={"agent": "tree_boss"})
        tid = created.json()["id"]
        assert (await client.post(f"/threads/{tid}/messages", json={"content": "delegate"})).status_code == 202

        async def child_call_in_flight() -> list[dict[str, Any]] | None:
            status = await c.db.fetchval("SELECT status FROM threads WHERE id = $1", tid)
            tries = read_jsonl(c.crash_dir / "tree.jsonl")
            return tries if status == "waiting" and tries else None

        tries = await c.wait(child_call_in_flight, 20, "the parent waits and the child's call runs")
        victim = c.worker(tries[0]["pid"])  # the one worker: it ran the parent and runs the child
        victim.send_signal(signal.SIGKILL)
        assert victim.wait(10) == -signal.SIGKILL
        await cluster(workers=1, api=False)  # a fresh worker picks the child up when its lease expires

        async def answered() -> list[dict[str, Any]] | None:
            rows = (await client.get(f"/threads/{tid}/messages")).json()["messages"]
            return rows if rows and rows[-1]["role"] == "assistant" and rows[-1]["content"] else None

        rows = await c.wait(answered, 30, "the parent answers with the child's result")
        children = (await client.get(f"/threads/{tid}/subagents")).json()["subagents"]
    assert len(children) == 1  # the child was not created twice
    cid = children[0]["reference"]
    assert [r["role"] for r in rows] == ["user", "assistant", "tool", "assistant"]
    assert rows[2]["content"] == f"approved\n\nReference: {cid}"
    assert rows[3]["content"] == f"boss got: approved\n\nReference: {cid}"
    assert len(read_jsonl(c.crash_dir / "tree.jsonl")) == 2  # the child's interrupted call was made again


@pytest.mark.parametrize(
    ("word", "records", "how"),
    [("slow-model", "model.jsonl", signal.SIGKILL), ("slow-tool", "tools.jsonl", signal.SIGTERM)],
    ids=["kill-9-mid-llm-call", "sigterm-mid-tool-call"],
)
async def test_an_interrupted_turn_is_finished_when_new_input_arrives_before_recovery(
    cluster: ClusterFactory, word: str, records: str, how: signal.Signals
) -> None:
    """R7: the only worker stops mid-step, a second message is posted, then a fresh worker takes the thread over."""
    c = await cluster(workers=1)
    async with httpx.AsyncClient(base_url=c.base) as client:
        tid, _ = await c.new_thread(client, word)

        async def in_flight() -> int | None:
            tries = read_jsonl(c.crash_dir / records)
            return tries[0]["pid"] if tries else None

        victim = c.worker(await c.wait(in_flight, 20, "the slow step starts"))
        pending = await c.db.fetchval("SELECT id::text FROM messages WHERE thread_id = $1 AND role = 'assistant'", tid)
        victim.send_signal(how)
        assert victim.wait(20) == (-signal.SIGKILL if how == signal.SIGKILL else 0)
        posted = await client.post(f"/threads/{tid}/messages", json={"content": "and then?"})
        assert posted.status_code == 202, posted.text
        fresh = await cluster(workers=1, api=False)

        async def done() -> list[dict[str, Any]] | None:
            row = await c.thread_row(tid)
            if row["status"] != "idle" or row["lease_owner"] is not None or row["runnable_since"] is not None:
                return None
            stored: list[dict[str, Any]] = (await client.get(f"/threads/{tid}/messages")).json()["messages"]
            return stored

        stored = await c.wait(done, 30, "the thread settles")

    assert all(m["status"] == "completed" for m in stored), stored  # nothing left pending
    calls = [call["id"] for m in stored if m["role"] == "assistant" for call in m["tool_calls"] or []]
    answers = [m["tool_call_id"] for m in stored if m["role"] == "tool"]
    assert sorted(calls) == sorted(answers) and len(set(answers)) == len(answers)  # each call answered exactly once
    assert [m["content"] for m in stored if m["role"] == "user"] == [word, "and then?"]
    assert stored[-1]["role"] == "assistant" and stored[-1]["content"].startswith(("noted:", "finished:"))
    tries = read_jsonl(c.crash_dir / records)
    [survivor] = [p.pid for p in fresh.workers]
    if word == "slow-model":  # the interrupted call was made again into the same row
        assert [t["pid"] for t in tries][:2] == [victim.pid, survivor]
        assert next(m["id"] for m in stored if m["role"] == "assistant") == pending
    else:  # the interrupted tool call ran again, once
        first = tries[0]["tool_call_id"]
        assert [t["pid"] for t in tries if t["tool_call_id"] == first] == [victim.pid, survivor]


async def test_a_tool_blocking_the_event_loop_costs_no_other_thread_its_lease(cluster: ClusterFactory) -> None:
    """R9: one thread's tool computes for 6 s on the event loop (3 leases); the other threads' tools on that worker,
    with a second worker ready to steal expired leases, each still run exactly once."""
    c = await cluster(workers=1, WORKER_CONCURRENCY="16")
    async with httpx.AsyncClient(base_url=c.base) as client:
        paused = [(await c.new_thread(client, "pause"))[0] for _ in range(8)]

        async def all_claimed() -> bool:
            n = await c.db.fetchval("SELECT count(*) FROM threads WHERE lease_owner IS NOT NULL AND status = 'running'")
            return bool(n == len(paused))

        await c.wait(all_claimed, 20, "the pausing threads run")
        burning, _ = await c.new_thread(client, "burn 6")
        await c.wait(lambda: _exists(c.crash_dir / "burn.jsonl"), 20, "the burn starts")
        await cluster(workers=1, api=False, WORKER_CONCURRENCY="16")  # a thief, should any lease expire
        for tid in [*paused, burning]:
            await c.settled(tid)
    runs = read_jsonl(c.crash_dir / "pause.jsonl")
    assert sorted(r["thread"] for r in runs) == sorted(paused)  # each ran once
    assert {r["pid"] for r in runs} == {c.workers[0].pid}  # nobody took them over
    assert len(read_jsonl(c.crash_dir / "burn.jsonl")) == 1


async def test_the_watchdog_ends_a_worker_whose_loop_is_stuck_and_its_leases_pass_on(cluster: ClusterFactory) -> None:
    """R9: stuck past `WATCHDOG_SECONDS`, the worker exits (code 70); another worker finishes the thread."""
    c = await cluster(workers=1, WATCHDOG_SECONDS="3")
    async with httpx.AsyncClient(base_url=c.base) as client:
        tid, _ = await c.new_thread(client, "burn 30")
        await c.wait(lambda: _exists(c.crash_dir / "burn.jsonl"), 20, "the burn starts")
        [stuck] = c.workers
        assert await asyncio.to_thread(stuck.wait, 15) == 70
        fresh = await cluster(workers=1, api=False)
        await c.settled(tid)
        stored = (await client.get(f"/threads/{tid}/messages")).json()["messages"]
    assert [t["pid"] for t in read_jsonl(c.crash_dir / "burn.jsonl")] == [stuck.pid, fresh.workers[0].pid]
    assert stored[-1]["content"] == "burn: burnt"
    assert "exiting so its leases pass on" in next(log for p, log in c.processes if p is stuck).read_text()


async def _exists(path: Path) -> bool:
    return path.exists()
