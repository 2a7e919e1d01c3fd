"""Context assembly (`app/engine/context.py`): variables, secret masking, prompt rendering, the tools offered, the
request built. Pure functions, but for `load_env`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app import environment, keys, masking, threads
from app.catalog import Catalog
from app.engine import context, transcript, types
from app.spec import ThreadState, define_agent, define_model, define_tool
from app.spec.definitions import PromptDefinition, SideConfig
from tests.test_engine_transcript import IMAGE, prompt, row, shown


def text(value: str) -> environment.Value:
    return environment.Value(value, "text")


def secret(value: str) -> environment.Value:
    return environment.Value(value, "secret")


# -- scrub ------------------------------------------------------------------------------------------------


def test_scrub_replaces_every_occurrence_and_ignores_empty_secrets() -> None:
    assert masking.scrub("a-sk-1-b-sk-1", ["", "sk-1"]) == "a-***-b-***"


def test_scrub_in_the_order_given_leaves_a_longer_secret_half_masked() -> None:
    """Why `Env.secrets` sorts longest first."""
    assert masking.scrub("abcdef", ["abc", "abcdef"]) == "***def"
    assert masking.scrub("abcdef", ["abcdef", "abc"]) == "***"


def test_scrub_data_masks_keys_and_nested_values_and_keeps_other_scalars() -> None:
    data = {"tok": {"list": ("tok", None, 1.5, True)}, 3: "x tok"}
    assert masking.scrub_data(data, ["tok"]) == {"***": {"list": ["***", None, 1.5, True]}, 3: "x ***"}


# -- prompts ----------------------------------------------------------------------------------------------


class QueryArgs(BaseModel):
    q: str


@define_tool(description="Look something up.")
async def lookup(state: ThreadState, args: QueryArgs) -> str:
    return args.q


@define_tool(description="A callable that is also a session tool.")
async def finish(state: ThreadState) -> str:
    return "finished"


def catalog(*prompts: PromptDefinition, agents: dict[str, Any] | None = None, images: bool = True) -> Catalog:
    model = define_model(
        name="m",
        provider="test",
        model="test-1",
        script=["x"],
        capabilities={"supports_images": images},
        provider_options={"temperature": 0.1, "top_p": 0.5},
    )
    defined = {p.name: p for p in prompts}
    return Catalog(
        root=Path("."),
        models={"m": model},
        prompts=defined,
        agents={name: define_agent(name=name, **fields) for name, fields in (agents or {}).items()},
        tools={t.name: t for t in (lookup, finish)},
    )


EMPTY_ENV = types.Env(thread={}, agent={}, prompt={})


def test_render_expands_includes_and_variables_in_order() -> None:
    header = prompt("header", prompt=[{"type": "text", "content": "Hello "}, {"type": "env", "property": "WHO"}])
    main = prompt("main", prompt=[{"type": "include", "prompt": "header"}, {"type": "text", "content": "."}])
    cat = catalog(header, main)
    rendered = context.render_prompt(cat, main, types.Env(thread={"WHO": text("Ada")}, agent={}, prompt={}))
    assert rendered == "Hello Ada."


def test_render_refuses_a_secret_and_a_missing_variable() -> None:
    main = prompt("main", prompt=[{"type": "env", "property": "KEY"}])
    cat = catalog(main)
    with pytest.raises(types.SecretInPrompt, match="never rendered"):
        context.render_prompt(cat, main, types.Env(thread={"KEY": secret("sk")}, agent={}, prompt={}))
    with pytest.raises(types.SecretInPrompt):  # declared secret, even with a plain value from the agent
        context.render_prompt(
            cat, main, types.Env(thread={}, agent={"KEY": "v"}, prompt={}, declared_secret=frozenset({"KEY"}))
        )
    with pytest.raises(types.MissingVariable):
        context.render_prompt(cat, main, EMPTY_ENV)


def test_a_plain_string_prompt_is_not_interpreted() -> None:
    main = prompt("main", prompt="Use {WHO} literally.")
    assert context.render_prompt(catalog(main), main, EMPTY_ENV) == "Use {WHO} literally."


# -- offered tools ----------------------------------------------------------------------------------------


def test_session_tool_schema_requires_the_mapped_properties() -> None:
    config = SideConfig(
        prompt="p",
        session_stop={"name": "done", "message_property": "summary", "attachments_property": "files"},
        session_status="status",
    )
    schema = context.session_tool_schema(config, "done")
    assert schema["required"] == ["files", "summary"]
    assert schema["properties"]["files"] == {"type": "array", "items": {"type": "string"}}
    assert schema["additionalProperties"] is False
    assert context.session_tool_schema(config, "status")["properties"] == {}


def test_offered_tools_name_what_backs_each_tool() -> None:
    helper = prompt("helper", tool_description="Ask the helper.")
    main = prompt("main", tools=["lookup", "helper", "desk", "team", "ghost"])
    agents = {
        "desk": {"side_a": {"prompt": "helper"}, "tool_description": "A human desk."},
        "team": {
            "type": "dual_ai",
            "side_a": {"prompt": "helper"},
            "side_b": {"prompt": "helper"},
            "tool_description": "A team.",
        },
    }
    config = SideConfig(prompt="main", session_stop="finish", session_fail="give_up")
    offered = {t.name: t for t in context.offered_tools(catalog(helper, main, agents=agents), main, config)}
    kinds = {name: t.kind for name, t in offered.items()}
    assert kinds == {
        "lookup": "callable",
        "helper": "subprompt",
        "desk": "handoff",
        "team": "subagent",
        "finish": "callable",  # a session tool a callable backs runs as that callable
        "give_up": "session",
    }
    assert offered["lookup"].parameters["required"] == ["q"]
    assert offered["helper"].parameters["additionalProperties"] is False
    assert offered["desk"].parameters == context.HANDOFF_SCHEMA


def test_a_session_tool_already_offered_by_the_prompt_is_offered_once() -> None:
    main = prompt("main", tools=["lookup"])
    config = SideConfig(prompt="main", session_stop="lookup")
    names = [t.name for t in context.offered_tools(catalog(main), main, config)]
    assert names == ["lookup"]


TEAM = {
    "type": "dual_ai",
    "side_a": {"prompt": "helper"},
    "side_b": {"prompt": "helper"},
    "tool_description": "A team.",
}


@pytest.mark.parametrize(("flag", "offered"), [(None, False), ("no", False), ("Yes", True), (" 1 ", True)])
def test_an_optional_subagent_is_offered_only_when_its_flag_is_on(flag: str | None, offered: bool) -> None:
    helper = prompt("helper")
    main = prompt("main", tools=[{"name": "team", "optional": "USE_TEAM"}])
    flags = {"USE_TEAM": text(flag)} if flag is not None else {}
    layered = types.Env(thread=flags, agent={}, prompt={})
    names = [
        t.name
        for t in context.offered_tools(
            catalog(helper, main, agents={"team": TEAM}), main, SideConfig(prompt="main"), layered
        )
    ]
    assert names == (["team"] if offered else [])


def test_resumable_subagents_are_reached_through_create_and_message_tools() -> None:
    helper = prompt("helper")
    main = prompt("main", tools=[{"name": "team", "resumable": {"receives_messages": "side_a"}}])
    offered = context.offered_tools(catalog(helper, main, agents={"team": TEAM}), main, SideConfig(prompt="main"))
    assert [(t.name, t.kind) for t in offered] == [
        ("subagent_create", "subagent_create"),
        ("subagent_message", "subagent_message"),
    ]
    assert offered[0].parameters["properties"]["agent"]["enum"] == ["team"]
    assert "`team` (A team.)" in offered[0].description


# -- build_request ----------------------------------------------------------------------------------------


def test_a_request_starts_with_the_rendered_prompt_and_carries_the_prompt_settings() -> None:
    main = prompt(
        "p",
        prompt=[{"type": "text", "content": "Hi "}, {"type": "env", "property": "WHO"}],
        tools=["lookup"],
        tool_choice="required",
        parallel_tool_calls=True,
        reasoning={"effort": "low"},
        provider_options={"temperature": 0.9},
    )
    config = SideConfig(prompt="p", session_stop="done")
    layered = types.Env(thread={}, agent={}, prompt={"WHO": "Bob"})
    request = context.build_request(catalog(main), main, config, "a", [row("user", "q")], 0, layered)
    assert request.model == "test-1"
    assert shown(request.messages) == [("system", "Hi Bob"), ("user", "q")]
    assert [t.name for t in request.tools] == ["lookup", "done"]
    assert (request.tool_choice, request.parallel_tool_calls) == ("required", True)
    assert request.reasoning == {"effort": "low", "exclude": False}
    assert request.provider_options == {"temperature": 0.9, "top_p": 0.5}  # the prompt's win over the model's


def test_only_the_most_recent_messages_keep_their_images() -> None:
    main = prompt("p", include_chat=True, recent_image_threshold=1)
    rows = [row("user", "first", attachments=[IMAGE]), row("user", "second", attachments=[IMAGE])]
    request = context.build_request(catalog(main), main, SideConfig(prompt="p"), "a", rows, 0, EMPTY_ENV)
    assert [len(m.images) for m in request.messages] == [0, 0, 1]


def test_leaving_out_old_images_leaves_the_kept_messages_as_they_were() -> None:
    """The thread's transcript keeps its messages between requests: a request drops old images from its own copies."""
    kept, config = transcript.Transcript(), SideConfig(prompt="p")
    strict, lenient = prompt("p", include_chat=True, recent_image_threshold=1), prompt("p", include_chat=True)
    rows = [row("user", "first", attachments=[IMAGE]), row("user", "second", attachments=[IMAGE])]
    dropped = context.build_request(catalog(strict), strict, config, "a", rows, 0, EMPTY_ENV, kept=kept)
    assert [len(m.images) for m in dropped.messages] == [0, 0, 1]
    again = context.build_request(catalog(lenient), lenient, config, "a", rows, 0, EMPTY_ENV, kept=kept)
    assert [len(m.images) for m in again.messages] == [0, 1, 1]


def test_a_model_without_image_support_gets_no_images() -> None:
    main = prompt("p", include_chat=True)
    rows = [row("user", "look", attachments=[IMAGE])]
    request = context.build_request(catalog(main, images=False), main, SideConfig(prompt="p"), "a", rows, 0, EMPTY_ENV)
    assert [len(m.images) for m in request.messages] == [0, 0]
    assert "/attachments/cat.png" in (request.messages[1].content or "")  # still named


# -- load_env (real Postgres) -----------------------------------------------------------------------------


async def test_load_env_reads_every_layer_of_a_thread_and_its_declared_secrets(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    fernet = Fernet(Fernet.generate_key())
    main = prompt("p", env={"FROM_PROMPT": "p", "SHARED": "prompt"})
    cat = catalog(
        main,
        agents={
            "agent": {
                "side_a": {"prompt": "p"},
                "env": {"FROM_AGENT": "a", "SHARED": "agent"},
                "variables": [{"name": "DECLARED", "type": "secret"}],
            }
        },
    )
    alice, bob = keys.Principal(user_id="alice"), keys.Principal(user_id="bob")
    async with sessions() as s, s.begin():
        thread = await threads.create(s, cat.agents["agent"], alice)
        await environment.set_thread(s, fernet, thread.id, {"TOKEN": "sk-thread", "SHARED": "thread"}, ["TOKEN"])
        await environment.put(s, fernet, "user", "alice", {"DECLARED": "d-user", "SHARED": "user"}, [])
        await environment.put(s, fernet, "user", "bob", {"OTHER_USER": "never"}, [])
        await environment.put(s, fernet, "instance", environment.INSTANCE, {"REGION": "eu", "SHARED": "instance"}, [])
        other = await threads.create(s, cat.agents["agent"], bob)
        await environment.set_thread(s, fernet, other.id, {"OTHER_THREAD": "never"}, [])
        loaded = await context.load_env(s, fernet, cat, thread, main)
    assert loaded.get("TOKEN") == "sk-thread"  # decrypted for the engine
    assert [loaded.get(n) for n in ("SHARED", "DECLARED", "REGION", "FROM_AGENT", "FROM_PROMPT")] == [
        "thread",
        "d-user",
        "eu",
        "a",
        "p",
    ]
    for absent in ("OTHER_USER", "OTHER_THREAD"):
        with pytest.raises(types.MissingVariable):
            loaded.get(absent)
    assert loaded.is_secret("DECLARED") and loaded.is_secret("TOKEN") and not loaded.is_secret("REGION")
    assert loaded.secrets() == ["sk-thread", "d-user"]  # the declared one is masked though stored as text


async def test_load_env_without_a_prompt_has_no_prompt_layer(sessions: async_sessionmaker[AsyncSession]) -> None:
    main = prompt("p", env={"FROM_PROMPT": "p"})
    cat = catalog(main, agents={"agent": {"side_a": {"prompt": "p"}}})
    async with sessions() as s, s.begin():
        thread = await threads.create(s, cat.agents["agent"], keys.OPEN)
        loaded = await context.load_env(s, Fernet(Fernet.generate_key()), cat, thread, None)
    with pytest.raises(types.MissingVariable):
        loaded.get("FROM_PROMPT")
