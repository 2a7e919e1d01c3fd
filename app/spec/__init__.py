"""The authoring surface: everything code under `agents/` imports from `app`."""

from app.llm.base import LLMMessage
from app.spec.define import (
    EffectDefinition,
    HookDefinition,
    ToolDefinition,
    define_agent,
    define_effect,
    define_hook,
    define_model,
    define_prompt,
    define_tool,
)
from app.spec.definitions import (
    AgentDefinition,
    ModelDefinition,
    PromptDefinition,
    SessionToolConfig,
    SideConfig,
    ToolEntry,
    VariableDefinition,
)
from app.spec.results import ToolAttachment, ToolResult
from app.spec.state import ExecutionState, MessagesResult, ScheduledEffect, StateLog, StateMessage, ThreadState

__all__ = [
    "AgentDefinition",
    "EffectDefinition",
    "ExecutionState",
    "HookDefinition",
    "LLMMessage",
    "MessagesResult",
    "ModelDefinition",
    "PromptDefinition",
    "ScheduledEffect",
    "SessionToolConfig",
    "SideConfig",
    "StateLog",
    "StateMessage",
    "ThreadState",
    "ToolAttachment",
    "ToolDefinition",
    "ToolEntry",
    "ToolResult",
    "VariableDefinition",
    "define_agent",
    "define_effect",
    "define_hook",
    "define_model",
    "define_prompt",
    "define_tool",
]
