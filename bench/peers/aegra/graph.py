"""Benchmark graphs for Aegra: a deterministic, zero-latency fake chat model.

Three graphs are registered in aegra.json:

* ``chat`` - one LLM step per run: ``model`` node -> END. The model answers with
  a fixed text (REPLY) streamed as a single chunk.
* ``tool`` - two LLM steps and one tool call per run: ``model`` asks for the
  ``lookup`` tool, ``tools`` runs it (returns a fixed string), ``model`` answers
  with REPLY. The routing is the usual "tool_calls? -> tools : END".

No network, no sleep, no randomness: the server's own overhead is what is measured.

* ``stream`` (benchmark B4) - a real model client over HTTP: ``langchain-openai``'s ``ChatOpenAI`` (streaming, usage
  requested) against ``fake_llm.py`` at ``$FAKE_LLM_URL``, bound to the tool ``lookup_slow``; LangGraph's prebuilt
  ``ToolNode`` runs the calls (concurrently: asyncio.gather), each sleeping 0.5 s (asyncio) and returning "42". The
  fake model asks for 3 calls of ``lookup_slow`` when the user spoke last, then answers in 10 timestamped chunks.
  Async nodes throughout (``ainvoke``): a sync node would run in a small thread pool and cap concurrency.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.tools import tool as as_tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

REPLY = "pong: the deterministic fake model answered."
TOOL_NAME = "lookup"
TOOL_RESULT = "42"


class FakeChatModel(BaseChatModel):  # type: ignore[misc]  # LangChain is not in our venv (pyproject)
    """Answers instantly. With ``use_tool`` it first asks for one tool call per user turn."""

    use_tool: bool = False

    @property
    def _llm_type(self) -> str:
        return "bench-fake"

    def _reply(self, messages: list[BaseMessage]) -> AIMessage:
        last = messages[-1] if messages else None
        if self.use_tool and (last is None or last.type == "human"):
            call_id = f"call_{len(messages)}"
            return AIMessage(content="", tool_calls=[{"name": TOOL_NAME, "args": {"q": "answer"}, "id": call_id}])
        return AIMessage(content=REPLY)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._reply(messages))])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        # One chunk carrying the whole message: comparable to a test provider
        # that emits the full reply at once.
        msg = self._reply(messages)
        chunk = ChatGenerationChunk(
            message=AIMessageChunk(
                content=msg.content,
                tool_call_chunks=[
                    {"name": tc["name"], "args": '{"q": "answer"}', "id": tc["id"], "index": i}
                    for i, tc in enumerate(msg.tool_calls)
                ],
            )
        )
        if run_manager:
            run_manager.on_llm_new_token(str(msg.content), chunk=chunk)
        yield chunk


def _build(use_tool: bool) -> Any:
    model = FakeChatModel(use_tool=use_tool)

    def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    def run_tools(state: MessagesState) -> dict[str, list[BaseMessage]]:
        last = state["messages"][-1]
        return {
            "messages": [
                ToolMessage(content=TOOL_RESULT, tool_call_id=tc["id"], name=tc["name"])
                for tc in getattr(last, "tool_calls", [])
            ]
        }

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if getattr(last, "tool_calls", None) else END

    builder = StateGraph(MessagesState)
    builder.add_node("model", call_model)
    builder.add_edge(START, "model")
    if use_tool:
        builder.add_node("tools", run_tools)
        builder.add_conditional_edges("model", route, ["tools", END])
        builder.add_edge("tools", "model")
    else:
        builder.add_edge("model", END)
    return builder.compile()


chat = _build(use_tool=False)
tool = _build(use_tool=True)

STREAM_TOOL = "lookup_slow"  # the name fake_llm.py calls (--tool-name); ours: bench/peers/agents/tools/lookup_slow.py
TOOL_SLEEP_S = 0.5


@as_tool(STREAM_TOOL)  # type: ignore[untyped-decorator]  # LangChain is not in our venv (pyproject)
async def lookup_slow(q: str) -> str:
    """Look a fact up (slowly)."""
    await asyncio.sleep(TOOL_SLEEP_S)
    return TOOL_RESULT


def _build_stream() -> Any:
    try:
        from langchain_openai import ChatOpenAI
    except ImportError:  # a venv made for the `chat`/`tool` graphs only (run.sh installs it when GRAPHS has stream)
        ChatOpenAI = None
    model = None
    if ChatOpenAI is not None:
        model = ChatOpenAI(
            model="fake",
            # unset: a closed port, so a run fails at once instead of calling anything else
            base_url=os.environ.get("FAKE_LLM_URL", "http://127.0.0.1:9/v1"),
            api_key="bench",  # the fake server takes any
            streaming=True,
            stream_usage=True,  # ask for `usage`, as our server always does (stream_options.include_usage)
        ).bind_tools([lookup_slow], parallel_tool_calls=True)  # sent as ours sends it (prompt parallel_tool_calls=True)

    async def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        if model is None:
            raise RuntimeError("the `stream` graph needs langchain-openai in Aegra's venv")
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", call_model)
    builder.add_node("tools", ToolNode([lookup_slow]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition, ["tools", END])
    builder.add_edge("tools", "model")
    return builder.compile()


stream = _build_stream()
