"""A client for the Standard Agents runtime's HTTP API: `Client` (sync) and `AsyncClient`, typed answers
(`agents_client.models`), typed events (`agents_client.events`) on streams that resume by themselves, and errors
carrying the server's `code` (`agents_client.errors`)."""

from agents_client.client import AsyncClient, Client
from agents_client.errors import (
    AgentsError,
    APIError,
    BadRequest,
    Conflict,
    Forbidden,
    Invalid,
    NotFound,
    ServerError,
    Timeout,
    TooLarge,
    TransportError,
    Unauthorized,
)
from agents_client.events import Event
from agents_client.stream import AsyncEventStream, EventStream
from agents_client.version import VERSION as __version__

__all__ = [
    "APIError",
    "AgentsError",
    "AsyncClient",
    "AsyncEventStream",
    "BadRequest",
    "Client",
    "Conflict",
    "Event",
    "EventStream",
    "Forbidden",
    "Invalid",
    "NotFound",
    "ServerError",
    "Timeout",
    "TooLarge",
    "TransportError",
    "Unauthorized",
    "__version__",
]
