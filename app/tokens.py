"""Stream tokens: short-lived and signed, so a browser's `EventSource` (which cannot send `Authorization`) can put
one in the URL. A token names one user, the key it was minted with, and one stream: a thread's, or `/events`."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid

from cryptography.fernet import Fernet, InvalidToken

from app import errors
from app.keys import Principal

EVENTS = "events"  # the scope of a token for `/events`; a thread's token is scoped to its id
IN_URL = re.compile(r"([?&]token=)[^&#\s]*")


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


class Masked(logging.Filter):
    """Masks the stream token in a logged URL: uvicorn's access log prints the whole query, and a token read from
    the log would open its stream for as long as it is young."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(IN_URL.sub(r"\1***", a) if isinstance(a, str) else a for a in record.args)
        return True
