"""LLM providers behind one `Model` contract, and models that wrap any of them (`retry`, `recovery`); the engine
never branches on the provider."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Protocol

import httpx

from app.llm import anthropic, openai, test
from app.llm.anthropic import AnthropicModel
from app.llm.base import Model
from app.llm.openai import OpenAIModel
from app.llm.test import TestModel
from app.spec.definitions import AgentDefinition, ModelDefinition, PromptDefinition

# provider name → factory(definition, shared HTTP client); adapters speak to their API over that client
PROVIDERS: dict[str, Callable[[ModelDefinition, httpx.AsyncClient], Model]] = {
    "anthropic": AnthropicModel,
    "openai": OpenAIModel,
    "test": TestModel,
}
# provider name → the variable a model of it reads its API key from (None: none)
KEY_VARIABLES: dict[str, Callable[[ModelDefinition], str | None]] = {
    "anthropic": anthropic.key_variable,
    "openai": openai.key_variable,
    "test": test.key_variable,
}
# provider name → the variable a model of it cannot be called without (None: it may take no key)
REQUIRED_KEYS: dict[str, Callable[[ModelDefinition], str | None]] = {
    "anthropic": anthropic.required_key,
    "openai": openai.required_key,
    "test": test.required_key,
}


def build(definition: ModelDefinition, http: httpx.AsyncClient) -> Model:
    """The configured model for a definition (the catalog has checked its provider is available)."""
    return PROVIDERS[definition.provider](definition, http)


class Configured(Protocol):
    """What `missing_keys` reads of a catalog (`app.catalog.Catalog`): its models, agents and prompts."""

    @property
    def models(self) -> Mapping[str, ModelDefinition]: ...

    @property
    def agents(self) -> Mapping[str, AgentDefinition]: ...

    @property
    def prompts(self) -> Mapping[str, PromptDefinition]: ...


def missing_keys(catalog: Configured, defined: Collection[str]) -> list[str]:
    """One warning per model of the catalog whose key variable is set nowhere a call would find it before the
    thread's and user's variables: not in `defined` (the process environment, the instance's variables) and not in
    any agent's or prompt's `env`. Such a model fails every call (`auth` error) unless a user or thread sets it."""
    in_catalog = {name for agent in catalog.agents.values() for name in agent.env}
    in_catalog |= {name for prompt in catalog.prompts.values() for name in prompt.env}
    warnings = []
    for name, definition in sorted(catalog.models.items()):
        variable = REQUIRED_KEYS[definition.provider](definition)
        if variable is not None and variable not in defined and variable not in in_catalog:
            warnings.append(
                f"model `{name}` ({definition.provider}) needs an API key in `{variable}`, which is not set: its "
                "calls will fail until it is set in the environment or as an instance variable (a user's or a "
                "thread's variables may set it for their threads)"
            )
    return warnings
