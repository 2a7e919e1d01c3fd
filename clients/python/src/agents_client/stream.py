"""The event streams, followed for good: a dropped connection (reset, cut mid-frame, timed out, ended by the server)
is opened again with `Last-Event-ID` set to the last `seq` yielded, so the server replays exactly what came after.
Every event with a `seq` at or below the last one yielded is dropped, so none is ever yielded twice, whatever a
server or a proxy replays. Live-only events (`message_chunk`) have no `seq` and are never replayed.

A stream gives up (raising the last error) after `retries` connections in a row that yielded nothing; an error
answer other than 502, 503 or 504 is raised at once (a revoked key's 401, a deleted thread's 404)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Generator, Mapping
from types import TracebackType
from typing import Self

import httpx

from agents_client import call, errors, events, models, sse
from agents_client.call import Call, ThreadRef

RETRYABLE = frozenset({502, 503, 504})


class Position:
    """Where a stream is (the last `seq` yielded) and how its reconnects are paced."""

    def __init__(self, since: int | None, retries: int, backoff: float, max_delay: float) -> None:
        self.seq = since
        self.connections = 0  # opened so far
        self._retries = retries
        self._backoff = backoff
        self._max_delay = max_delay
        self._failures = 0  # connections in a row that yielded nothing

    def headers(self) -> dict[str, str]:
        self.connections += 1
        return {} if self.seq is None else {"Last-Event-ID": str(self.seq)}

    def take(self, frame: sse.Frame, table: dict[str, type[events.Payload]]) -> events.Event | None:
        """The frame's event, or None for one already yielded."""
        seq = int(frame.id) if frame.id is not None and frame.id.isdigit() else None
        if seq is not None:
            if self.seq is not None and seq <= self.seq:
                return None
            self.seq = seq
        self._failures = 0
        return events.parse(frame.event, seq, frame.data, table)

    def lost(self, error: errors.AgentsError) -> float:
        """Seconds to wait before the next connection; `error` raised once the retries are spent."""
        self._failures += 1
        if self._failures > self._retries:
            raise error
        return 0.0 if self._failures == 1 else min(self._backoff * 2 ** (self._failures - 2), self._max_delay)


def _refused(response: httpx.Response) -> errors.APIError:
    """An error answer to a stream's request: raised at once unless the server may soon answer again."""
    error = errors.from_response(response.status_code, response.content, response.headers)
    if response.status_code not in RETRYABLE:
        raise error
    return error


def _ended(path: str) -> errors.TransportError:
    return errors.TransportError(f"GET {path}: the server ended the stream")


def follow(
    http: httpx.Client,
    path: str,
    params: Mapping[str, str | int | float | bool],
    position: Position,
    table: dict[str, type[events.Payload]],
    limits: httpx.Timeout,
) -> Generator[events.Event, None, None]:
    while True:
        try:
            with http.stream("GET", path, params=params, headers=position.headers(), timeout=limits) as response:
                if response.status_code != 200:
                    response.read()
                    error: errors.AgentsError = _refused(response)
                else:
                    decoder = sse.Decoder()
                    for line in response.iter_lines():
                        frame = decoder.feed(line)
                        if frame is not None and (event := position.take(frame, table)) is not None:
                            yield event
                    error = _ended(path)
        except httpx.TransportError as exc:
            error = errors.from_transport(exc, "GET", path)
        time.sleep(position.lost(error))


async def afollow(
    http: httpx.AsyncClient,
    path: str,
    params: Mapping[str, str | int | float | bool],
    position: Position,
    table: dict[str, type[events.Payload]],
    limits: httpx.Timeout,
) -> AsyncGenerator[events.Event, None]:
    while True:
        try:
            async with http.stream("GET", path, params=params, headers=position.headers(), timeout=limits) as response:
                if response.status_code != 200:
                    await response.aread()
                    error: errors.AgentsError = _refused(response)
                else:
                    decoder = sse.Decoder()
                    async for line in response.aiter_lines():
                        frame = decoder.feed(line)
                        if frame is not None and (event := position.take(frame, table)) is not None:
                            yield event
                    error = _ended(path)
        except httpx.TransportError as exc:
            error = errors.from_transport(exc, "GET", path)
        await asyncio.sleep(position.lost(error))


class EventStream:
    """An iterator of a stream's events that resumes by itself; close it (or use `with`) to hang up."""

    def __init__(self, iterator: Generator[events.Event, None, None], position: Position) -> None:
        self._iterator = iterator
        self.position = position

    @property
    def last_seq(self) -> int | None:
        """The `seq` of the last stored event yielded: where a later stream resumes (`since=`)."""
        return self.position.seq

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> events.Event:
        return next(self._iterator)

    def close(self) -> None:
        self._iterator.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class AsyncEventStream:
    """An async iterator of a stream's events that resumes by itself; close it (or use `async with`) to hang up."""

    def __init__(self, iterator: AsyncGenerator[events.Event, None], position: Position) -> None:
        self._iterator = iterator
        self.position = position

    @property
    def last_seq(self) -> int | None:
        """The `seq` of the last stored event yielded: where a later stream resumes (`since=`)."""
        return self.position.seq

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> events.Event:
        return await anext(self._iterator)

    async def aclose(self) -> None:
        await self._iterator.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class Options:
    """How streams reconnect and time out, as the client was made."""

    def __init__(self, retries: int, backoff: float, max_delay: float, idle: float) -> None:
        self.retries = retries
        self.backoff = backoff
        self.max_delay = max_delay
        self.timeout = httpx.Timeout(10.0, read=idle)  # the server pings every 15 s: `idle` must be longer

    def position(self, since: int | None) -> Position:
        return Position(since, self.retries, self.backoff, self.max_delay)


def _thread(
    thread: ThreadRef, include_silent: bool, depth: int, reasoning: bool
) -> tuple[str, dict[str, str | int | float | bool]]:
    params = call.query(include_silent=include_silent or None, depth=depth or None, reasoning=reasoning or None)
    return call.thread_path(thread, "events"), params


def _token(thread: ThreadRef | None) -> Call[models.StreamToken]:
    body = {} if thread is None else {"thread_id": call.thread_id(thread)}
    return Call("POST", "/stream-tokens", call.model(models.StreamToken), json=body)


class Events:
    def __init__(self, http: httpx.Client, send: call.Sender, options: Options) -> None:
        self._http = http
        self._send = send
        self._options = options

    def stream(
        self,
        thread: ThreadRef,
        *,
        since: int | None = None,
        include_silent: bool = False,
        depth: int = 0,
        reasoning: bool = False,
    ) -> EventStream:
        """The thread's events after `since` (from its first without), then live ones, resuming after drops."""
        path, params = _thread(thread, include_silent, depth, reasoning)
        position = self._options.position(since)
        iterator = follow(self._http, path, params, position, events.THREAD_EVENTS, self._options.timeout)
        return EventStream(iterator, position)

    def stream_all(self, *, since: int | None = None) -> EventStream:
        """`thread_created`, `thread_updated`, `thread_deleted` of the caller's threads (every thread: admin)."""
        position = self._options.position(since)
        iterator = follow(self._http, "/events", {}, position, events.LIFECYCLE_EVENTS, self._options.timeout)
        return EventStream(iterator, position)

    def token(self, thread: ThreadRef | None = None) -> models.StreamToken:
        """A stream token for a thread's stream (none: `/events`), for a browser's `EventSource`."""
        return self._send(_token(thread))


class AsyncEvents:
    def __init__(self, http: httpx.AsyncClient, send: call.AsyncSender, options: Options) -> None:
        self._http = http
        self._send = send
        self._options = options

    def stream(
        self,
        thread: ThreadRef,
        *,
        since: int | None = None,
        include_silent: bool = False,
        depth: int = 0,
        reasoning: bool = False,
    ) -> AsyncEventStream:
        """The thread's events after `since` (from its first without), then live ones, resuming after drops."""
        path, params = _thread(thread, include_silent, depth, reasoning)
        position = self._options.position(since)
        iterator = afollow(self._http, path, params, position, events.THREAD_EVENTS, self._options.timeout)
        return AsyncEventStream(iterator, position)

    def stream_all(self, *, since: int | None = None) -> AsyncEventStream:
        """`thread_created`, `thread_updated`, `thread_deleted` of the caller's threads (every thread: admin)."""
        position = self._options.position(since)
        iterator = afollow(self._http, "/events", {}, position, events.LIFECYCLE_EVENTS, self._options.timeout)
        return AsyncEventStream(iterator, position)

    async def token(self, thread: ThreadRef | None = None) -> models.StreamToken:
        """A stream token for a thread's stream (none: `/events`), for a browser's `EventSource`."""
        return await self._send(_token(thread))
