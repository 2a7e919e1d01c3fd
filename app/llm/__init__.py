"""LLM providers behind one `Model` contract; the engine never branches on the provider."""

from __future__ import annotations

from collections.abc import Callable

from app.llm.base import Model
from app.llm.test import TestModel
from app.spec.definitions import ModelDefinition

PROVIDERS: dict[str, Callable[[ModelDefinition], Model]] = {"test": TestModel}


def build(definition: ModelDefinition) -> Model:
    """The configured model for a definition (the catalog has checked its provider is available)."""
    return PROVIDERS[definition.provider](definition)
