"""Stream tokens: short-lived and signed, so a browser's `EventSource` (which cannot send `Authorization`) can put
one in the URL. A token names one user, the key it was minted with, and one stream: a thread's, or `/events`."""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.parse
import uuid

from cryptography.fernet import Fernet, InvalidToken

from app import errors
from app.keys import Principal

EVENTS = "events"  # the scope of a token for `/events`; a thread's token is scoped to its id
# a query parameter, wherever a URL starts in a line: its name (no `?`, so a path before it is not part of it) and value
PARAMETER = re.compile(r"(?<![^?&\s\"'])([^=&#?\s\"']*)=([^&#\s\"']*)")
SHAPE = re.compile(r"gAAAAA[A-Za-z0-9_-]{40,}")  # a Fernet token: version 0x80, then its timestamp's leading zeros
_FORMATTER = logging.Formatter()


def mint(fernet: Fernet, who: Principal, scope: str) -> str:
    """A token for `who` on the stream `scope` (Fernet: signed, timestamped, URL-safe)."""
    # Fernet's own timestamp is in whole seconds: "t" makes the age exact (a 2 s token must not open a stream at 2.9 s)
    claims = {
        "u": who.user_id,
        "a": who.admin,
        "k": str(who.key_id) if who.key_id else None,
        "s": scope,
        "t": time.time(),
    }
    return fernet.encrypt(json.dumps(claims).encode()).decode()


def read(fernet: Fernet, token: str, scope: str, seconds: float) -> Principal:
    """The caller a token names, if it is this server's, younger than `seconds` and for `scope`; `Unauthorized`
    otherwise (the key it was minted with is checked by the caller)."""
    try:
        claims = json.loads(fernet.decrypt(token.encode(), ttl=int(seconds) + 1))
        young = time.time() - float(claims["t"]) <= seconds
    except (InvalidToken, ValueError, UnicodeError, KeyError, TypeError):
        young = False
    if not young:
        raise errors.Unauthorized("The stream token is not valid or has expired: mint a new one.")
    if claims.get("s") != scope:
        raise errors.Unauthorized("This stream token is for another stream.")
    key = claims.get("k")
    return Principal(user_id=str(claims["u"]), admin=bool(claims.get("a")), key_id=uuid.UUID(key) if key else None)


def masked(text: str) -> str:
    """`text` with the value of every URL query parameter that may hold a stream token replaced by `***`: each the
    server reads as `token` (its name percent-decoded, as the server decodes it: `%74oken=` is `token=`, wherever it
    stands and however often), and each whose value, percent-decoded, holds a token, whatever its name (`TOKEN=`, a
    token pasted under another name: the server would take it under the right one); and any token itself."""
    if "=" in text:
        text = PARAMETER.sub(_mask, text)
    return SHAPE.sub("***", text) if "gAAAAA" in text else text  # and a token anywhere else: a path, a quote


def _mask(match: re.Match[str]) -> str:
    name, value = match.group(1), match.group(2)
    if urllib.parse.unquote_plus(name) == "token" or SHAPE.search(urllib.parse.unquote_plus(value)):
        return f"{name}=***"
    return match.group(0)


def _masked_arg(arg: object) -> object:
    """A log argument without tokens; unchanged (type and all) unless its text held one."""
    if arg is None or isinstance(arg, int | float):
        return arg
    text = arg if isinstance(arg, str) else str(arg)
    clean = masked(text)
    return arg if clean == text else clean


class Masked(logging.Filter):
    """Masks stream tokens in whatever a log line says (its message, arguments, exception and stack): uvicorn's
    access log prints the whole query, an error may quote a URL, and a token read from a log would open its stream
    for as long as it is young. Put on the handlers, so every logger's lines pass it, in text or JSON."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = masked(record.msg)
        if isinstance(record.args, tuple):  # the access log's formatter reads its arguments by position: keep them
            record.args = tuple(_masked_arg(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: _masked_arg(v) for k, v in record.args.items()}
        if record.exc_info and not record.exc_text:  # formatters use the text when it is there
            record.exc_text = _FORMATTER.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = masked(record.exc_text)
        if record.stack_info:
            record.stack_info = masked(record.stack_info)
        return True


def mask_logs() -> None:
    """Put `Masked` on every handler logging has now (the root's, and uvicorn's once its `Config` set them up)."""
    loggers = [
        logging.getLogger(),
        *(v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger)),
    ]
    for handler in {h for logger in loggers for h in logger.handlers}:
        if not any(isinstance(f, Masked) for f in handler.filters):
            handler.addFilter(Masked())
