"""Search patterns users give (`grep`, `find`): RE2 regular expressions and globs translated to RE2.

RE2 (https://github.com/google/re2) matches in time linear in the text, whatever the pattern: no backtracking, so
`(a+)+$` or `**b**b**b` cannot stall a search. It has no backreferences or lookaround; such patterns are refused by
name. The callers run matching on a thread, against a deadline, so no search holds the event loop.
"""

from __future__ import annotations

import re
import time
import warnings
from collections.abc import Sequence
from typing import TypeAlias

import re2

from app import errors

MAX_LENGTH = 1000  # characters in a pattern
MAX_LINE = 1000  # characters of a matching line returned
MAX_SEARCHED = 64 * 1024  # characters of a line searched: RE2 is linear, but a pattern too big for its fast
# engine falls back to one that costs ~6 µs a character (`[ab]*a[ab]{999}c`), and the deadline is checked per line

Regex: TypeAlias = "re2._Regexp[str]"  # the compiled pattern (not subscriptable at run time)

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is the caller's error, not the server's log


def _checked(pattern: object, what: str) -> str:
    if not isinstance(pattern, str) or not pattern:
        raise errors.Invalid(f"Give {what} of 1 to {MAX_LENGTH} characters.")
    if len(pattern) > MAX_LENGTH:
        raise errors.PatternTooLong(
            f"The pattern is {len(pattern)} characters long; the limit is {MAX_LENGTH}.", limit=MAX_LENGTH
        )
    return pattern


def regex(pattern: object) -> Regex:
    """`pattern` compiled by RE2; `Invalid` if it is not a regular expression, `UnsupportedPattern` if it needs a
    backtracking engine."""
    text = _checked(pattern, "a regular expression")
    try:
        return re2.compile(text, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
    try:  # valid for Python's engine: a feature RE2 leaves out, which the message names
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            re.compile(text)
    except re.error as exc:
        raise errors.Invalid(f"Not a valid regular expression: {exc}.") from None
    raise errors.UnsupportedPattern(
        f"This regular expression cannot be matched in linear time ({reason}): backreferences, lookaround and "
        "repetitions over 1000 are not supported.",
        reason=reason,
    )


def glob(pattern: object) -> Regex:
    """A glob as a regex over paths: `*` and `?` stay within a segment, `**` crosses them; a pattern without `/`
    matches file names anywhere (like `find -name`)."""
    text = _checked(pattern, "a glob pattern, such as **/*.md,")
    if "/" not in text:
        text = "/**/" + text
    elif not text.startswith("/"):
        text = "/" + text
    out, i = [], 0
    while i < len(text):
        if text.startswith("/**/", i):
            out.append("(?:/.*)?/")
            i += 4
        elif text.startswith("**", i):
            out.append(".*")
            i += 2
        elif text[i] in "*?":
            out.append("[^/]*" if text[i] == "*" else "[^/]")
            i += 1
        else:
            out.append(re2.escape(text[i]))
            i += 1
    return re2.compile("".join(out), _OPTIONS)


def _in_time(deadline: float) -> None:
    if time.monotonic() > deadline:
        raise errors.SearchTimeout()


def lines(regex: Regex, data: bytes, deadline: float, limit: int = 1000) -> list[tuple[int, str]]:
    """The (1-based number, text) of up to `limit` lines of `data` that `regex` finds a match in (within a line's
    first `MAX_SEARCHED` characters); none if `data` is not UTF-8 text. `SearchTimeout` past `deadline`
    (`time.monotonic()`)."""
    if b"\x00" in data:
        return []  # binary
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return []
    found: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        _in_time(deadline)
        if regex.search(line[:MAX_SEARCHED]):
            found.append((number, line[:MAX_LINE]))
            if len(found) >= limit:
                break
    return found


def fullmatches(regex: Regex, texts: Sequence[str], deadline: float) -> list[str]:
    """The texts `regex` matches whole, in order; `SearchTimeout` past `deadline`."""
    found = []
    for text in texts:
        _in_time(deadline)
        if regex.fullmatch(text):
            found.append(text)
    return found
