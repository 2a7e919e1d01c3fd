"""The definition models users author against (spec `AgentDefinition`, `PromptDefinition`, …); no I/O.

Every field accepts its snake_case name and the spec's camelCase name; unknown fields are errors.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

Side = Literal["a", "b"]  # a thread's two sides: A (the agent, or the first AI of a `dual_ai`) and B (the other one)

PACKAGING_FIELDS = ("packageName", "package_name", "version", "author", "license")


class Definition(BaseModel):
    """Base of every definition: both spellings, no unknown fields, immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        extra="forbid",
        frozen=True,
        arbitrary_types_allowed=True,
    )


def _drop_packaging(data: Any) -> Any:
    """Accept and ignore the spec's packaging fields."""
    if isinstance(data, dict):
        return {k: v for k, v in data.items() if k not in PACKAGING_FIELDS}
    return data


def _tenvs_to_env(data: Any, where: str) -> Any:
    """Read the deprecated `tenvs` as `env`, with a warning."""
    if isinstance(data, dict) and "tenvs" in data:
        data = dict(data)
        tenvs = data.pop("tenvs")
        warnings.warn(f"{where}: `tenvs` is deprecated, use `env`", DeprecationWarning, stacklevel=2)
        if "env" not in data and isinstance(tenvs, dict):
            data["env"] = {str(k): str(v) for k, v in tenvs.items()}
    return data


class VariableDefinition(Definition):
    """A variable a prompt, tool or agent declares."""

    name: str = Field(min_length=1)
    type: Literal["text", "secret"] = "text"
    required: bool = False
    scoped: bool = False
    description: str = ""  # the spec's `VariableDefinition.description`: "" when not provided

    @model_validator(mode="before")
    @classmethod
    def _no_description(cls, data: Any) -> Any:
        """An explicit `description: None` is "not provided" too."""
        if isinstance(data, dict) and data.get("description", "") is None:
            return {k: v for k, v in data.items() if k != "description"}
        return data


class ModelCapabilities(Definition):
    """What a model can do."""

    supports_images: bool = False
    supports_tool_calls: bool = True
    supports_streaming: bool = True
    max_context_tokens: int | None = None
    max_output_tokens: int | None = None
    reasoning_levels: dict[str, Any] | list[Any] | None = None


class TestToolCall(Definition):
    """One tool call a `test` model returns."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None


class TestReply(Definition):
    """One scripted `test` model answer: text, tool calls, reasoning, usage, or an error."""

    text: str | None = None
    tool_calls: list[TestToolCall] = Field(default_factory=list)
    reasoning: str | None = None
    usage: dict[str, int] | None = None
    error: str | None = None
    status: int | None = None


class ModelDefinition(Definition):
    """`define_model(...)`: an LLM the prompts can name."""

    name: str = Field(min_length=1)
    provider: Literal["openai", "anthropic", "test"]
    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    fallbacks: list[str] = Field(default_factory=list)
    input_price: float | None = Field(default=None, ge=0)
    output_price: float | None = Field(default=None, ge=0)
    cached_price: float | None = Field(default=None, ge=0)
    capabilities: ModelCapabilities = Field(default_factory=ModelCapabilities)
    provider_options: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float | None = Field(default=None, gt=0)
    # for models that print tool calls as text instead of calling natively (Llama-style `<function=…>`,
    # `<tool_call>` tags, JSON): the engine recovers them from the answer with `app.llm.recovery.recover`
    text_tool_calls: bool = Field(default=False, description="Recover tool calls the model writes as text.")
    # `test` provider only
    script: list[str | TestReply] | None = None
    respond: Callable[..., Any] | None = None
    chunk_size: int | None = Field(default=None, ge=1)
    delay_ms: int = Field(default=0, ge=0)
    chunk_delay_ms: int = Field(default=0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _packaging(cls, data: Any) -> Any:
        return _drop_packaging(data)

    @model_validator(mode="after")
    def _provider_fields(self) -> ModelDefinition:
        if self.provider == "test":
            if self.script is None and self.respond is None:
                raise ValueError("a `test` model needs `script` (a list of replies) or `respond` (a function)")
            if self.script is not None and self.respond is not None:
                raise ValueError("a `test` model takes `script` or `respond`, not both")
        else:
            if not self.model:
                raise ValueError(f"a `{self.provider}` model needs `model` (the provider's model id)")
            for name in ("script", "respond", "chunk_size"):
                if getattr(self, name) is not None:
                    raise ValueError(f"`{name}` applies to the `test` provider only")
            if self.chunk_delay_ms:
                raise ValueError("`chunk_delay_ms` applies to the `test` provider only")
        return self


class PromptTextPart(Definition):
    type: Literal["text"]
    content: str


class PromptIncludePart(Definition):
    type: Literal["include"]
    prompt: str


class PromptEnvPart(Definition):
    type: Literal["env"]
    property: str


PromptPart = Annotated[PromptTextPart | PromptIncludePart | PromptEnvPart, Field(discriminator="type")]


class ReasoningConfig(Definition):
    """Extended-thinking settings passed to the provider."""

    effort: Literal["minimal", "low", "medium", "high"] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    exclude: bool = False
    include: bool | None = None


class ImmediateConfig(Definition):
    """`immediate` in object form: one child per group of scoped values."""

    scoped_env: list[str] = Field(default_factory=list)
    name_env: str | None = None
    description_env: str | None = None


class ResumableConfig(Definition):
    """`resumable` in object form."""

    receives_messages: Literal["side_a", "side_b"]
    max_instances: int | None = Field(default=None, ge=1)
    parent_communication: Literal["implicit", "explicit"] = "implicit"


SUBPROMPT_FIELDS = frozenset(
    {
        "include_text_response",
        "include_tool_calls",
        "include_errors",
        "init_user_message_property",
        "init_attachments_property",
    }
)
CALLABLE_FIELDS = frozenset({"env", "options"})
SUBAGENT_FIELDS = frozenset(
    {
        "blocking",
        "init_user_message_property",
        "init_attachments_property",
        "init_agent_name_property",
        "immediate",
        "optional",
        "resumable",
    }
)
HANDOFF_FIELDS: frozenset[str] = frozenset()


class ToolEntry(Definition):
    """One object entry of a prompt's `tools`: `SubpromptConfig`, `PromptToolConfig` or `SubagentToolConfig`.

    Which one it is depends on what `name` refers to; the catalog checks the fields fit that kind.
    """

    name: str = Field(min_length=1)
    # SubpromptConfig
    include_text_response: bool = True
    include_tool_calls: bool = True
    include_errors: bool = True
    init_user_message_property: str | None = None
    init_attachments_property: str | None = None
    # PromptToolConfig
    env: dict[str, str] = Field(default_factory=dict)
    options: dict[str, Any] = Field(default_factory=dict)
    # SubagentToolConfig
    blocking: bool = True
    init_agent_name_property: str | None = None
    immediate: bool | ImmediateConfig = False
    optional: str | None = None
    resumable: Literal[False] | ResumableConfig = False

    @model_validator(mode="before")
    @classmethod
    def _tenvs(cls, data: Any) -> Any:
        return _tenvs_to_env(data, "tool entry")

    def enabled(self, value: Callable[[str], str | None]) -> bool:
        """Whether the entry is available: with `optional: NAME`, only when NAME's value (`value(NAME)`, None when
        nothing defines it) is `true`, `1` or `yes` in any case (§6.6). The one place this rule lives."""
        if self.optional is None:
            return True
        found = value(self.optional)
        return found is not None and found.strip().lower() in ("true", "1", "yes")

    @property
    def fields_set(self) -> set[str]:
        """The kind-specific fields the author wrote (name excluded)."""
        return set(self.model_fields_set) - {"name"}


class PromptDefinition(Definition):
    """`define_prompt(...)`: a system prompt, its model and its tools."""

    name: str = Field(min_length=1)
    tool_description: str | None = None
    prompt: str | list[PromptPart]
    model: str
    include_chat: bool = False
    include_past_tools: bool = False
    parallel_tool_calls: bool = False  # the spec's default: one tool call per step unless the prompt allows more
    tool_choice: Literal["auto", "none", "required"] | None = None
    required_schema: type[BaseModel] | dict[str, Any] | None = None
    variables: list[VariableDefinition] = Field(default_factory=list)
    tools: list[str | ToolEntry] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    reasoning: ReasoningConfig | None = None
    recent_image_threshold: int = Field(default=10, ge=0)
    provider_options: dict[str, Any] = Field(default_factory=dict)
    hooks: list[str] | None = None

    @model_validator(mode="before")
    @classmethod
    def _compat(cls, data: Any) -> Any:
        return _tenvs_to_env(_drop_packaging(data), "prompt")

    def tool_entries(self) -> list[ToolEntry]:
        """Every entry of `tools` in object form."""
        return [ToolEntry(name=t) if isinstance(t, str) else t for t in self.tools]

    def schema_for_tool(self) -> dict[str, Any]:
        """The JSON Schema this prompt takes when called as a tool: its `required_schema`, else `{message,
        attachments?}` (§7.2: `initUserMessageProperty` and `initAttachmentsProperty` default to these)."""
        if self.required_schema is None:
            return {
                "type": "object",
                "properties": {
                    "message": {"type": "string"},
                    "attachments": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "paths of files of this thread to attach",
                    },
                },
                "required": ["message"],
                "additionalProperties": False,
            }
        if isinstance(self.required_schema, dict):
            return self.required_schema
        return self.required_schema.model_json_schema()


class SessionToolConfig(Definition):
    """A session lifecycle binding in object form."""

    name: str = Field(min_length=1)
    message_property: str | None = None
    attachments_property: str | None = None


SessionToolBinding = str | SessionToolConfig


class SideConfig(Definition):
    """One side of an agent."""

    prompt: str
    label: str | None = None
    stop_on_response: bool = True
    stop_tool: str | None = None
    stop_tool_response_property: str | None = None
    max_steps: int | None = Field(default=None, ge=1)
    session_stop: SessionToolBinding | None = None
    session_fail: SessionToolBinding | None = None
    session_status: SessionToolBinding | None = None

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        """Map the deprecated `endSessionTool` / `failSessionTool` / `statusTool` onto the bindings."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for old, old_camel, new, new_camel in (
            ("end_session_tool", "endSessionTool", "session_stop", "sessionStop"),
            ("fail_session_tool", "failSessionTool", "session_fail", "sessionFail"),
            ("status_tool", "statusTool", "session_status", "sessionStatus"),
        ):
            value = data.pop(old, None) or data.pop(old_camel, None)
            if value is not None and new not in data and new_camel not in data:
                data[new] = value
        return data

    def binding(self, which: Literal["stop", "fail", "status"]) -> SessionToolConfig | None:
        """A session binding in object form."""
        value = {"stop": self.session_stop, "fail": self.session_fail, "status": self.session_status}[which]
        if value is None:
            return None
        return SessionToolConfig(name=value) if isinstance(value, str) else value

    def session_tool_names(self) -> list[str]:
        """Names of the session tools this side binds."""
        return [b.name for b in (self.binding("stop"), self.binding("fail"), self.binding("status")) if b]


class AgentDefinition(Definition):
    """`define_agent(...)`: the conversation orchestrator."""

    name: str = Field(min_length=1)
    type: Literal["ai_human", "dual_ai"] = "ai_human"
    side_a: SideConfig
    side_b: SideConfig | None = None
    max_session_turns: int | None = Field(default=None, ge=1)
    title: str | None = None
    description: str | None = None
    icon: str | None = None
    expose_as_tool: bool = False
    tool_description: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    hooks: list[str] | None = None
    variables: list[VariableDefinition] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _compat(cls, data: Any) -> Any:
        return _tenvs_to_env(_drop_packaging(data), "agent")

    @model_validator(mode="after")
    def _shape(self) -> AgentDefinition:
        if self.type == "dual_ai" and self.side_b is None:
            raise ValueError("a `dual_ai` agent needs `side_b`")
        if self.expose_as_tool and not self.tool_description:
            raise ValueError("`expose_as_tool` needs `tool_description`")
        return self

    def side(self, which: Side) -> SideConfig | None:
        """The config of side `a` or `b`."""
        return self.side_a if which == "a" else self.side_b
