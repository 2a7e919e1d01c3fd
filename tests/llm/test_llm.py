"""`app.llm`: which variable each provider's models read their key from and which they need, and the start-up
warning for models whose key is unset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app import llm
from app.catalog import Catalog
from app.spec import define_agent, define_model, define_prompt


@pytest.mark.parametrize(
    ("fields", "variable"),
    [
        ({"provider": "openai"}, "OPENAI_API_KEY"),
        ({"provider": "openai", "api_key_env": "TEAM_KEY"}, "TEAM_KEY"),
        ({"provider": "openai", "base_url": "https://openrouter.ai/api/v1"}, "OPENAI_API_KEY"),
        ({"provider": "openai", "base_url": "http://localhost:11434/v1"}, None),  # Ollama: no key
        ({"provider": "openai", "base_url": "http://localhost:8001/v1", "api_key_env": "VLLM_KEY"}, None),
        ({"provider": "anthropic"}, "ANTHROPIC_API_KEY"),
        ({"provider": "anthropic", "api_key_env": "CLAUDE_KEY"}, "CLAUDE_KEY"),
        ({"provider": "test", "script": ["hi"]}, None),
    ],
)
def test_the_variable_a_model_cannot_be_called_without(fields: dict[str, Any], variable: str | None) -> None:
    real = {} if fields["provider"] == "test" else {"model": "some-model"}
    assert llm.REQUIRED_KEYS[fields["provider"]](define_model(name="m", **real, **fields)) == variable


@pytest.mark.parametrize(
    ("fields", "variable"),
    [
        ({"provider": "openai"}, "OPENAI_API_KEY"),
        ({"provider": "openai", "base_url": "http://localhost:11434/v1"}, "OPENAI_API_KEY"),  # sent if it is set
        ({"provider": "openai", "base_url": "http://localhost:8001/v1", "api_key_env": "VLLM_KEY"}, "VLLM_KEY"),
        ({"provider": "anthropic"}, "ANTHROPIC_API_KEY"),
        ({"provider": "anthropic", "api_key_env": "CLAUDE_KEY"}, "CLAUDE_KEY"),
        ({"provider": "test", "script": ["hi"]}, None),
        ({"provider": "test", "script": ["hi"], "api_key_env": "TEST_KEY"}, "TEST_KEY"),
    ],
)
def test_the_variable_a_model_reads_its_key_from(fields: dict[str, Any], variable: str | None) -> None:
    real = {} if fields["provider"] == "test" else {"model": "some-model"}
    assert llm.KEY_VARIABLES[fields["provider"]](define_model(name="m", **real, **fields)) == variable


def catalog(agent_env: dict[str, str] | None = None) -> Catalog:
    models = {
        "gpt": define_model(name="gpt", provider="openai", model="gpt-4.1-mini"),
        "claude": define_model(name="claude", provider="anthropic", model="claude-sonnet-4-5", api_key_env="CLAUDE"),
        "local": define_model(name="local", provider="openai", model="qwen", base_url="http://localhost:11434/v1"),
        "offline": define_model(name="offline", provider="test", script=["hi"]),
    }
    prompt = define_prompt(name="p", tool_description="t", model="gpt", prompt="Be brief.")
    agent = define_agent(name="a", side_a={"prompt": "p"}, env=agent_env or {})
    return Catalog(root=Path(), models=models, prompts={"p": prompt}, agents={"a": agent}, tools={})


def test_a_warning_names_each_model_whose_key_is_set_nowhere() -> None:
    assert llm.missing_keys(catalog(), set()) == [
        "model `claude` (anthropic) needs an API key in `CLAUDE`, which is not set: its calls will fail until it is "
        "set in the environment or as an instance variable (a user's or a thread's variables may set it for their "
        "threads)",
        "model `gpt` (openai) needs an API key in `OPENAI_API_KEY`, which is not set: its calls will fail until it "
        "is set in the environment or as an instance variable (a user's or a thread's variables may set it for "
        "their threads)",
    ]
    assert [w.split()[1] for w in llm.missing_keys(catalog(), {"OPENAI_API_KEY"})] == ["`claude`"]
    assert llm.missing_keys(catalog({"CLAUDE": "sk-ant-in-code"}), {"OPENAI_API_KEY"}) == []  # an agent's `env`
