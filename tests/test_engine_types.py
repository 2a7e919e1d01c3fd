"""The engine's value types (`app/engine/types.py`): variable resolution and secret masking of `Env`."""

from __future__ import annotations

import pytest

from app import environment
from app.engine import types


def text(value: str) -> environment.Value:
    return environment.Value(value, "text")


def secret(value: str) -> environment.Value:
    return environment.Value(value, "secret")


# -- Env --------------------------------------------------------------------------------------------------


def test_stored_layers_win_over_definitions_in_the_documented_order() -> None:
    layered = types.Env(
        thread={"A": text("thread")},
        agent={"A": "agent", "B": "agent", "C": "agent", "D": "agent"},
        prompt={"A": "prompt", "B": "prompt", "C": "prompt", "D": "prompt", "E": "prompt"},
        user={"A": text("user"), "B": text("user")},
        instance={"A": text("instance"), "B": text("instance"), "C": text("instance")},
    )
    tool_env = {"D": "tool", "E": "tool"}
    assert [layered.get(n, tool_env) for n in "ABCDE"] == ["thread", "user", "instance", "agent", "tool"]
    assert layered.get("E") == "prompt"  # without the tool's config env


def test_an_unset_variable_names_itself() -> None:
    with pytest.raises(types.MissingVariable) as caught:
        types.Env(thread={}, agent={}, prompt={}).get("NOPE")
    assert caught.value.name == "NOPE"
    assert "`NOPE` is not set" in str(caught.value)


def test_a_variable_is_secret_when_stored_so_or_declared_so() -> None:
    layered = types.Env(
        thread={"STORED": secret("s1"), "PLAIN": text("p")},
        agent={"DECLARED": "d"},
        prompt={},
        declared_secret=frozenset({"DECLARED"}),
    )
    assert [layered.is_secret(n) for n in ("STORED", "PLAIN", "DECLARED", "UNKNOWN")] == [True, False, True, False]


def test_secrets_are_the_secret_and_declared_values_longest_first() -> None:
    layered = types.Env(
        thread={"SHORT": secret("abc"), "EMPTY": secret(""), "PLAIN": text("not-a-secret")},
        agent={"FROM_AGENT": "an-undeclared-agent-value"},
        prompt={},
        user={"LONG": secret("abcdef")},
        instance={"DECLARED": text("declared-text")},
        declared_secret=frozenset({"DECLARED"}),
    )
    assert layered.secrets() == ["declared-text", "abcdef", "abc"]


def test_a_declared_secret_is_masked_wherever_its_value_comes_from() -> None:
    layered = types.Env(
        thread={}, agent={"SMTP_PASSWORD": "hunter2"}, prompt={}, declared_secret=frozenset({"SMTP_PASSWORD"})
    )
    assert layered.get("SMTP_PASSWORD") == "hunter2"
    assert "hunter2" in layered.secrets()


def test_mask_replaces_each_secret_whole_inside_data() -> None:
    layered = types.Env(thread={"S": secret("abc"), "T": secret("abcdef")}, agent={}, prompt={})
    assert layered.mask({"key abcdef": ["abc", "xabcdefx", 7]}) == {"key ***": ["***", "x***x", 7]}


def test_mask_without_secrets_returns_the_value_itself() -> None:
    value = {"a": ["b"]}
    assert types.Env(thread={"P": text("b")}, agent={}, prompt={}).mask(value) is value
