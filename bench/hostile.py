"""S3 — hostile input against a real `agents serve`: what each once-harmful request costs now.

Re-measures issue 15's rows the way they were first measured: pathological `find=`/`grep=` patterns, chunked
bodies far past the limit, eight concurrent thumbnails of a 6000×6600 PNG, 5,000 variables in one request (and 24
such requests while another user lists threads). For each: the answer, the time, the server's memory, and the
longest `/health` wait while it ran.

    .venv/bin/python -m bench.hostile
"""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

from bench.harness import ROOT, database, postgres_server, postgres_version, servers, setup

MB = 1024 * 1024


def _key(url: str, user: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "app", "keys", "create", "--user", user],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1]


def _rss(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _chunks(size: int, prefix: bytes = b"", suffix: bytes = b"") -> AsyncIterator[bytes]:
    yield prefix
    for _ in range(size // MB):
        yield b"x" * MB
    yield suffix


class Probe:
    """While a request runs: the longest `/health` wait and the server's peak RSS."""

    def __init__(self, client: httpx.AsyncClient, pid: int) -> None:
        self.client, self.pid = client, pid

    async def run(self, work: Awaitable[Any]) -> tuple[Any, float, float, float]:
        """(result, seconds, longest /health wait in ms, peak RSS in MB)."""
        task = asyncio.ensure_future(work)
        started = time.perf_counter()
        longest, peak = 0.0, _rss(self.pid)
        while not task.done():
            t = time.perf_counter()
            await self.client.get("/health")
            longest = max(longest, time.perf_counter() - t)
            peak = max(peak, _rss(self.pid))
            await asyncio.sleep(0.02)
        return await task, time.perf_counter() - started, longest * 1000, peak


def _row(what: str, answer: str, seconds: float, health: float, rss: str) -> None:
    print(f"| {what} | {answer} | {seconds:.2f} s | {health:.0f} ms | {rss} |")
    sys.stdout.flush()


async def main() -> None:
    with postgres_server() as server:
        async with database(server) as url:
            setup("S3 hostile input", {"server": "agents serve (bench agents)"}, await postgres_version(url))
            alice, bob = _key(url, "alice"), _key(url, "bob")
            pids: list[int] = []
            env = {"SECRET_KEY": "bench", "ACCESS_LOG": "false"}
            async with servers(url, [["serve"]], env, pids) as base:
                await _measure(base, pids[0], alice, bob)


async def _measure(base: str, pid: int, alice: str, bob: str) -> None:
    a = httpx.AsyncClient(base_url=base, timeout=300, headers={"Authorization": f"Bearer {alice}"})
    b = httpx.AsyncClient(base_url=base, timeout=300, headers={"Authorization": f"Bearer {bob}"})
    probe = Probe(httpx.AsyncClient(base_url=base, timeout=300), pid)
    tid = (await a.post("/threads", json={"agent": "bench"})).json()["id"]
    await a.put(f"/threads/{tid}/fs/{'a' * 250}/{'a' * 148}", content=b"a" * 25 + b"!\n")
    print("\n| request | answer | time | longest /health wait | server RSS (MB) |\n| --- | --- | --- | --- | --- |")

    async def measured(what: str, work: Awaitable[httpx.Response], rss: bool = False) -> None:
        before = _rss(pid)
        response, seconds, health, peak = await probe.run(work)
        code = response.json()["error"]["code"] if response.status_code >= 400 else ""
        _row(what, f"{response.status_code} {code}".strip(), seconds, health, f"{before:.0f} → {peak:.0f}")

    await measured(
        "`find=/**b**b**b**b**bZ` over a 400-character path",
        a.get(f"/threads/{tid}/fs", params={"find": "/**b**b**b**b**bZ"}),
    )
    await measured("`grep=(a+)+$` over a 26-character line", a.get(f"/threads/{tid}/fs", params={"grep": "(a+)+$"}))
    json = {"content-type": "application/json"}
    await measured(
        "chunked 100 MB `POST /threads/{id}/messages`",
        a.post(f"/threads/{tid}/messages", content=_chunks(100 * MB, b'{"content": "', b'"}'), headers=json),
    )
    await measured(
        "chunked 60 MB `POST /threads`",
        a.post("/threads", content=_chunks(60 * MB, b'{"agent": "bench", "name": "', b'"}'), headers=json),
    )

    image = io.BytesIO()
    Image.new("RGB", (6000, 6600), "teal").save(image, "PNG")
    await a.put(f"/threads/{tid}/fs/big.png", content=image.getvalue(), headers={"content-type": "image/png"})
    before = _rss(pid)
    thumbs = asyncio.gather(*[a.get(f"/threads/{tid}/fs/big.png", params={"thumbnail": 1}) for _ in range(8)])
    answers, seconds, health, peak = await probe.run(thumbs)
    await asyncio.sleep(2)
    statuses = sorted({r.status_code for r in answers})
    _row(
        f"8 × thumbnail of a {len(image.getvalue()) // 1024} KB 6000×6600 PNG (at once)",
        f"{statuses}",
        seconds,
        health,
        f"{before:.0f} → {peak:.0f} → {_rss(pid):.0f} (2 s after)",
    )

    many = {"agent": "bench", "env": {f"V{i}": "x" * 10 for i in range(5000)}}
    await measured("`POST /threads` with 5,000 variables", a.post("/threads", json=many))
    await measured(
        "`POST /threads` with a 5 MB variable",
        a.post("/threads", json={"agent": "bench", "env": {"BIG": "x" * 5 * MB}}),
    )
    flood = asyncio.gather(*[a.post("/threads", json=many) for _ in range(24)])
    listing: list[float] = []
    while not flood.done():
        t = time.perf_counter()
        await b.get("/threads")
        listing.append(time.perf_counter() - t)
        await asyncio.sleep(0.02)
    codes = sorted({r.status_code for r in await flood})
    print(
        f"\n24 × 5,000 variables at once: answers {codes}; another user's `GET /threads` meanwhile: "
        f"longest {max(listing) * 1000:.0f} ms over {len(listing)} requests"
    )
    for c in (a, b, probe.client):
        await c.aclose()


if __name__ == "__main__":
    asyncio.run(main())
