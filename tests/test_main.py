"""The command line's parser: every option says what it does, `--version`, and the README's command lines parse."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterator

import pytest

from app import __main__, __version__
from tests.conftest import ROOT
from tests.test_readme import snippets


def _parsers(parser: argparse.ArgumentParser, path: str = "agents") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_option_and_argument_has_help() -> None:
    walked = list(_parsers(__main__.parser()))
    assert len(walked) > 15  # the walk reaches the nested commands (`keys create`, `env set`)
    bare = [
        f"{path}: {'/'.join(action.option_strings) or action.dest}"
        for path, parser in walked
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction) and not action.help
    ]
    assert bare == []


def test_version_prints_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        __main__.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"agents {__version__}\n"


def command_lines() -> list[str]:
    """Every `agents …` command of the README's shell blocks, as pasted (comments and `KEY=$(…)` around it too)."""
    found = []
    for blocks in snippets((ROOT / "README.md").read_text()).values():
        for block in blocks:
            found += [line for line in block.splitlines() if "bin/agents " in line or line.startswith("agents ")]
    return found


def _argv(line: str) -> list[str]:
    """The arguments after `agents` on a pasted line: `$(…)` around it, a comment after it."""
    words = shlex.split(line.split("$(", 1)[-1].replace(")", " "), comments=True)
    start = next(i for i, word in enumerate(words) if word == "agents" or word.endswith("/agents"))
    after = words[start + 1 :]
    return after[: next((i for i, word in enumerate(after) if word in ("&&", "|", ";")), len(after))]


def test_the_readme_command_lines_parse() -> None:
    lines = command_lines()
    assert any(" env set " in line for line in lines) and any(" keys create " in line for line in lines)
    for line in lines:
        argv = _argv(line)
        assert not any(word.startswith(("[", "<")) for word in argv), f"a placeholder in: {line}"
        try:
            __main__.parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"the README's `{line}` does not parse")
