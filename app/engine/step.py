"""What a step is between its transactions (`Opened`, `Answered`), or how the run ended (`RELEASED`,
`OPEN_ON_ITS_OWN`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, fields

from app import tables
from app.engine import types
from app.llm.base import LLMRequest, LLMResponse
from app.spec.definitions import AgentDefinition, Side, SideConfig
from app.spec.messages import ToolCall


class Released:
    """What a step returns when its last transaction also gave the thread back (the turn ended; nothing waits)."""


RELEASED = Released()


class OpenOnItsOwn:
    """What opening a step inside a closing transaction returns when input or effects wait: the close commits, and the
    step opens in a transaction of its own (effects run first, outside any; a delivery that fails rolls back only
    that opening)."""


OPEN_ON_ITS_OWN = OpenOnItsOwn()


@dataclass
class Step:
    """What the opening transaction of a step decided: who acts, and with what. A step is either `Opened` (its model
    call is to be made) or `Answered` (its answer is stored; its tool calls are left to run)."""

    side: Side
    number: int
    message_id: uuid.UUID  # the step's assistant message: the pending one the call streams into, or the answer
    agent: AgentDefinition  # the thread's agent as the step began (a handoff switches it, §7.3)
    config: SideConfig  # the acting side's config, for its session tool bindings
    env: types.Env


@dataclass
class Opened(Step):
    """A step whose model call is to be made: the request, announced in the opening transaction."""

    request: LLMRequest
    requests_before: int  # requests made to the model before this step's, counted at its announce
    message: tables.Message  # the pending message as the opening transaction committed it

    def answered(self, response: LLMResponse) -> Answered:
        """The same step once its answer is stored: the answer's tool calls to run."""
        who = {f.name: getattr(self, f.name) for f in fields(Step)}
        return Answered(**who, response=response, calls=list(response.tool_calls))


@dataclass
class Answered(Step):
    """A step whose answer is stored: its tool calls still to run (`state.queue_tool` may add some); a step resumed
    after a crash or a subagent's result starts here."""

    response: LLMResponse
    calls: list[ToolCall] = field(default_factory=list)
