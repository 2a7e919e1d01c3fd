"""LLM providers behind one `Model` contract; the engine never branches on the provider."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from app.llm.anthropic import AnthropicModel
from app.llm.base import Model
from app.llm.openai import OpenAIModel
from app.llm.test import TestModel
from app.spec.definitions import ModelDefinition

# provider name → factory(definition, shared HTTP client); adapters speak to their API over that client
PROVIDERS: dict[str, Callable[[ModelDefinition, httpx.AsyncClient], Model]] = {
    "anthropic": AnthropicModel,
    "openai": OpenAIModel,
    "test": TestModel,
}


def build(definition: ModelDefinition, http: httpx.AsyncClient) -> Model:
    """The configured model for a definition (the catalog has checked its provider is available)."""
    return PROVIDERS[definition.provider](definition, http)
