"""Helpers for tests that run `python -m app …` as real subprocesses."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from tests.conftest import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`python -m app <args>` from the repo root, its output in `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "app", *args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )


async def until_ready(base: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    """Poll `/ready` until the server answers 200."""
    deadline = asyncio.get_running_loop().time() + timeout
    async with httpx.AsyncClient(base_url=base) as client:
        while asyncio.get_running_loop().time() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"server exited early:\n{log.read_text()}")
            try:
                if (await client.get("/ready")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError(f"server not ready in time:\n{log.read_text()}")


def stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM, then the exit code (a process that ignores it is killed and the test fails)."""
    proc.terminate()
    try:
        return proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
