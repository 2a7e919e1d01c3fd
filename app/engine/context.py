"""Context assembly: the system prompt, the history a side sees, and the tools it is offered (§4)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from cryptography.fernet import Fernet
from sqlalchemy.ext.asyncio import AsyncSession

from app import environment, tables
from app.catalog import Catalog
from app.engine import child_tools, types
from app.engine.transcript import HistoryRow, Transcript
from app.llm.base import LLMRequest, LLMTool
from app.spec.define import close_objects
from app.spec.definitions import PromptDefinition, PromptEnvPart, PromptIncludePart, Side, SideConfig, ToolEntry
from app.spec.messages import LLMMessage


async def load_env(
    session: AsyncSession, fernet: Fernet, catalog: Catalog, thread: tables.Thread, prompt: PromptDefinition | None
) -> types.Env:
    """The `Env` of a thread's step: its stored layers, its agent's and its prompt's `env` (the one place that
    builds one for a thread)."""
    agent = catalog.agent(thread.agent)
    stored = await environment.layers(session, fernet, thread.id, thread.user_id)
    return types.Env(
        stored.thread,
        dict(agent.env),
        dict(prompt.env) if prompt is not None else {},
        user=stored.user,
        instance=stored.instance,
        declared_secret=catalog.secret_names(agent.name),
    )


def render_prompt(catalog: Catalog, prompt: PromptDefinition, env: types.Env) -> str:
    """The prompt's text with includes expanded and env parts resolved (cycles are refused at load)."""
    if isinstance(prompt.prompt, str):
        return prompt.prompt
    out: list[str] = []
    for part in prompt.prompt:
        if isinstance(part, PromptIncludePart):
            out.append(render_prompt(catalog, catalog.prompts[part.prompt], env))
        elif isinstance(part, PromptEnvPart):
            if env.is_secret(part.property):
                raise types.SecretInPrompt(part.property)
            out.append(env.get(part.property))
        else:
            out.append(part.content)
    return "".join(out)


def session_tool_schema(side: SideConfig, name: str) -> dict[str, Any]:
    """Arguments of a runtime-provided session tool: the properties its binding maps (§5)."""
    props: dict[str, Any] = {}
    for which in ("stop", "fail", "status"):
        binding = side.binding(which)
        if binding is None or binding.name != name:
            continue
        if binding.message_property:
            props[binding.message_property] = {"type": "string"}
        if binding.attachments_property:
            props[binding.attachments_property] = {"type": "array", "items": {"type": "string"}}
    return {"type": "object", "properties": props, "required": sorted(props), "additionalProperties": False}


def offered_tools(
    catalog: Catalog,
    prompt: PromptDefinition,
    side: SideConfig,
    env: types.Env | None = None,
    full: frozenset[str] = frozenset(),
) -> list[types.OfferedTool]:
    """Callables of the prompt plus the side's session tools (built in when no callable has the name), and its
    subagent tools (`full`: resumable subagents at their cap, not offered for creation)."""
    offered: dict[str, types.OfferedTool] = {}
    for entry in prompt.tool_entries():
        tool = catalog.tools.get(entry.name)
        if tool is not None:
            offered[entry.name] = types.OfferedTool(entry.name, "callable", entry, tool.description, tool.parameters())
        elif (composed := _composed(catalog, entry)) is not None:
            offered[entry.name] = composed
    for name in side.session_tool_names():
        if name in offered:
            continue
        tool = catalog.tools.get(name)
        if tool is not None:
            offered[name] = types.OfferedTool(
                name, "callable", ToolEntry(name=name), tool.description, tool.parameters()
            )
        else:
            offered[name] = types.OfferedTool(
                name,
                "session",
                ToolEntry(name=name),
                f"Call `{name}` to end or report on the session.",
                session_tool_schema(side, name),
            )

    for child_tool in child_tools.offered(catalog, prompt, env, full):
        offered.setdefault(child_tool.name, child_tool)
    return list(offered.values())


HANDOFF_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"message": {"type": "string", "description": "An optional note for the agent taking over."}},
    "additionalProperties": False,
}


def _composed(catalog: Catalog, entry: ToolEntry) -> types.OfferedTool | None:
    """A prompt offered as a subprompt (§7.2), or an `ai_human` agent offered as a handoff (§7.3)."""
    prompt = catalog.prompts.get(entry.name)
    if prompt is not None:
        schema = close_objects(prompt.schema_for_tool())
        return types.OfferedTool(entry.name, "subprompt", entry, prompt.tool_description or "", schema)
    agent = catalog.agents.get(entry.name)
    if agent is not None and agent.type == "ai_human":
        return types.OfferedTool(entry.name, "handoff", entry, agent.tool_description or "", HANDOFF_SCHEMA)
    return None


def build_request(
    catalog: Catalog,
    prompt: PromptDefinition,
    side: SideConfig,
    acting: Side,
    rows: Sequence[HistoryRow],
    turn_start: int,
    env: types.Env,
    full: frozenset[str] = frozenset(),
    kept: Transcript | None = None,
) -> LLMRequest:
    """Everything the model of `prompt` is sent for the acting side's next step (`full`: see `offered_tools`;
    `kept`: the thread's transcript, when `rows` are its held copies)."""
    model = catalog.models[prompt.model]
    past, with_images = (kept or Transcript()).messages(rows, acting, prompt, turn_start)
    recent = len(past) - prompt.recent_image_threshold
    for index in with_images:  # only the most recent messages keep real images (the spec's default: 10)
        if index < recent or not model.capabilities.supports_images:
            past[index] = dataclasses.replace(past[index], images=[])  # the kept message stays as it is
    messages = [LLMMessage("system", render_prompt(catalog, prompt, env)), *past]
    tools = [LLMTool(t.name, t.description, t.parameters) for t in offered_tools(catalog, prompt, side, env, full)]
    return LLMRequest(
        model=model.model or model.name,
        messages=messages,
        tools=tools,
        tool_choice=prompt.tool_choice,
        parallel_tool_calls=prompt.parallel_tool_calls,
        reasoning=prompt.reasoning.model_dump(exclude_none=True) if prompt.reasoning else None,
        provider_options={**model.provider_options, **prompt.provider_options},
    )
