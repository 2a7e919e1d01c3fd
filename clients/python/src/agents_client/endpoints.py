"""Custom thread endpoints: the deployment's own routes under `/threads/{id}/<path>` (`agents/endpoints/`)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any

from agents_client import call as calls
from agents_client.call import Call, ThreadRef


def _call(
    thread: ThreadRef,
    path: str,
    method: str,
    params: Mapping[str, str | int | float | bool] | None,
    json: Any,
    content: bytes | None,
    headers: Mapping[str, str] | None,
) -> Call[Any]:
    inner = urllib.parse.quote(path.strip("/"), safe="/")
    return Call(
        method.upper(),
        calls.thread_path(thread, inner),
        calls.anything,
        params=dict(params or {}),
        json=json,
        content=content,
        headers=dict(headers or {}),
    )


class Endpoints:
    def __init__(self, send: calls.Sender) -> None:
        self._send = send

    def call(
        self,
        thread: ThreadRef,
        path: str,
        *,
        method: str = "GET",
        params: Mapping[str, str | int | float | bool] | None = None,
        json: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """Call `method /threads/<thread>/<path>`: its JSON as Python values, any other answer as bytes."""
        return self._send(_call(thread, path, method, params, json, content, headers))


class AsyncEndpoints:
    def __init__(self, send: calls.AsyncSender) -> None:
        self._send = send

    async def call(
        self,
        thread: ThreadRef,
        path: str,
        *,
        method: str = "GET",
        params: Mapping[str, str | int | float | bool] | None = None,
        json: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """Call `method /threads/<thread>/<path>`: its JSON as Python values, any other answer as bytes."""
        return await self._send(_call(thread, path, method, params, json, content, headers))
