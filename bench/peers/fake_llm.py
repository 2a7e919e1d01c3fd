#!/usr/bin/env python3
"""A deterministic OpenAI-compatible Chat Completions server with realistic latency (benchmark B4).

    python3 bench/peers/fake_llm.py --port 8700 [--ttft-ms 300] [--chunks 10] [--interval-ms 80] [--tool-calls 3]

Standard library only (raw asyncio HTTP/1.1, keep-alive), so that it costs little CPU on a box it shares with the
servers under test; it listens on 127.0.0.1 only.

POST /v1/chat/completions (also /chat/completions), `stream` true or false:
* the request offers tools and its last message (system messages aside) is the user's: a tool-call answer,
  `--tool-calls` calls (1 when the request says `parallel_tool_calls: false`) of the tool `--tool-name`, distinct
  ids; a user message `call:<tool>[,<tool>…]` asks for those calls instead (bench/soak.py: subagents, files,
  effects). The arguments are made from each tool's schema (`{"q": "answer"}` for B4's `lookup_slow`). A request
  that does not offer a tool it would call is answered 400 (a misconfigured benchmark fails loudly);
* otherwise (e.g. after the tool results): a text answer of `--chunks` pieces.
Timeline of every answer, from the request's arrival: the first chunk at TTFT, chunk i at TTFT + i x interval, the
closing chunk (`finish_reason`; then `usage` when `stream_options.include_usage`; then `[DONE]`) at
TTFT + chunks x interval. A tool-call answer spreads its tool_calls deltas (OpenAI's format: id, name and an empty
`arguments` first, then argument fragments, by `index`; one delta per call and chunk) over the same slots, so both
kinds of answer take TTFT + chunks x interval. Each text piece is `⟨<wall-clock time it was sent, time.time()>⟩
tok<i> `, so a client can compute each piece's delivery lag. `stream: false` answers everything at
TTFT + chunks x interval.

GET /health, GET /config (the timing, for the client's "ideal" run time), GET /stats (counters).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
import uuid
from typing import Any

CALL = "call:"  # a user message `call:<tool>[,<tool>…] …` asks for these calls instead of the default ones
ARGS = '{"q": "answer"}'
ARG_PIECES = ['{"q": ', '"answer"', "}"]
SAMPLE = {"string": "answer", "integer": 1, "number": 1, "boolean": True, "array": [], "object": {}}


def argument_pieces(function: dict[str, Any]) -> list[str]:
    """A call's arguments, made from the tool's JSON schema (each required property a sample of its type), in three
    fragments as a streaming model sends them; `lookup_slow(q)` gets exactly `{"q": "answer"}`."""
    schema = function.get("parameters") or {}
    properties = schema.get("properties") or {}
    args = {k: SAMPLE.get(str((properties.get(k) or {}).get("type")), "answer") for k in schema.get("required") or []}
    text = json.dumps(args)
    if text == ARGS:
        return ARG_PIECES
    third = max(1, len(text) // 3)
    return [p for p in (text[:third], text[third : 2 * third], text[2 * third :]) if p]


class Fake:
    """The model: its timing, its answers and its counters (`serve` puts it on a socket)."""

    def __init__(
        self,
        ttft_ms: float = 300.0,
        chunks: int = 10,
        interval_ms: float = 80.0,
        tool_calls: int = 3,
        tool_name: str = "lookup_slow",
    ) -> None:
        if chunks < 1 or tool_calls < 1:
            raise ValueError("chunks and tool_calls must be >= 1")
        self.ttft = ttft_ms / 1000
        self.chunks = chunks
        self.interval = interval_ms / 1000
        self.tool_calls = tool_calls
        self.tool_name = tool_name
        self.stats = {
            "requests": 0,
            "streamed": 0,
            "tool_answers": 0,
            "text_answers": 0,
            "tool_calls_sent": 0,
            "parallel_false": 0,
            "errors": 0,
            "disconnects": 0,
            "in_flight": 0,
            "max_in_flight": 0,
        }

    def config(self) -> dict[str, Any]:
        return {
            "ttft_ms": self.ttft * 1000,
            "chunks": self.chunks,
            "interval_ms": self.interval * 1000,
            "tool_calls": self.tool_calls,
            "tool_name": self.tool_name,
            "call_ms": (self.ttft + self.chunks * self.interval) * 1000,  # one answer, request to [DONE]
        }

    # ------------------------------------------------------------------ answers

    def plan(self, body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]] | str:
        """('tool_calls' | 'stop', one delta per slot), or an error message."""
        messages = body.get("messages") or []
        tools = body.get("tools") or []
        # the last message but system ones (our runtime appends the subagent registry after the user's message)
        spoken = [m for m in messages if not (isinstance(m, dict) and m.get("role") == "system")]
        last = spoken[-1] if spoken else {}
        if tools and isinstance(last, dict) and last.get("role") == "user":
            offered = {
                (t.get("function") or {}).get("name"): t.get("function") or {} for t in tools if isinstance(t, dict)
            }
            asked = str(last.get("content") or "")
            if asked.startswith(CALL):  # `call:a,b …`: these tools, once each, in this order
                names = asked[len(CALL) :].split(" ", 1)[0].split(",")
            else:
                names = [self.tool_name] * self.tool_calls
                if body.get("parallel_tool_calls") is False:
                    names = names[:1]
                    self.stats["parallel_false"] += 1
            missing = [n for n in names if n not in offered]
            if missing:
                return f"the fake model calls `{missing[0]}`, which this request does not offer ({list(offered)})"
            k = len(names)
            parts: list[dict[str, Any]] = []
            for i, name in enumerate(names):
                call_id = f"call_{uuid.uuid4().hex[:24]}"
                parts.append(
                    {"index": i, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
                )
                parts += [{"index": i, "function": {"arguments": p}} for p in argument_pieces(offered[name])]
            # spread the deltas over the slots, in order; within a slot, consecutive deltas of one call are joined
            # (OpenAI never sends one call's `index` twice in a chunk; LangChain would split such a call in two)
            slots: list[list[dict[str, Any]]] = [[] for _ in range(self.chunks)]
            for j, part in enumerate(parts):
                slot = slots[min(self.chunks - 1, j * self.chunks // len(parts))]
                if slot and slot[-1]["index"] == part["index"]:
                    slot[-1]["function"]["arguments"] += part["function"]["arguments"]
                else:
                    slot.append(part)
            self.stats["tool_answers"] += 1
            self.stats["tool_calls_sent"] += k
            return "tool_calls", [{"tool_calls": s} if s else {} for s in slots]
        self.stats["text_answers"] += 1
        return "stop", [{"content": None, "i": i} for i in range(self.chunks)]  # text filled in at send time

    @staticmethod
    def text(i: int) -> str:
        return f"⟨{time.time():.4f}⟩ tok{i} "

    async def answer(self, body: dict[str, Any], writer: asyncio.StreamWriter, keep: bool) -> bool:
        t0 = asyncio.get_running_loop().time()
        plan = self.plan(body)
        if isinstance(plan, str):
            self.stats["errors"] += 1
            err = {"error": {"message": plan, "type": "invalid_request_error", "code": None}}
            await respond(writer, 400, "application/json", json.dumps(err).encode(), keep)
            return keep
        finish, deltas = plan
        model = str(body.get("model") or "fake")
        cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        prompt_tokens = sum(len(str(m.get("content") or "")) for m in body.get("messages") or []) // 4 + 1
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": 4 * self.chunks,
            "total_tokens": prompt_tokens + 4 * self.chunks,
        }
        if not body.get("stream"):
            await sleep_until(t0 + self.ttft + self.chunks * self.interval)
            msg: dict[str, Any] = {"role": "assistant", "content": None}
            if finish == "stop":
                msg["content"] = "".join(self.text(d["i"]) for d in deltas)
            else:
                calls: dict[int, dict[str, Any]] = {}
                for d in deltas:
                    for p in d.get("tool_calls", []):
                        fresh = {
                            "id": p.get("id"),
                            "type": "function",
                            "function": {"name": p["function"].get("name"), "arguments": ""},
                        }
                        c = calls.setdefault(p["index"], fresh)
                        c["function"]["arguments"] += p["function"]["arguments"]
                msg["tool_calls"] = [calls[i] for i in sorted(calls)]
            out = {
                "id": cid,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "message": msg, "finish_reason": finish, "logprobs": None}],
                "usage": usage,
            }
            await respond(writer, 200, "application/json", json.dumps(out).encode(), keep)
            return keep
        self.stats["streamed"] += 1
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\n" + (b"" if keep else b"Connection: close\r\n") + b"\r\n"
        )

        def frame(delta: dict[str, Any] | None, fin: str | None = None, use: dict[str, Any] | None = None) -> bytes:
            chunk: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
            chunk["choices"] = (
                [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": fin}]
            )
            if include_usage:
                chunk["usage"] = use
            data = b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n"
            return b"%x\r\n%s\r\n" % (len(data), data)

        for i, d in enumerate(deltas):
            await sleep_until(t0 + self.ttft + i * self.interval)
            if "i" in d:
                d = {"content": self.text(d["i"])}
            if i == 0:
                d = {"role": "assistant", **d}
            writer.write(frame(d))
            await writer.drain()
        await sleep_until(t0 + self.ttft + self.chunks * self.interval)
        tail = frame({}, finish)
        if include_usage:
            tail += frame(None, None, usage)
        done = b"data: [DONE]\n\n"
        writer.write(tail + b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
        await writer.drain()
        return keep

    # ------------------------------------------------------------------ HTTP

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                method, target, version = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
                headers: dict[str, str] = {}
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                body = b""
                if headers.get("transfer-encoding", "").lower() == "chunked":
                    while True:
                        size = int((await reader.readline()).split(b";")[0], 16)
                        if size == 0:
                            await reader.readline()
                            break
                        body += await reader.readexactly(size)
                        await reader.readline()
                elif "content-length" in headers:
                    body = await reader.readexactly(int(headers["content-length"]))
                keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
                path = target.split("?", 1)[0]
                if method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
                    self.stats["requests"] += 1
                    self.stats["in_flight"] += 1
                    self.stats["max_in_flight"] = max(self.stats["max_in_flight"], self.stats["in_flight"])
                    try:
                        keep = await self.answer(json.loads(body), writer, keep)
                    finally:
                        self.stats["in_flight"] -= 1
                elif method == "GET" and path in ("/health", "/config", "/stats"):
                    data = {"/health": {"ok": True}, "/config": self.config(), "/stats": self.stats}[path]
                    await respond(writer, 200, "application/json", json.dumps(data).encode(), keep)
                else:
                    await respond(writer, 404, "application/json", b'{"error": {"message": "not found"}}', keep)
                if not keep:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            self.stats["disconnects"] += 1
        except ValueError:  # a malformed request: answer 400 and close
            self.stats["errors"] += 1
            with contextlib.suppress(ConnectionError):
                await respond(writer, 400, "application/json", b'{"error": {"message": "bad request"}}', False)
        finally:
            writer.close()


async def respond(writer: asyncio.StreamWriter, status: int, ctype: str, body: bytes, keep: bool) -> None:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}[status]
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
    writer.write(head.encode() + (b"" if keep else b"Connection: close\r\n") + b"\r\n" + body)
    await writer.drain()


async def sleep_until(deadline: float) -> None:
    delay = deadline - asyncio.get_running_loop().time()
    if delay > 0:
        await asyncio.sleep(delay)


async def serve(fake: Fake, port: int = 0) -> asyncio.Server:
    """Listen on 127.0.0.1:`port` (0: a free one, `server.sockets[0].getsockname()[1]`); the caller closes it."""
    return await asyncio.start_server(fake.handle, "127.0.0.1", port, backlog=1024)


async def amain(a: argparse.Namespace) -> None:
    fake = Fake(a.ttft_ms, a.chunks, a.interval_ms, a.tool_calls, a.tool_name)
    server = await serve(fake, a.port)
    port = server.sockets[0].getsockname()[1]
    print(f"fake LLM on http://127.0.0.1:{port}/v1 {json.dumps(fake.config())}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: any free one, printed)")
    p.add_argument("--ttft-ms", type=float, default=300.0, help="time to the first chunk")
    p.add_argument("--chunks", type=int, default=10, help="chunks per answer")
    p.add_argument("--interval-ms", type=float, default=80.0, help="time between chunks")
    p.add_argument("--tool-calls", type=int, default=3, help="tool calls in a tool-call answer")
    p.add_argument("--tool-name", default="lookup_slow", help="the tool the fake model calls")
    a = p.parse_args()
    if a.chunks < 1 or a.tool_calls < 1:
        p.error("--chunks and --tool-calls must be >= 1")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(amain(a))


if __name__ == "__main__":
    main()
