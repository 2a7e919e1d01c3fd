"""What a call can raise: the server's error envelope as an `APIError` (a subclass per status family), or a
`TransportError` when no answer came (refused, reset, timed out)."""

from __future__ import annotations

import json
from typing import Any

import httpx


class AgentsError(Exception):
    """Everything this client raises."""


class TransportError(AgentsError):
    """No HTTP answer: the connection was refused, dropped or timed out (`__cause__` is httpx's error)."""


class Timeout(TransportError):
    """The server did not answer within the client's timeout."""


class APIError(AgentsError):
    """An error answer: the envelope's `code` (stable), `message` (for people) and `details`, with the status."""

    def __init__(
        self, status: int, code: str, message: str, details: dict[str, Any] | None, headers: httpx.Headers
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}
        self.headers = headers


class BadRequest(APIError):
    """400: `bad_request`, `bad_path`, `missing_variables`, ..."""


class Unauthorized(APIError):
    """401: no key, or an unknown or revoked one."""


class Forbidden(APIError):
    """403: `forbidden`, `host_not_allowed`, `cross_origin_refused`."""


class NotFound(APIError):
    """404: `thread_not_found`, `message_not_found`, `file_not_found`, ..."""


class Conflict(APIError):
    """409: `thread_terminated`, `message_busy`, `already_used`, ..."""


class TooLarge(APIError):
    """413: `too_large`, `too_many_variables`, `variable_too_large`."""


class Invalid(APIError):
    """422: `invalid_request` (`details.problems`), `missing_variables`, ..."""


class ServerError(APIError):
    """5xx: `internal_error`, `endpoint_error`, `busy`, `database_unavailable`, ..."""


BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: TooLarge,
    422: Invalid,
}


def from_response(status: int, body: bytes, headers: httpx.Headers) -> APIError:
    """The error an answer of `status` stands for; a body that is no envelope (a proxy's page) is `http_<status>`."""
    kind = BY_STATUS.get(status, ServerError if status >= 500 else APIError)
    try:
        envelope = json.loads(body)["error"]
        return kind(status, str(envelope["code"]), str(envelope["message"]), envelope.get("details"), headers)
    except (ValueError, TypeError, KeyError):
        text = body[:500].decode("utf-8", "replace").strip()
        return kind(status, f"http_{status}", text or httpx.codes.get_reason_phrase(status), None, headers)


def from_transport(error: httpx.TransportError, method: str, url: str) -> TransportError:
    kind = Timeout if isinstance(error, httpx.TimeoutException) else TransportError
    return kind(f"{method} {url}: {type(error).__name__}: {error}")
