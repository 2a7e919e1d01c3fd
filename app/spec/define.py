"""`define_*`: build a definition and hand it to the catalog loader collecting the current file."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel

from app.spec.definitions import AgentDefinition, ModelDefinition, PromptDefinition, VariableDefinition

_T = TypeVar("_T")
_collected: ContextVar[list[object] | None] = ContextVar("collected", default=None)


@contextmanager
def collecting() -> Iterator[list[object]]:
    """Collect every definition made while the block runs (the loader wraps each file in this)."""
    bucket: list[object] = []
    token = _collected.set(bucket)
    try:
        yield bucket
    finally:
        _collected.reset(token)


def _register(definition: _T) -> _T:
    bucket = _collected.get()
    if bucket is not None:
        bucket.append(definition)
    return definition


def define_model(**fields: Any) -> ModelDefinition:
    """Define a model (`authoring.md`, Models)."""
    return _register(ModelDefinition.model_validate(fields))


def define_prompt(**fields: Any) -> PromptDefinition:
    """Define a prompt (`authoring.md`, Prompts)."""
    return _register(PromptDefinition.model_validate(fields))


def define_agent(**fields: Any) -> AgentDefinition:
    """Define an agent (`authoring.md`, Agents)."""
    return _register(AgentDefinition.model_validate(fields))


ToolFunction = Callable[..., Awaitable[Any]]


@dataclass
class ToolDefinition:
    """A callable tool: an async function, its argument model and its declared variables."""

    fn: ToolFunction
    description: str
    args_model: type[BaseModel] | None
    variables: list[VariableDefinition] = field(default_factory=list)
    name: str = ""

    def parameters(self) -> dict[str, Any]:
        """The JSON Schema the model sees (objects closed with `additionalProperties: false`)."""
        if self.args_model is None:
            return {"type": "object", "properties": {}, "additionalProperties": False}
        return close_objects(self.args_model.model_json_schema())


def close_objects(schema: dict[str, Any]) -> dict[str, Any]:
    """Set `additionalProperties: false` on every object schema, as strict providers require."""

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            out = {k: walk(v) for k, v in node.items()}
            if out.get("type") == "object" and "additionalProperties" not in out:
                out["additionalProperties"] = False
            return out
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    result: dict[str, Any] = walk(schema)
    return result


def _args_model(fn: ToolFunction) -> type[BaseModel] | None:
    params = list(inspect.signature(fn).parameters.values())
    if len(params) not in (1, 2):
        raise TypeError(f"tool `{fn.__name__}` must take (state) or (state, args)")
    if len(params) == 1:
        return None
    hints = typing.get_type_hints(fn)
    model = hints.get(params[1].name)
    if not (inspect.isclass(model) and issubclass(model, BaseModel)):
        raise TypeError(f"tool `{fn.__name__}`: annotate `{params[1].name}` with a pydantic model class")
    return model


def define_tool(
    *, description: str, variables: list[dict[str, Any] | VariableDefinition] | None = None
) -> Callable[[ToolFunction], ToolDefinition]:
    """Decorate an async function `(state, args)` as a tool; the file name is the tool name."""

    def wrap(fn: ToolFunction) -> ToolDefinition:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"tool `{fn.__name__}` must be an `async def` function")
        declared = [
            v if isinstance(v, VariableDefinition) else VariableDefinition.model_validate(v) for v in variables or []
        ]
        return _register(
            ToolDefinition(
                fn=fn,
                description=description,
                args_model=_args_model(fn),
                variables=declared,
                name=fn.__name__,
            )
        )

    return wrap
