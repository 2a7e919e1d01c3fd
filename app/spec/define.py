"""`define_*`: build a definition and hand it to the catalog loader collecting the current file."""

from __future__ import annotations

import asyncio
import functools
import inspect
import typing
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

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


class BlockingState:
    """`state` as a plain `def` tool, hook or effect sees it on its worker thread: each async method is run on the
    event loop and waited for, so the function calls `state.env("X")` like a plain method. Once the call is over
    (it returned, or ran out of time and was left to finish alone) its state refuses further use."""

    def __init__(self, state: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._state = state
        self._loop = loop
        self._open = True

    def close(self) -> None:
        self._open = False

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._state, name)
        if not inspect.iscoroutinefunction(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            if not self._open:
                raise RuntimeError(f"`state.{name}`: this call has ended (it ran past its time limit)")
            return asyncio.run_coroutine_threadsafe(value(*args, **kwargs), self._loop).result()

        return call


def _awaitable(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """An `async def` as it is; a plain `def` runs in a worker thread (blocking or CPU-bound work in it leaves the
    event loop, and every other thread of the process, free), with `state` as a `BlockingState`."""
    if inspect.iscoroutinefunction(fn):
        return fn

    @functools.wraps(fn)
    async def in_thread(state: Any, *args: Any) -> Any:
        blocking = BlockingState(state, asyncio.get_running_loop())
        try:
            return await asyncio.to_thread(fn, blocking, *args)
        finally:  # also when the caller stopped waiting (a timeout): a thread left running must not write
            blocking.close()

    return in_thread


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
    """A callable tool: an async function, its argument model, its declared variables and its time limit."""

    fn: ToolFunction
    description: str
    args_model: type[BaseModel] | None
    variables: list[VariableDefinition] = field(default_factory=list)
    name: str = ""
    timeout: float | None = None  # seconds; None = the server's `tool_timeout`
    _schema: dict[str, Any] | None = field(default=None, init=False, repr=False, compare=False)

    def parameters(self) -> dict[str, Any]:
        """The JSON Schema the model sees (objects closed with `additionalProperties: false`). Built once: every step
        offers it, and pydantic builds a schema anew on each call. Shared: read it, never change it."""
        if self._schema is None:
            model = self.args_model
            empty = {"type": "object", "properties": {}, "additionalProperties": False}
            self._schema = empty if model is None else close_objects(model.model_json_schema())
        return self._schema


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


def _args_model(fn: ToolFunction, noun: str = "tool") -> type[BaseModel] | None:
    params = list(inspect.signature(fn).parameters.values())
    if len(params) not in (1, 2):
        raise TypeError(f"{noun} `{fn.__name__}` must take (state) or (state, args)")
    if len(params) == 1:
        return None
    hints = typing.get_type_hints(fn)
    model = hints.get(params[1].name)
    if not (inspect.isclass(model) and issubclass(model, BaseModel)):
        raise TypeError(f"{noun} `{fn.__name__}`: annotate `{params[1].name}` with a pydantic model class")
    return model


def define_tool(
    *,
    description: str,
    variables: list[dict[str, Any] | VariableDefinition] | None = None,
    timeout: float | None = None,
) -> Callable[[Callable[..., Any]], ToolDefinition]:
    """Decorate a function `(state, args)` as a tool; the file name is the tool name.

    An `async def` runs on the event loop; a plain `def` runs in a worker thread (use it for blocking or CPU-bound
    work). A call that runs longer than `timeout` seconds (default: the server's `TOOL_TIMEOUT`) ends with an error
    result; a plain `def` cannot be interrupted, so its thread finishes in the background and its result is dropped.
    """
    if timeout is not None and timeout <= 0:
        raise TypeError("a tool's `timeout` must be a positive number of seconds")

    def wrap(fn: Callable[..., Any]) -> ToolDefinition:
        declared = [
            v if isinstance(v, VariableDefinition) else VariableDefinition.model_validate(v) for v in variables or []
        ]
        return _register(
            ToolDefinition(
                fn=_awaitable(fn),
                description=description,
                args_model=_args_model(fn),
                variables=declared,
                name=fn.__name__,
                timeout=timeout,
            )
        )

    return wrap


HookFunction = Callable[..., Awaitable[Any]]
HOOK_PARAMS = {  # hook name → the arguments its function takes
    "filter_messages": ("state", "messages"),
    "prefilter_llm_history": ("state", "messages"),
    "before_create_message": ("state", "message"),
    "after_create_message": ("state", "message"),
    "before_update_message": ("state", "message_id", "updates"),
    "after_update_message": ("state", "message"),
    "before_store_tool_result": ("state", "tool_call", "result"),
    "after_tool_call_success": ("state", "tool_call", "result"),
    "after_tool_call_failure": ("state", "tool_call", "result"),
}


@dataclass
class HookDefinition:
    """A hook: the point it runs at (`hook`), its async function, and its id (`name`, the file name)."""

    hook: str
    fn: HookFunction
    name: str = ""


def define_hook(hook_name: str) -> Callable[[Callable[..., Any]], HookDefinition]:
    """Decorate a function as a hook run at `hook_name`; the file name is the hook id (a plain `def` runs in a
    worker thread, as for tools).

    Every hook gets the thread's `state` first. A transforming hook returns the new value; one that raises (or
    returns something of the wrong type) is logged and its input is used unchanged.

    - `filter_messages(state, messages: list[StateMessage]) -> list[StateMessage]`: before context assembly, over
      the stored messages the acting side would see; the returned list is what gets assembled.
    - `prefilter_llm_history(state, messages: list[LLMMessage]) -> list[LLMMessage]`: after assembly (system
      message included); the returned list is what the model is sent.
    - `before_create_message(state, message: dict) -> dict`: before the engine inserts a message (the pending
      assistant message, a tool result, a delivered inbox message, a `state.inject_message`); `content`,
      `metadata` and `silent` of the returned dict are used. A message these create hooks inject runs none.
    - `after_create_message(state, message: StateMessage) -> None`
    - `before_update_message(state, message_id: str, updates: dict) -> dict`: before the engine updates a message
      (the pending assistant message completing or failing), and before a client's edit (`PATCH
      /threads/{id}/messages/{message_id}`, run with `state.execution` `None`); `content`, `metadata` and `silent`
      of the returned updates are applied.
    - `after_update_message(state, message: StateMessage) -> None`
    - `after_tool_call_success(state, tool_call: dict, result: ToolResult) -> ToolResult | None` and
      `after_tool_call_failure(...)`, by the result's status, right after the tool ran: `None` removes the call
      and its result from the stored history (stop rules of the step still see the outcome).
    - `before_store_tool_result(state, tool_call: dict, result: ToolResult) -> ToolResult`: then, before the result
      is stored.

    Hooks of one name run in the order the prompt's `hooks` (or, if the prompt sets none, the agent's) list them,
    each getting the previous one's output.
    """
    if hook_name not in HOOK_PARAMS:
        raise TypeError(f"unknown hook `{hook_name}`: use one of {', '.join(HOOK_PARAMS)}")
    params = HOOK_PARAMS[hook_name]

    def wrap(fn: Callable[..., Any]) -> HookDefinition:
        try:
            inspect.signature(fn).bind(*params)
        except TypeError:
            raise TypeError(f"hook `{fn.__name__}` must take ({', '.join(params)}) as a `{hook_name}` hook") from None
        return _register(HookDefinition(hook=hook_name, fn=_awaitable(fn), name=fn.__name__))

    return wrap


# -- custom thread endpoints -------------------------------------------------------------------------------

EndpointFunction = Callable[..., Awaitable[Any]]
ENDPOINT_PARAMS = ("request", "state", "params")


@dataclass
class EndpointDefinition:
    """A custom thread endpoint: its async handler `(request, state, params)`; the file path is its route.

    `name` is the file's path inside `endpoints/` (set by the loader).
    """

    fn: EndpointFunction
    description: str = ""
    name: str = ""


@overload
def define_thread_endpoint(fn: EndpointFunction, /) -> EndpointDefinition: ...


@overload
def define_thread_endpoint(*, description: str = "") -> Callable[[EndpointFunction], EndpointDefinition]: ...


def define_thread_endpoint(
    fn: EndpointFunction | None = None, /, *, description: str = ""
) -> EndpointDefinition | Callable[[EndpointFunction], EndpointDefinition]:
    """Decorate an async function `(request, state, params)` as a thread endpoint, bare or with a `description`.

    The handler gets the Starlette `Request`, a `ThreadState` whose `execution` is `None`, and the path's
    parameters; it returns a Starlette `Response` (sent as it is) or something JSON-serialisable (sent as 200 JSON).
    """

    def wrap(handler: EndpointFunction) -> EndpointDefinition:
        if not inspect.iscoroutinefunction(handler):
            raise TypeError(f"endpoint `{handler.__name__}` must be an `async def` function")
        try:
            inspect.signature(handler).bind(*ENDPOINT_PARAMS)
        except TypeError:
            raise TypeError(f"endpoint `{handler.__name__}` must take ({', '.join(ENDPOINT_PARAMS)})") from None
        return _register(EndpointDefinition(fn=handler, description=description, name=handler.__name__))

    return wrap if fn is None else wrap(fn)


# -- effects -----------------------------------------------------------------------------------------------

EffectFunction = Callable[..., Awaitable[Any]]


@dataclass
class EffectDefinition:
    """An effect: an async function `(state[, args])` run when a scheduled effect falls due; the file name names it."""

    fn: EffectFunction
    description: str
    args_model: type[BaseModel] | None
    name: str = ""


def define_effect(*, description: str) -> Callable[[Callable[..., Any]], EffectDefinition]:
    """Decorate a function `(state)` or `(state, args: ArgsModel)` as an effect (a plain `def` runs in a worker
    thread, as for tools).

    `state.schedule_effect(name, args, delay_ms)` stores it; when due it runs inside the thread's single flight,
    outside any transaction, with `state.execution` None and `state.context["effect"] == {id, name, attempt}`.
    It runs at least once: a handler must tolerate being run again after a crash (`attempt` > 1).
    """

    def wrap(fn: Callable[..., Any]) -> EffectDefinition:
        return _register(
            EffectDefinition(
                fn=_awaitable(fn), description=description, args_model=_args_model(fn, "effect"), name=fn.__name__
            )
        )

    return wrap
