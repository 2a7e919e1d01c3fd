"""Context assembly: the system prompt, the history a side sees, and the tools it is offered (§4)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from cryptography.fernet import Fernet
from sqlalchemy.ext.asyncio import AsyncSession

from app import environment, messages, tables
from app.catalog import Catalog
from app.engine import child_tools, types
from app.llm.base import LLMRequest, LLMTool
from app.spec.define import close_objects
from app.spec.definitions import PromptDefinition, PromptEnvPart, PromptIncludePart, Side, SideConfig, ToolEntry
from app.spec.messages import LLMImage, LLMMessage, ToolCall


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


class HistoryRow(Protocol):
    """What building a request reads of a message: an ORM row, or its plain copy (`history.Seen`)."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def position(self) -> int: ...
    @property
    def role(self) -> str: ...
    @property
    def side(self) -> Side | None: ...
    @property
    def status(self) -> str: ...
    @property
    def depth(self) -> int: ...
    @property
    def content(self) -> str | None: ...
    @property
    def name(self) -> str | None: ...
    @property
    def tool_calls(self) -> list[Any] | None: ...
    @property
    def tool_call_id(self) -> str | None: ...
    @property
    def attachments(self) -> list[Any]: ...
    @property
    def prompt(self) -> str | None: ...
    @property
    def reasoning_content(self) -> str | None: ...
    @property
    def reasoning_details(self) -> list[Any] | None: ...


Row = TypeVar("Row", bound=HistoryRow)


def visible_rows(rows: Sequence[Row], side: Side, prompt: PromptDefinition, turn_start: int) -> list[Row]:
    """The rows a side's prompt may see: completed ones of its chat window (§4)."""
    out = []
    for row in rows:
        if row.status not in (messages.Status.COMPLETED,) or row.depth != 0:
            continue
        current = row.position >= turn_start
        if not current and not prompt.include_chat:
            continue
        if row.role == "tool" and row.side != side:
            continue
        out.append(row)
    return out


MAX_IMAGE_BYTES = 5 * 1024 * 1024  # larger images are named, not sent (providers refuse bigger inline images)


def described(text: str | None, attachments: list[dict[str, Any]] | None) -> str:
    """A message's text with its attachments named, so a model that sees no image still knows the files exist."""
    if not attachments:
        return text or ""
    lines = []
    for a in attachments:
        facts = [str(a.get("mime_type") or "file"), f"{a.get('size', 0)} bytes"]
        if a.get("width") and a.get("height"):
            facts.append(f"{a['width']}x{a['height']}")
        lines.append(f"- {a.get('path')} ({', '.join(facts)})")
    note = "Attached files:\n" + "\n".join(lines)
    return f"{text}\n\n{note}" if text else note


def _images(attachments: list[dict[str, Any]] | None) -> list[LLMImage]:
    return [
        LLMImage(mime_type=str(a["mime_type"]), path=str(a["path"]))
        for a in attachments or []
        if str(a.get("mime_type", "")).startswith("image/")
        and "svg" not in str(a.get("mime_type"))
        and int(a.get("size") or 0) <= MAX_IMAGE_BYTES
        and a.get("path")
    ]


def history(rows: Sequence[HistoryRow], side: Side, prompt: PromptDefinition, turn_start: int) -> list[LLMMessage]:
    """The history in the acting side's perspective: its own messages as `assistant`, the other side's as
    `user`, the other side's tool traffic left out, and only complete call/result pairs. Attachments are named
    in the text; image attachments of `user` messages are also carried as images (see `build_request`)."""
    visible = visible_rows(rows, side, prompt, turn_start)
    results = {r.tool_call_id: r for r in visible if r.role == "tool"}
    out: list[LLMMessage] = []
    for row in visible:
        current = row.position >= turn_start
        with_tools = current or prompt.include_past_tools
        if row.role == "system":
            out.append(LLMMessage("system", row.content or ""))
        elif row.role == "tool":
            continue  # sent right after its call, even when a message was injected while the tools ran
        elif row.side == side:
            calls: list[ToolCall] = []
            if with_tools:
                calls = [c for c in row.tool_calls or [] if c["id"] in results]
            if row.content or calls:
                message = LLMMessage("assistant", row.content or None, tool_calls=calls or None)
                if row.prompt == prompt.name:  # reasoning goes back only to the prompt that produced it
                    message.reasoning, message.reasoning_details = row.reasoning_content, row.reasoning_details
                out.append(message)
            for call in calls:
                result = results[call["id"]]
                content = described(result.content, result.attachments)
                out.append(LLMMessage("tool", content, tool_call_id=result.tool_call_id, name=result.name))
        elif row.content or row.attachments:
            message = LLMMessage("user", described(row.content, row.attachments), images=_images(row.attachments))
            out.append(message)
    return out


def build_request(
    catalog: Catalog,
    prompt: PromptDefinition,
    side: SideConfig,
    acting: Side,
    rows: Sequence[HistoryRow],
    turn_start: int,
    env: types.Env,
    full: frozenset[str] = frozenset(),
) -> LLMRequest:
    """Everything the model of `prompt` is sent for the acting side's next step (`full`: see `offered_tools`)."""
    model = catalog.models[prompt.model]
    past = history(rows, acting, prompt, turn_start)
    recent = len(past) - prompt.recent_image_threshold
    for index, message in enumerate(past):  # only the most recent messages keep real images (the spec's default: 10)
        if index < recent or not model.capabilities.supports_images:
            message.images = []
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
