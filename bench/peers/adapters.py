"""The peer benchmark's adapters: how the client starts a run on each server and follows it over SSE.

One adapter per server API (`AegraAdapter`: the LangGraph Agent Protocol; `StandardAgentsAdapter`: ours). Each
creates a thread, opens its per-thread session (an SSE subscription, where the API has one) and runs one user
message to its end, stamping the times the run was accepted, first showed model output and finished
(`RunTiming`). Another server needs only another `Adapter` subclass.
"""

from __future__ import annotations

import abc
import asyncio
import copy
import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

USER_TEXT = "ping"
# `stream` (B4): the marker fake_llm.py puts in every text chunk, `⟨<time.time() when sent>⟩`, raw or JSON-escaped
MARKER = re.compile(r"(?:\u27e8|\\u27e8)(\d+\.\d+)(?:\u27e9|\\u27e9)")
# wall-clock time of a perf_counter() reading (the event readers stamp with perf_counter)
WALL_OFFSET = time.time() - time.perf_counter()


# --------------------------------------------------------------------------- SSE


async def sse_events(resp: httpx.Response) -> AsyncIterator[tuple[str, str]]:
    """Yield (event, data) from a text/event-stream response; comments are skipped."""
    event, data = "message", list[str]()
    async for line in resp.aiter_lines():
        if line == "":
            if data:
                yield event, "\n".join(data)
            event, data = "message", list[str]()
        elif line.startswith(":"):
            continue
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
    if data:
        yield event, "\n".join(data)


@dataclass
class RunTiming:
    t_ack: float | None = None  # seconds from t0
    t_out: float | None = None
    t_done: float | None = None
    ok: bool = False
    error: str | None = None
    lags: list[float] = field(default_factory=list)  # `stream`: delivery lag (s) of each text chunk, first receipt
    seen: set[str] = field(default_factory=set, repr=False)

    def mark(self, data: str, perf: float) -> None:
        """Record the lag of every chunk marker in a model-output frame not seen before in this run."""
        if "27e8" not in data and "\u27e8" not in data:
            return
        for ts in MARKER.findall(data):
            if ts not in self.seen:
                self.seen.add(ts)
                self.lags.append(perf + WALL_OFFSET - float(ts))


# --------------------------------------------------------------------------- adapters


class Adapter(abc.ABC):
    """What a server must offer the benchmark. Subclass per server API."""

    name = "abstract"

    def __init__(self, client: httpx.AsyncClient, graph: str, path: str) -> None:
        self.c = client
        self.graph = graph
        self.path = path
        self.track_lag = graph == "stream"  # parse chunk markers only where the model puts them

    async def setup(self) -> dict[str, Any]:
        return {}

    def with_client(self, client: httpx.AsyncClient) -> Adapter:
        """The same adapter (setup already done) talking through another HTTP client."""
        other = copy.copy(self)
        other.c = client
        return other

    @abc.abstractmethod
    async def create_thread(self) -> str:
        """A new thread (or the server's equivalent) for one simulated user; its id."""

    async def open_session(self, thread_id: str) -> Any:
        """Per-thread state kept across runs (e.g. an SSE subscription). Not timed."""
        return None

    async def close_session(self, session: Any) -> None:
        """End what `open_session` opened (a subscription's reader task)."""
        if isinstance(session, _Subscription) and session.task is not None:
            session.task.cancel()
            await asyncio.gather(session.task, return_exceptions=True)

    @abc.abstractmethod
    async def run(self, thread_id: str, session: Any, t0: float) -> RunTiming:
        """Start one run (the clock t0 is taken just before) and follow it to its end."""


def _final_is_ai(body: str) -> bool:
    """The wait/join body is the thread's final values: its last message must be the AI reply."""
    try:
        msgs = json.loads(body).get("messages") or []
    except (ValueError, AttributeError):
        return False
    return bool(msgs) and msgs[-1].get("type") == "ai" and bool(msgs[-1].get("content"))


def _is_model_output(event: str, data: str) -> bool:
    """Aegra v1 messages-tuple / messages events: an AI chunk with text or a tool call."""
    if not event.startswith("messages"):
        return False
    try:
        payload = json.loads(data)
    except ValueError:
        return False
    msgs = payload if isinstance(payload, list) else [payload]
    for m in msgs:
        is_ai = isinstance(m, dict) and m.get("type") in ("AIMessageChunk", "ai", "AIMessage")
        if is_ai and (m.get("content") or m.get("tool_calls") or m.get("tool_call_chunks")):
            return True
    return False


class AegraAdapter(Adapter):
    """Aegra / LangGraph Agent Protocol.

    paths:
      stream  POST /threads/{id}/runs/stream      create a run and stream it (one request)
      v2      POST /threads/{id}/stream/events     subscribe first (kept open across runs),
              POST /threads/{id}/commands          then run.start; closest to subscribe+post
      join    POST /threads/{id}/runs  then  GET /threads/{id}/runs/{run_id}/join
      wait    POST /threads/{id}/runs/wait         create a run and block until its output
    """

    name = "aegra"
    STREAM_MODE = ("messages-tuple",)

    async def setup(self) -> dict[str, Any]:
        r = await self.c.post("/assistants/search", json={"graph_id": self.graph, "limit": 10})
        r.raise_for_status()
        found = [a for a in r.json() if a.get("graph_id") == self.graph]
        if not found:
            raise SystemExit(f"no assistant for graph {self.graph!r}: is it in aegra.json?")
        self.assistant_id = found[0]["assistant_id"]
        info = (await self.c.get("/info")).json()
        return {"server": info.get("name"), "server_version": info.get("version"), "assistant_id": self.assistant_id}

    def _run_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "assistant_id": self.assistant_id,
            "input": {"messages": [{"role": "user", "content": USER_TEXT}]},
        }
        if self.path == "stream":
            body["stream_mode"] = list(self.STREAM_MODE)
        # join/wait: no stream_mode. Aegra derives a run's stored output from `values`
        # events, so a run created with stream_mode=["messages-tuple"] returns {}.
        return body

    async def create_thread(self) -> str:
        r = await self.c.post("/threads", json={})
        r.raise_for_status()
        return str(r.json()["thread_id"])

    async def run(self, thread_id: str, session: Any, t0: float) -> RunTiming:
        if self.path == "stream":
            return await self._run_stream(thread_id, t0)
        if self.path == "v2":
            return await self._run_v2(thread_id, session, t0)
        if self.path == "wait":
            return await self._run_wait(thread_id, t0)
        if self.path == "join":
            return await self._run_join(thread_id, t0)
        raise SystemExit(f"unknown aegra path {self.path}")

    async def _run_stream(self, thread_id: str, t0: float) -> RunTiming:
        t = RunTiming()
        async with self.c.stream("POST", f"/threads/{thread_id}/runs/stream", json=self._run_body()) as resp:
            if resp.status_code != 200:
                t.error = f"http {resp.status_code}"
                await resp.aread()
                return t
            async for event, data in sse_events(resp):
                perf = time.perf_counter()
                now = perf - t0
                if t.t_ack is None:
                    t.t_ack = now  # first event is `metadata` {run_id}
                if t.t_out is None and _is_model_output(event, data):
                    t.t_out = now
                if self.track_lag and event.startswith("messages"):  # [AIMessageChunk, metadata] per token
                    t.mark(data, perf)
                if event == "error":
                    t.error = data[:200]
                if event == "end":
                    break
        t.t_done = time.perf_counter() - t0
        t.ok = t.error is None and t.t_out is not None
        if t.t_out is None and t.error is None:
            t.error = "no model output event"
        return t

    async def _run_wait(self, thread_id: str, t0: float) -> RunTiming:
        t = RunTiming()
        r = await self.c.post(f"/threads/{thread_id}/runs/wait", json=self._run_body())
        t.t_done = time.perf_counter() - t0
        body = r.text.strip()
        if r.status_code != 200 or "__error__" in body[:50]:
            t.error = f"http {r.status_code} {body[:200]}"
            return t
        t.ok = _final_is_ai(body)
        t.error = None if t.ok else "no ai message in output"
        return t

    async def _run_join(self, thread_id: str, t0: float) -> RunTiming:
        t = RunTiming()
        r = await self.c.post(f"/threads/{thread_id}/runs", json=self._run_body())
        t.t_ack = time.perf_counter() - t0
        if r.status_code != 200:
            t.error = f"http {r.status_code} {r.text[:200]}"
            return t
        run_id = r.json()["run_id"]
        r = await self.c.get(f"/threads/{thread_id}/runs/{run_id}/join")
        t.t_done = time.perf_counter() - t0
        body = r.text.strip()
        t.ok = r.status_code == 200 and _final_is_ai(body)
        if not t.ok:
            t.error = f"http {r.status_code} {body[:200]}"
        return t

    # --- v2: a thread-scoped SSE subscription held open across runs
    async def open_session(self, thread_id: str) -> Any:
        if self.path != "v2":
            return None
        sub = _Subscription()
        sub.task = asyncio.create_task(self._v2_reader(thread_id, sub))
        await asyncio.wait_for(sub.ready.wait(), 30)
        return sub

    async def _v2_reader(self, thread_id: str, sub: _Subscription) -> None:
        body = {"channels": ["lifecycle", "messages"]}
        async with self.c.stream("POST", f"/threads/{thread_id}/stream/events", json=body) as resp:
            resp.raise_for_status()
            sub.ready.set()
            async for event, data in sse_events(resp):
                sub.queue.put_nowait((time.perf_counter(), event, data))
        sub.queue.put_nowait((time.perf_counter(), "__closed__", ""))

    async def _run_v2(self, thread_id: str, sub: _Subscription, t0: float) -> RunTiming:
        t = RunTiming()
        sub.cmd_id += 1
        cmd = {
            "id": sub.cmd_id,
            "method": "run.start",
            "params": {"assistant_id": self.assistant_id, "input": self._run_body()["input"]},
        }
        r = await self.c.post(f"/threads/{thread_id}/commands", json=cmd)
        t.t_ack = time.perf_counter() - t0
        resp = r.json()
        if resp.get("type") != "success":
            t.error = json.dumps(resp)[:200]
            return t
        run_id = resp["result"]["run_id"]
        deadline = time.perf_counter() + 60
        while True:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                t.error = "timeout waiting for v2 events"
                return t
            ts, event, data = await asyncio.wait_for(sub.queue.get(), remaining)
            if event == "__closed__":
                t.error = "v2 stream closed"
                return t
            try:
                env = json.loads(data)
            except ValueError:
                continue
            params = env.get("params", {})
            d = params.get("data", {}) if isinstance(params, dict) else {}
            if env.get("method") == "messages" and t.t_out is None and _v2_is_output(d):
                t.t_out = ts - t0
            if env.get("method") == "lifecycle" and not params.get("namespace"):
                ev = d.get("event") if isinstance(d, dict) else None
                if ev in ("completed", "failed", "interrupted", "error"):
                    t.t_done = ts - t0
                    t.ok = ev == "completed" and t.t_out is not None
                    if not t.ok:
                        t.error = f"lifecycle {ev} run {run_id} out={t.t_out}"
                    return t


def _v2_is_output(d: Any) -> bool:
    """A v2 `messages` channel event that carries model text or a tool call."""
    s = json.dumps(d)
    return ("content-block-delta" in s or "content-block-finish" in s or "message-finish" in s) and (
        "pong" in s or "tool_call" in s or "lookup" in s
    )


class _Subscription:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[float, str, str]] = asyncio.Queue()
        self.ready = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.cmd_id = 0


class StandardAgentsAdapter(Adapter):
    """Standard Agents runtime (docs/http-api.md; run against the real server by run.sh's `sa` and `sa2` modes).

    thread:  POST /threads {"agent": <agent>}                -> 201 {"id": ...}
    session: GET /threads/{id}/events (SSE), opened once per thread and kept open
    run:     POST /threads/{id}/messages {"content": "ping"} -> 202   (t_ack)
             first `message_chunk`, or `message_data` of an assistant message with
             content or tool_calls                            (t_out)
             `thread_status` {"status": "idle"} after the run started, or `turn_ended` (t_done)
    --graph names the agent (bench agents `chat` / `tool` must be defined with the `test`
    provider, delay 0, same reply text and tool as graph.py).
    """

    name = "standard-agents"

    async def setup(self) -> dict[str, Any]:
        r = await self.c.get("/agents")
        r.raise_for_status()
        return {"server": "standard-agents", "agent": self.graph}

    async def create_thread(self) -> str:
        r = await self.c.post("/threads", json={"agent": self.graph})
        r.raise_for_status()
        return str(r.json()["id"])

    async def open_session(self, thread_id: str) -> Any:
        sub = _Subscription()
        sub.task = asyncio.create_task(self._reader(thread_id, sub))
        await asyncio.wait_for(sub.ready.wait(), 30)
        return sub

    async def _reader(self, thread_id: str, sub: _Subscription) -> None:
        async with self.c.stream("GET", f"/threads/{thread_id}/events", timeout=None) as resp:
            resp.raise_for_status()
            sub.ready.set()
            async for event, data in sse_events(resp):
                sub.queue.put_nowait((time.perf_counter(), event, data))
        sub.queue.put_nowait((time.perf_counter(), "__closed__", ""))

    async def run(self, thread_id: str, session: Any, t0: float) -> RunTiming:
        t = RunTiming()
        r = await self.c.post(f"/threads/{thread_id}/messages", json={"content": USER_TEXT})
        t.t_ack = time.perf_counter() - t0
        if r.status_code != 202:
            t.error = f"http {r.status_code} {r.text[:200]}"
            return t
        started = False
        deadline = time.perf_counter() + 60
        while True:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                t.error = "timeout waiting for events"
                return t
            ts, event, data = await asyncio.wait_for(session.queue.get(), remaining)
            if event == "__closed__":
                t.error = "event stream closed"
                return t
            if ts < t0:
                continue  # left over from the previous run
            if event == "message_chunk" and self.track_lag:  # one or more merged deltas
                t.mark(data, ts)
            if event == "message_chunk" and t.t_out is None:
                t.t_out = ts - t0
            elif event == "message_data" and t.t_out is None:
                msg = json.loads(data).get("data", {})
                if msg.get("role") == "assistant" and (msg.get("content") or msg.get("tool_calls")):
                    t.t_out = ts - t0
            elif event == "thread_status":
                status = json.loads(data).get("status")
                if status in ("queued", "running"):
                    started = True
                elif status == "idle" and started:
                    t.t_done = ts - t0
                    t.ok = t.t_out is not None
                    t.error = None if t.ok else "idle without model output"
                    return t
            elif event == "error":
                t.error = data[:200]
                return t


ADAPTERS = {"aegra": AegraAdapter, "standard-agents": StandardAgentsAdapter}
