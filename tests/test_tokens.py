"""Stream tokens: exact age, scope, and nothing but this server's."""

from __future__ import annotations

import io
import json
import logging

import httpx
import pytest
import uvicorn
from cryptography.fernet import Fernet

from app import errors, jsonlog, tokens
from app.keys import Principal

WHO = Principal(user_id="ivy", admin=False, key_id=None)


def test_a_token_is_refused_as_soon_as_it_is_older_than_its_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    fernet = Fernet(Fernet.generate_key())
    now = 1_000_000.9  # late in a whole second: Fernet's own timestamp says 1_000_000
    monkeypatch.setattr("app.tokens.time.time", lambda: now)
    token = tokens.mint(fernet, WHO, "t1")
    now += 1.9
    assert tokens.read(fernet, token, "t1", 2) == WHO
    now += 0.2  # 2.1 s old: Fernet alone (whole seconds) would still take it
    with pytest.raises(errors.Unauthorized, match="expired"):
        tokens.read(fernet, token, "t1", 2)


def test_a_token_opens_only_its_own_scope_and_only_on_its_server() -> None:
    fernet = Fernet(Fernet.generate_key())
    token = tokens.mint(fernet, WHO, "t1")
    with pytest.raises(errors.Unauthorized, match="another stream"):
        tokens.read(fernet, token, "t2", 60)
    with pytest.raises(errors.Unauthorized, match="not valid"):
        tokens.read(Fernet(Fernet.generate_key()), token, "t1", 60)
    with pytest.raises(errors.Unauthorized, match="not valid"):
        tokens.read(fernet, "x" + token, "t1", 60)


def _logged(line: str, *args: object, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc else None
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, line, args, exc_info)
    assert tokens.Masked().filter(record)
    return record


ACCESS = '%s - "%s %s HTTP/%s" %d'  # uvicorn's access line


def test_every_spelling_the_server_reads_as_a_token_is_masked_in_the_access_log() -> None:
    """The server percent-decodes parameter names (`%74oken=` is `token=`) and takes the last of repeated ones: every
    such value is masked, and so is a token under any other name or encoded in its value."""
    token = tokens.mint(Fernet(Fernet.generate_key()), WHO, "t1")
    other = tokens.mint(Fernet(Fernet.generate_key()), WHO, "t1")
    encoded = "".join(f"%{ord(c):02X}" for c in token[:8]) + token[8:]
    for query, kept in (
        (f"since=3&token={token}&depth=1", "since=3&token=***&depth=1"),
        (f"token={token}", "token=***"),
        (f"a=1&token={token}&token={other}", "a=1&token=***&token=***"),
        (f"%74oken={token}", "%74oken=***"),
        (f"%74%6F%6b%65%6E={token}&x=1", "%74%6F%6b%65%6E=***&x=1"),
        (f"token={encoded}", "token=***"),
        (f"TOKEN={token}", "TOKEN=***"),  # not read as a token, but the value is one all the same
        (f"t={encoded}", "t=***"),
        (f"a=1;token={token}", "a=***"),  # `;` separates nothing: one value, which holds a token
        ("token=short&since=3", "token=***&since=3"),  # the name alone decides
        ("since=3&find=a=b&tokens=1", "since=3&find=a=b&tokens=1"),  # nothing else is touched
    ):
        path = f"/threads/t/events?{query}"
        record = _logged(ACCESS, "127.0.0.1:5", "GET", path, "1.1", 200)
        assert record.getMessage() == f'127.0.0.1:5 - "GET /threads/t/events?{kept} HTTP/1.1" 200', query
        assert (
            isinstance(record.args, tuple) and record.args[4] == 200
        )  # uvicorn's formatter reads the status as a number


def test_a_token_is_masked_wherever_a_log_line_carries_it() -> None:
    """The message itself, an argument of any type, an exception's text and the JSON formatter's output."""
    token = tokens.mint(Fernet(Fernet.generate_key()), WHO, "t1")
    url = f"http://localhost:8000/events?%74oken={token}"
    assert token not in _logged(f"fetched {url}").getMessage()
    assert token not in _logged("fetched %s (%r)", httpx.URL(url), {"u": url}).getMessage()
    assert token not in _logged(f"a path /x/{token}/y").getMessage()
    try:
        raise ValueError(f"could not read {url}")
    except ValueError as exc:
        record = _logged("failed", exc=exc)
    assert record.exc_text is not None and "ValueError: could not read" in record.exc_text
    assert token not in logging.Formatter().format(record)
    line = json.loads(jsonlog.Formatter().format(record))
    assert line["exception"] == record.exc_text and token not in json.dumps(line)


def test_the_filter_goes_on_every_handler_uvicorn_and_the_root_log_with() -> None:
    """Text (uvicorn's own handlers) or JSON (the root's): the access line reaches a handler that masks it."""
    root = logging.getLogger()
    saved = {name: list(logging.getLogger(name).handlers) for name in ("", "uvicorn", "uvicorn.access")}
    filters = {handler: list(handler.filters) for handler in root.handlers}  # pytest's own: left as they were
    stream = io.StringIO()
    mine = logging.StreamHandler(stream)
    mine.setFormatter(jsonlog.Formatter())
    try:
        uvicorn.Config("app:x", log_config=uvicorn.config.LOGGING_CONFIG)  # sets up uvicorn's handlers
        root.addHandler(mine)
        tokens.mask_logs()
        tokens.mask_logs()  # once is enough: no second filter
        for name in ("uvicorn", "uvicorn.access"):
            for handler in logging.getLogger(name).handlers:
                assert [type(f) for f in handler.filters] == [tokens.Masked], name
        assert [type(f) for f in mine.filters] == [tokens.Masked]
        logging.getLogger("elsewhere").error("GET /events?%%74oken=%s", "gAAAAA" + "x" * 60)
        assert "x" * 60 not in stream.getvalue() and "%74oken=***" in stream.getvalue()
    finally:
        root.removeHandler(mine)
        for name, handlers in saved.items():
            logging.getLogger(name).handlers = handlers
        for handler, kept in filters.items():
            handler.filters = kept
