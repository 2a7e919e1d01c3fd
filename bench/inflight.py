"""Memory per in-flight turn: one worker process with N turns waiting on a slow model, its RSS over N.

`agents api` and one `agents worker` (`WORKER_CONCURRENCY` = N) on a fresh database; the `waiting` agent calls the
real `openai` provider against `bench/peers/fake_llm.py`, started here with a first token minutes away, so every turn
is an execution waiting on its model's stream. N threads get one message each, in two waves: a tenth, then the rest.
Once the model has every call of a wave in flight (its `/stats`), the worker's RSS is read; the figure is the RSS
added by the second wave over its turns (the first wave pays what is paid once: connections, caches, the allocator's
arenas). Beside it: the worker's CPU while the turns wait, and its Postgres connections (none may be in a
transaction: an execution waiting on a model holds no connection of the pool).

    .venv/bin/python -m bench.inflight [--turns 1000] [--llm-script bench/peers/fake_llm.py]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

import httpx

from app import db
from bench.harness import ROOT, cpu_seconds, database, free_port, postgres_server, postgres_version, servers, setup

FAKE_LLM = ROOT / "bench" / "peers" / "fake_llm.py"
WAIT_MS = 600_000  # the model's time to first token: longer than the measurement
CONNECTIONS = """
    SELECT count(*) AS connections, count(*) FILTER (WHERE state LIKE 'idle in transaction%') AS in_transaction
    FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
"""


def rss_mb(pid: int) -> float:
    """The process's resident memory (Linux `/proc`), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


async def in_flight(llm: httpx.AsyncClient) -> int:
    return int((await llm.get("/stats")).json()["in_flight"])


async def wave(client: httpx.AsyncClient, llm: httpx.AsyncClient, threads: list[str], total: int) -> float:
    """Post one message to each thread; seconds until the model has `total` calls in flight."""
    start = time.monotonic()
    gate = asyncio.Semaphore(50)

    async def post(thread: str) -> None:
        async with gate:
            (await client.post(f"/threads/{thread}/messages", json={"content": "hi"})).raise_for_status()

    await asyncio.gather(*(post(t) for t in threads))
    while (now := await in_flight(llm)) < total:
        if time.monotonic() - start > 300:
            raise SystemExit(f"only {now} of {total} calls reached the model in 300 s")
        await asyncio.sleep(0.2)
    return time.monotonic() - start


async def settled_rss(pid: int, seconds: float = 3.0) -> float:
    """RSS once the process is quiet (the last wave's work done): the median of a few reads."""
    reads = []
    for _ in range(5):
        await asyncio.sleep(seconds / 5)
        reads.append(rss_mb(pid))
    return sorted(reads)[2]


async def measure(turns: int, llm_url: str) -> None:
    with postgres_server() as server:
        setup(
            "Memory per in-flight turn",
            {"turns": turns, "model": f"openai provider, first token after {WAIT_MS / 1000:.0f} s"},
            await postgres_version(server),
        )
        async with database(server) as url:
            await run(url, turns, llm_url)


async def run(url: str, turns: int, llm_url: str) -> None:
    env = {
        "WORKER_CONCURRENCY": str(turns),
        "BENCH_LLM_URL": f"{llm_url}/v1",
        "LLM_FIRST_CHUNK_TIMEOUT": str(WAIT_MS / 1000),
        "ACCESS_LOG": "false",
    }
    pids: list[int] = []
    async with (
        servers(url, [["api"], ["worker"]], env, pids) as base,
        httpx.AsyncClient(base_url=base, timeout=60) as client,
        httpx.AsyncClient(base_url=llm_url, timeout=10) as llm,
    ):
        worker = pids[1]
        (await llm.get("/health")).raise_for_status()  # started before the servers, up long before them
        gate = asyncio.Semaphore(50)

        async def thread() -> str:
            async with gate:
                return str((await client.post("/threads", json={"agent": "waiting"})).json()["id"])

        threads = await asyncio.gather(*(thread() for _ in range(turns)))
        first = max(1, turns // 10)
        idle = await settled_rss(worker)
        reached_first = await wave(client, llm, threads[:first], first)
        with_first = await settled_rss(worker)
        reached_all = await wave(client, llm, threads[first:], turns)
        with_all = await settled_rss(worker)
        cpu_before, clock = cpu_seconds([worker]), time.monotonic()
        await asyncio.sleep(5)
        cores = (cpu_seconds([worker]) - cpu_before) / (time.monotonic() - clock)
        conn = await db.connect(url)
        try:
            found = await conn.fetchrow(CONNECTIONS)
        finally:
            await conn.close()
        assert found is not None
    per_turn = (with_all - with_first) * 1024 / (turns - first)
    print(f"worker RSS idle            {idle:8.1f} MB")
    print(f"with {first:>5} turns waiting  {with_first:8.1f} MB   (all on the model after {reached_first:.1f} s)")
    print(f"with {turns:>5} turns waiting  {with_all:8.1f} MB   (all on the model after {reached_all:.1f} s)")
    print(f"per in-flight turn         {per_turn:8.1f} KB   (the second wave's RSS over its {turns - first} turns)")
    print(f"  from idle                {(with_all - idle) * 1024 / turns:8.1f} KB   (everything over {turns} turns)")
    print(f"worker CPU while waiting   {cores:8.3f} cores")
    print(f"Postgres connections       {found['connections']:8d}   ({found['in_transaction']} in a transaction)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=1000, help="turns waiting on the model at once")
    parser.add_argument("--llm-script", type=Path, default=FAKE_LLM, help="the OpenAI-compatible slow model server")
    args = parser.parse_args()
    port = free_port()
    model = subprocess.Popen(
        [sys.executable, str(args.llm_script), "--port", str(port), "--ttft-ms", str(WAIT_MS)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        asyncio.run(measure(args.turns, f"http://127.0.0.1:{port}"))
    finally:
        model.terminate()
        model.wait(10)


if __name__ == "__main__":
    main()
