"""The domain error tree: no HTTP here; `api/errors.py` maps classes to statuses.

Each class's docstring is its default message; `code` is the machine-readable name clients see. `problems` is how
every message that reports pydantic's validation errors spells them.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping
from typing import Any, ClassVar


class AgentsError(Exception):
    """Something went wrong."""

    code: ClassVar[str] = "error"

    def __init__(self, message: str | None = None, **details: Any) -> None:
        self.message = message or (self.__doc__ or self.code).strip()
        self.details = details
        super().__init__(self.message)


class NotFound(AgentsError):
    """Not found."""

    code = "not_found"


class ThreadNotFound(NotFound):
    """Thread not found."""

    code = "thread_not_found"


class MessageNotFound(NotFound):
    """Message not found."""

    code = "message_not_found"


class LogNotFound(NotFound):
    """Log not found."""

    code = "log_not_found"


class AgentNotFound(NotFound):
    """Agent not found."""

    code = "agent_not_found"


class Invalid(AgentsError):
    """The request is not valid."""

    code = "invalid_request"


class BadVariableName(Invalid):
    """That is not a variable name."""

    code = "invalid_variable_name"


class BadNumber(Invalid):
    """A number JSON cannot carry: `NaN`, an infinity, or one beyond a double's range (RFC 8259 §6)."""


class BadCursor(Invalid):
    """The cursor is not one this server gave out."""

    code = "bad_cursor"


class BadText(Invalid):
    """Text must be valid Unicode: the body holds an unpaired surrogate (such as `\\ud800`)."""

    code = "invalid_text"


class MissingVariables(AgentsError):
    """Required variables are missing."""

    code = "missing_variables"


class Conflict(AgentsError):
    """The request conflicts with the current state."""

    code = "conflict"


class NoSuchSide(Conflict):
    """The thread's agent has no such side (a well-formed request this thread cannot take)."""

    code = "no_such_side"


class ThreadTerminated(Conflict):
    """Thread is terminated"""

    code = "thread_terminated"


class MessageBusy(Conflict):
    """The thread's execution is still writing or using this message (an answer being written, input waiting in the
    inbox, or a step whose tool calls are still open): try again once the step has finished."""

    code = "message_busy"


class ToolResultAlone(Conflict):
    """A tool result goes with the call that asked for it: delete the assistant message that made the call (its
    results go with it)."""

    code = "tool_result_alone"


class OutsideExecution(Conflict):
    """Only allowed inside the thread's own execution: elsewhere it would race the running step."""

    code = "outside_execution"


class Unauthorized(AgentsError):
    """A valid API key is required: send `Authorization: Bearer <key>`."""

    code = "unauthorized"


class Forbidden(AgentsError):
    """This needs an admin key."""

    code = "forbidden"


class HostNotAllowed(Forbidden):
    """Open mode serves requests addressed to this machine only."""

    code = "host_not_allowed"


class CrossOriginRefused(Forbidden):
    """Open mode acts only for pages of the server's own origin or one in `CORS_ORIGINS`."""

    code = "cross_origin_refused"


class NotReady(AgentsError):
    """The service is not ready."""

    code = "not_ready"


class Busy(NotReady):
    """Too many of these are under way; try again shortly."""

    code = "busy"


class SchemaBehind(NotReady):
    """The database is at an older migration than this release needs: run `agents migrate`."""

    code = "schema_behind"


class SchemaUnknown(NotReady):
    """The database was migrated by a newer release whose schema this release does not run on."""

    code = "schema_unknown"


class StillMissing(MissingVariables):
    """Required variables are still missing."""


class VariableRequestNotFound(NotFound):
    """No such variable request for this thread."""

    code = "variable_request_not_found"


class RequestUsed(Conflict):
    """The request was already used."""

    code = "already_used"


class ConfigError(AgentsError):
    """The server configuration is not usable."""

    code = "config_error"


class BadPath(Invalid):
    """The path is not valid."""

    code = "bad_path"


class FileNotFound(NotFound):
    """No such file or directory."""

    code = "file_not_found"


class FileConflict(Conflict):
    """The path is in the way: a file where a directory is needed, or the reverse, or a directory not empty."""

    code = "file_conflict"


class NotAnImage(AgentsError):
    """The file is not an image that can be read."""

    code = "not_an_image"


class ImageTooLarge(NotAnImage):
    """The image has too many pixels to decode for a thumbnail."""

    code = "image_too_large"


class PatternTooLong(Invalid):
    """The search pattern is too long."""

    code = "pattern_too_long"


class UnsupportedPattern(Invalid):
    """The regular expression needs backreferences or lookaround, which linear-time matching does not have."""

    code = "unsupported_pattern"


class SearchTimeout(AgentsError):
    """The search did not finish in its time budget: narrow the pattern, or search fewer files."""

    code = "search_timeout"


class BadMultipart(Invalid):
    """The multipart body is malformed or ends before its closing boundary."""

    code = "malformed_multipart"


class TooLarge(AgentsError):
    """The content exceeds the size limit."""

    code = "too_large"


class TooManyVariables(TooLarge):
    """More variables than one thread, user or the instance may hold."""

    code = "too_many_variables"


class VariableTooLarge(TooLarge):
    """A variable's value is larger than the limit."""

    code = "variable_too_large"


class EndpointNotFound(NotFound):
    """No custom endpoint of this thread answers this path."""

    code = "endpoint_not_found"


class EndpointFailed(AgentsError):
    """A custom endpoint failed; the error has been logged."""

    code = "endpoint_error"


class EffectNotFound(NotFound):
    """Effect not found."""

    code = "effect_not_found"


class UnknownEffect(Invalid):
    """No effect of that name is defined."""

    code = "unknown_effect"


class EffectNotCancellable(Conflict):
    """The effect already ran, is running, or failed: only a scheduled or queued effect can be cancelled."""

    code = "effect_not_cancellable"


class Aborted(BaseException):
    """This execution must stop now and write nothing more; what it did not commit is redone from what is stored.

    Not part of the error tree above, and a `BaseException` like `asyncio.CancelledError`: an `except Exception`
    around user code (a tool, a hook, an effect) cannot swallow it into a tool result or a failed effect.
    """

    code: ClassVar[str] = "aborted"

    def __init__(self, message: str | None = None) -> None:
        self.message = message or (self.__doc__ or self.code).strip().splitlines()[0]
        super().__init__(self.message)


class LeaseLost(Aborted):
    """This execution no longer holds the thread's lease; it must stop without writing."""

    code = "lease_lost"


class Contention(Aborted):
    """The database broke a lock cycle (a deadlock) or a serialization conflict; try again."""

    code = "contention"

    @staticmethod
    def of(exc: BaseException) -> bool:
        """Whether a driver error is one (SQLSTATE 40P01 deadlock, 40001 serialization failure)."""
        code = getattr(getattr(exc, "orig", None), "pgcode", None) or getattr(
            getattr(exc, "orig", None), "sqlstate", None
        )
        return code in ("40P01", "40001")


class Unavailable(Aborted):
    """The database could not be reached; the execution is handed back and redone when it is up again."""

    code = "database_unavailable"

    @staticmethod
    def of(exc: BaseException) -> bool:
        """Whether a driver error means the database cannot be reached: no connection (refused, reset, closed), a
        connection the pool found dead, or the server shutting down or starting (SQLSTATE classes 08 and 57P)."""
        if isinstance(exc, OSError):
            return True
        if getattr(exc, "connection_invalidated", False):
            return True
        orig = getattr(exc, "orig", None)
        if isinstance(orig, OSError) or isinstance(getattr(orig, "__cause__", None), OSError):
            return True
        code = str(getattr(orig, "pgcode", None) or getattr(orig, "sqlstate", None) or "")
        return code.startswith(("08", "57P"))


def field(loc: Iterable[int | str], *, skip: Container[int | str] = ()) -> str:
    """Where a pydantic error is, as a dotted path (`items.0.name`), without the parts in `skip`."""
    return ".".join(str(part) for part in loc if part not in skip)


def problems(
    found: Iterable[Mapping[str, Any]],
    *,
    whole: str = "",
    skip: Container[int | str] = (),
    spell: Callable[[str], str] = str,
) -> str:
    """Pydantic's errors on one line: `field: message` each, `; `-joined; `whole` names the value itself (an error
    with no field), `spell` writes a field's name."""
    return "; ".join(f"{spell(field(e['loc'], skip=skip) or whole)}: {e['msg']}" for e in found)
