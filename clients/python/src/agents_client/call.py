"""A call of the API, described once: the request to make and how to read its answer. `Client` sends it with a
sync httpx client, `AsyncClient` with an async one; the resources build calls and never touch HTTP themselves."""

from __future__ import annotations

import urllib.parse
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import httpx
from pydantic import BaseModel

from agents_client import models

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

ThreadRef = str | uuid.UUID | models.Thread  # a thread, or its id


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str  # below the base URL, already percent-encoded
    read: Callable[[httpx.Response], T]
    params: Mapping[str, str | int | float | bool] = field(default_factory=dict)
    json: Any = None
    content: Any = None  # raw bytes, or an iterable of them (an upload)
    data: Mapping[str, str] | None = None  # multipart fields, with `files`
    files: list[tuple[str, tuple[str, Any, str]]] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout: float | None = None  # the read timeout, when the call waits on purpose (`?wait=`)


class Sender(Protocol):
    def __call__(self, call: Call[T], /) -> T: ...


class AsyncSender(Protocol):
    def __call__(self, call: Call[T], /) -> Awaitable[T]: ...


def thread_id(thread: ThreadRef) -> str:
    return str(thread.id if isinstance(thread, models.Thread) else thread)


def segment(value: str | uuid.UUID) -> str:
    """One path segment, percent-encoded."""
    return urllib.parse.quote(str(value), safe="")


def thread_path(thread: ThreadRef, *rest: str) -> str:
    """`/threads/<id>` and the (already encoded) parts after it."""
    return "/".join([f"/threads/{segment(thread_id(thread))}", *rest])


def query(**values: str | int | float | bool | uuid.UUID | None) -> dict[str, str | int | float | bool]:
    """Query parameters without the ones left at None; booleans as the server reads them."""
    out: dict[str, str | int | float | bool] = {}
    for name, value in values.items():
        if isinstance(value, bool):
            out[name] = "true" if value else "false"
        elif isinstance(value, uuid.UUID):
            out[name] = str(value)
        elif value is not None:
            out[name] = value
    return out


def model(kind: type[M]) -> Callable[[httpx.Response], M]:
    """Read the answer as `kind`."""
    return lambda response: kind.model_validate_json(response.content)


def models_of(kind: type[M]) -> Callable[[httpx.Response], list[M]]:
    """Read the answer as a JSON list of `kind`."""
    return lambda response: [kind.model_validate(item) for item in response.json()]


def nothing(response: httpx.Response) -> None:
    return None


def body(response: httpx.Response) -> bytes:
    return response.content


def anything(response: httpx.Response) -> Any:
    """JSON as Python values; any other answer as its bytes (a custom endpoint may answer either)."""
    if response.headers.get("content-type", "").split(";")[0].strip().endswith("json"):
        return response.json()
    return response.content
