"""User search patterns: RE2 regular expressions and globs, matched in time linear in the text."""

from __future__ import annotations

import random
import time

import pytest

from app import errors, patterns


@pytest.mark.parametrize(
    ("pattern", "matches", "misses"),
    [
        ("*.md", ["/a.md", "/x/y/b.md"], ["/a.txt", "/a.md/c"]),
        ("/reports/*.pdf", ["/reports/q.pdf"], ["/reports/2024/q.pdf", "/other/q.pdf"]),
        ("reports/**/*.pdf", ["/reports/q.pdf", "/reports/2024/q/r.pdf"], ["/reportsx/q.pdf"]),
        ("/a?c", ["/abc", "/aüc"], ["/ac", "/a/c"]),
        ("/src/**", ["/src/a", "/src/a/b.py"], ["/srcs"]),
        ("(x).md", ["/(x).md"], ["/x.md"]),  # regex metacharacters are literal
        ("/a b+{c}|$^\\.md", ["/a b+{c}|$^\\.md"], ["/a bb{c}.md"]),
    ],
)
def test_glob_patterns(pattern: str, matches: list[str], misses: list[str]) -> None:
    regex = patterns.glob(pattern)
    assert [p for p in matches if regex.fullmatch(p)] == matches
    assert [p for p in misses if regex.fullmatch(p)] == []


def test_pathological_patterns_take_linear_time() -> None:
    path = "/" + "a" * 250 + "/" + "a" * 148  # 400 characters: 101 s with `**` as a backtracking `.*`
    started = time.monotonic()
    assert patterns.glob("/**b**b**b**b**bZ").fullmatch(path) is None
    assert patterns.regex("(a+)+$").search("a" * 25 + "!") is None  # 8 s with a backtracking engine
    assert patterns.lines(patterns.regex("(a+)+$"), ("a" * 5000 + "!\n").encode() * 100, time.monotonic() + 5) == []
    assert time.monotonic() - started < 0.5


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?=a)b", r"(?<!a)b", r"(?P<x>a)(?P=x)"])
def test_backreferences_and_lookaround_are_refused_by_name(pattern: str) -> None:
    with pytest.raises(errors.UnsupportedPattern, match="backreferences"):
        patterns.regex(pattern)


def test_bad_and_overlong_patterns() -> None:
    with pytest.raises(errors.Invalid, match="Not a valid regular expression"):
        patterns.regex("(unclosed")
    for compile_ in (patterns.regex, patterns.glob):
        with pytest.raises(errors.PatternTooLong, match="1000"):
            compile_("a" * 1001)
        with pytest.raises(errors.Invalid):
            compile_("")


def test_lines_of_text_and_the_time_budget() -> None:
    regex = patterns.regex(r"TODO\b")
    text = "TODO: ünï\r\nnot todo\nTODOS\n  TODO\n".encode()
    assert patterns.lines(regex, text, time.monotonic() + 5) == [(1, "TODO: ünï"), (4, "  TODO")]
    assert patterns.lines(regex, text, time.monotonic() + 5, limit=1) == [(1, "TODO: ünï")]
    assert patterns.lines(regex, b"TODO\x00binary", time.monotonic() + 5) == []
    assert patterns.lines(regex, "TODO café".encode("latin-1"), time.monotonic() + 5) == []
    with pytest.raises(errors.SearchTimeout):
        patterns.lines(regex, b"x\n" * 10, time.monotonic() - 1)


def test_a_long_line_is_searched_in_bounded_time() -> None:
    """A pattern too big for RE2's fast engine costs microseconds a character; the deadline is checked per line,
    so a line is searched in its first `MAX_SEARCHED` characters (a 2 MB line took ~13 s here before)."""
    slow = patterns.regex("[ab]*a[ab]{999}c")
    line = random.Random(1).randbytes(2_000_000).translate(bytes(b"ab"[i % 2] for i in range(256)))  # a and b at random
    data = line + b"\nac\n"
    started = time.monotonic()
    assert patterns.lines(slow, data, time.monotonic() + 60) == []
    assert time.monotonic() - started < 3
    assert patterns.lines(patterns.regex("b{3}"), b"a" * 70_000 + b"bbb\nxbbb\n", time.monotonic() + 60) == [
        (2, "xbbb")
    ]
