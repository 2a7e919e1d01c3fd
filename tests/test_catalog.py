"""`app.catalog`: loading the agents folder, and the problems it reports."""

from __future__ import annotations

import dataclasses
import gc
from pathlib import Path

import pytest

from app import catalog
from app.errors import AgentNotFound
from app.spec.definitions import VariableDefinition

FIXTURES = Path(__file__).parent / "fixtures" / "catalog"


@pytest.fixture(scope="module")
def good() -> catalog.Catalog:
    return catalog.load(FIXTURES / "good")


def test_good_folder_loads(good: catalog.Catalog) -> None:
    assert sorted(good.models) == ["backup", "scripted"]
    assert sorted(good.prompts) == [
        "asset_reviewer",
        "asset_worker",
        "billing_prompt",
        "company_tone",
        "polish_text",
        "support_agent",
    ]
    assert sorted(good.agents) == ["asset_subagent", "billing", "support"]
    assert sorted(good.tools) == ["get_weather", "submit_asset"]  # tools/_helpers.py is skipped
    assert good.warnings == ()
    assert catalog.check(FIXTURES / "good") == []


def test_both_spellings_are_accepted(good: catalog.Catalog) -> None:
    assert good.models["backup"].chunk_size == 4  # chunkSize=
    assert good.models["scripted"].chunk_size == 8  # chunk_size=
    support = good.prompts["support_agent"]
    assert support.include_chat
    assert support.include_past_tools
    assert support.tool_description == "Answers support questions."
    reviewer = good.agents["asset_subagent"].side_b
    assert reviewer is not None
    assert reviewer.stop_on_response is False
    stop = reviewer.binding("stop")
    assert stop is not None
    assert (stop.name, stop.message_property) == ("approve_asset", "summary")


def test_tool_is_named_after_its_file(good: catalog.Catalog) -> None:
    tool = good.tools["get_weather"]
    assert tool.name == "get_weather"
    assert tool.fn.__name__ == "weather"
    assert [v.type for v in tool.variables] == ["secret"]


def test_tool_parameters_are_closed(good: catalog.Catalog) -> None:
    schema = good.tools["get_weather"].parameters()
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["place"]
    assert schema["$defs"]["Place"]["additionalProperties"] is False
    assert good.tools["submit_asset"].parameters() == {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }


def test_kind_of(good: catalog.Catalog) -> None:
    assert good.kind_of("get_weather") == "callable"
    assert good.kind_of("polish_text") == "prompt"
    assert good.kind_of("asset_subagent") == "agent"
    assert good.kind_of("billing") == "agent"
    assert good.kind_of("nothing") is None


def test_variables_of_agent_walk_the_whole_graph(good: catalog.Catalog) -> None:
    names = [v.name for v in good.variables_of_agent("support")]
    # its prompt, the callable, the subagent's side B prompt, the handoff target
    assert sorted(names) == ["BILLING_ACCOUNT", "PRODUCT_INVENTORY", "REVIEW_STYLE", "WEATHER_API_KEY"]
    assert [v.name for v in good.variables_of_agent("asset_subagent")] == ["REVIEW_STYLE"]


def test_walking_the_graph_leaves_no_garbage_for_the_collector(good: catalog.Catalog) -> None:
    """A step walks the agent's graph (its variables, its secrets' names); nested functions calling themselves made
    each walk a reference cycle, garbage that only the collector's full passes free."""
    gc.collect()
    gc.disable()
    try:
        good.variables_of_agent("support")
        good.unresolved("support", set(), scoped=False)
        good.unresolved("support", set(), scoped=True)
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_unknown_agent(good: catalog.Catalog) -> None:
    assert good.agent("support").type == "ai_human"
    with pytest.raises(AgentNotFound, match="Agent `nope` does not exist"):
        good.agent("nope")
    with pytest.raises(AgentNotFound):
        good.variables_of_agent("nope")


def test_catalog_is_immutable(good: catalog.Catalog) -> None:
    with pytest.raises(TypeError):
        good.models["other"] = good.models["backup"]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        good.root = Path()  # type: ignore[misc]


def test_empty() -> None:
    empty = catalog.empty()
    assert not empty.models
    assert not empty.agents
    assert empty.kind_of("x") is None


# folder, file (relative to the fixtures folder), field, something the fix says
BAD = [
    ("bad_unknown_field", "prompts/support.py", "includeChats", "did you mean `includeChat`?"),
    ("bad_missing_model_ref", "prompts/support.py", "model", "use one of: main"),
    ("bad_include_cycle", "prompts/a.py", "prompt[0].prompt", "remove one of these includes"),
    ("bad_secret_env_part", "prompts/support.py", "prompt[1].property", "state.env"),
    ("bad_tool_ref", "prompts/support.py", "tools[0]", "define it in tools/"),
    ("bad_hook_ref", "prompts/support.py", "hooks[1]", "define it in hooks/ or use one of: last_50"),
    ("bad_dual_ai_no_side_b", "agents/pair.py", "side_b", "add `side_b`"),
    ("bad_syntax_error", "tools/broken.py", "", "syntax"),
    ("bad_wrong_kind_field", "prompts/support.py", "tools[1].blocking", "applies to subagents only"),
    ("bad_duplicate_name", "prompts/support_v2.py", "name", "rename"),
    ("bad_stop_tool", "agents/support.py", "side_a.stop_tool", "add it to the tools of prompt `support`"),
    ("bad_reserved_name", "prompts/subagent_message.py", "name", "rename"),
    ("bad_not_exposed", "prompts/boss.py", "tools[0]", "expose_as_tool=True"),
    ("bad_session_binding", "agents/pair.py", "side_b.session_stop", "callable tool"),
    ("bad_wrong_folder", "models/main.py", "", "move it to prompts/"),
    ("bad_name_clash", "prompts/support.py", "tools[0]", "share one namespace"),
    ("bad_fallback", "models/main.py", "fallbacks[0]", "define it in models/"),
    ("bad_runtime_error", "tools/zero_timeout.py", "", "fix"),
    ("bad_missing_field", "agents/support.py", "sideA.prompt", "add `prompt`"),
    ("bad_literal_value", "prompts/support.py", "tools[0].resumable.receivesMessages", "'side_a', 'side_b'"),
    ("bad_nested_field", "agents/support.py", "side_a.session_stop.mesage_property", "`message_property`"),
]


@pytest.mark.parametrize(("folder", "file", "field", "fix"), BAD, ids=[b[0] for b in BAD])
def test_bad_folder(folder: str, file: str, field: str, fix: str) -> None:
    with pytest.raises(catalog.CatalogError) as caught:
        catalog.load(FIXTURES / folder)
    problems = caught.value.problems
    assert len(problems) == 1, [str(p) for p in problems]  # one defect, one problem: no follow-on noise
    problem = problems[0]
    assert (problem.file, problem.field, problem.severity) == (f"{folder}/{file}", field, "error")
    assert problem.message
    assert fix in problem.fix
    assert caught.value.code == "catalog_invalid"
    assert caught.value.message == f"1 problem in {FIXTURES / folder}"


def test_every_bad_folder_has_a_case() -> None:
    folders = {p.name for p in FIXTURES.iterdir() if p.name.startswith("bad_")}
    assert folders == {b[0] for b in BAD}


def test_check_reports_without_raising() -> None:
    [problem] = catalog.check(FIXTURES / "bad_missing_model_ref")
    assert str(problem) == (
        "bad_missing_model_ref/prompts/support.py: model: unknown model `fast`"
        " — fix: define it in models/ or use one of: main"
    )


def test_missing_root(tmp_path: Path) -> None:
    [problem] = catalog.check(tmp_path / "nowhere")
    assert problem.severity == "error"
    assert "does not exist" in problem.message
    with pytest.raises(catalog.CatalogError):
        catalog.load(tmp_path / "nowhere")


def test_empty_root_is_an_empty_catalog(tmp_path: Path) -> None:
    loaded = catalog.load(tmp_path)
    assert (dict(loaded.models), dict(loaded.agents), loaded.warnings) == ({}, {}, ())


def test_warnings_do_not_stop_loading() -> None:
    loaded = catalog.load(FIXTURES / "warn_only")
    found = {(p.file, p.field) for p in loaded.warnings}
    assert found == {
        ("warn_only/prompts/worker.py", "tenvs"),  # the deprecated `tenvs`, read as `env`
        ("warn_only/agents/pair.py", "side_a.prompt"),  # include_chat false
        ("warn_only/agents/pair.py", "side_b.prompt"),
        ("warn_only/agents/pair.py", "max_session_turns"),
        ("warn_only/agents/pair.py", ""),  # no terminal tool
    }
    assert all(p.severity == "warning" and p.fix for p in loaded.warnings)
    assert loaded.prompts["worker"].env == {"MODE": "fast"}
    assert catalog.check(FIXTURES / "warn_only") == list(loaded.warnings)
    include_chat = next(p for p in loaded.warnings if p.field == "side_a.prompt")
    assert str(include_chat).startswith("warn_only/agents/pair.py: side_a.prompt: warning: ")


def test_problems_of_one_file_are_all_reported(tmp_path: Path) -> None:
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "p.py").write_text(
        "from app.spec import define_prompt\n"
        "define_prompt(name='p', model='m', prompt=[{'type': 'env', 'propery': 'X'}],"
        " toolChoice='sometimes')\n"
    )
    problems = {p.field: p for p in catalog.check(tmp_path)}
    assert set(problems) == {"prompt[0].property", "prompt[0].propery", "toolChoice"}
    assert problems["prompt[0].property"].fix == "add `property`"
    assert problems["prompt[0].propery"].fix == "remove `propery` (did you mean `property`?)"
    assert problems["toolChoice"].fix == "use one of: 'auto', 'none', 'required'"


def test_tool_file_defines_one_tool(tmp_path: Path) -> None:
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "two.py").write_text(
        "from app.spec import define_tool\n"
        "@define_tool(description='a')\nasync def a(state): return 'a'\n"
        "@define_tool(description='b')\nasync def b(state): return 'b'\n"
    )
    [problem] = catalog.check(tmp_path)
    assert (problem.file, problem.message) == (f"{tmp_path.name}/tools/two.py", "defines 2 tools")


def test_hook_is_named_after_its_file(good: catalog.Catalog) -> None:
    hook = good.hooks["last_50"]
    assert (hook.name, hook.hook, hook.fn.__name__) == ("last_50", "filter_messages", "keep_recent")


def test_agent_hooks_must_exist(tmp_path: Path) -> None:
    for folder in ("models", "prompts", "agents"):
        (tmp_path / folder).mkdir()
    (tmp_path / "models" / "m.py").write_text(
        "from app.spec import define_model\ndefine_model(name='m', provider='test', script=['ok'])\n"
    )
    (tmp_path / "prompts" / "p.py").write_text(
        "from app.spec import define_prompt\ndefine_prompt(name='p', model='m', prompt='x', include_chat=True)\n"
    )
    (tmp_path / "agents" / "a.py").write_text(
        "from app.spec import define_agent\ndefine_agent(name='a', side_a={'prompt': 'p'}, hooks=['trim'])\n"
    )
    [problem] = catalog.check(tmp_path)
    assert (problem.file, problem.field, problem.message) == (
        f"{tmp_path.name}/agents/a.py",
        "hooks[0]",
        "unknown hook `trim`",
    )
    assert problem.fix == "define it in hooks/ or nothing is defined yet"


def test_hook_file_defines_one_hook(tmp_path: Path) -> None:
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "two.py").write_text(
        "from app.spec import define_hook\n"
        "@define_hook('filter_messages')\nasync def a(state, messages): return messages\n"
        "@define_hook('filter_messages')\nasync def b(state, messages): return messages\n"
    )
    [problem] = catalog.check(tmp_path)
    assert (problem.file, problem.message) == (f"{tmp_path.name}/hooks/two.py", "defines 2 hooks")


def test_a_provider_tool_is_refused_with_the_reason(tmp_path: Path) -> None:
    """Provider-executed tools are not supported (README "Provider tools"): the problem says so, not "unknown"."""
    for folder, text in (
        ("models", "from app.spec import define_model\ndefine_model(name='m', provider='test', script=['ok'])\n"),
        ("prompts", "from app.spec import define_prompt\ndefine_prompt(name='p', model='m', prompt='s', "
                    "tools=['web_search', 'lookup'])\n"),
    ):  # fmt: skip
        (tmp_path / folder).mkdir()
        (tmp_path / folder / f"{folder[0]}.py").write_text(text)
    problems = {p.field: p for p in catalog.check(tmp_path)}
    provider, unknown = problems["tools[0]"], problems["tools[1]"]
    assert provider.message.startswith("`web_search` is a provider-executed tool; this runtime runs only its own")
    assert (
        provider.fix
        == "write a callable in tools/web_search.py that calls the service you want (README: Provider tools)"
    )
    assert unknown.message == "unknown tool `lookup`" and unknown.fix.endswith(
        "(provider-executed tools are not supported)"
    )


def test_a_variable_without_a_description_has_the_empty_one() -> None:
    """The spec's `VariableDefinition.description` is `""` when not provided (seeds/002), `None` included."""
    assert VariableDefinition(name="X").description == ""
    assert VariableDefinition.model_validate({"name": "X", "description": None}).description == ""
    assert VariableDefinition.model_validate({"name": "X", "description": "the x"}).description == "the x"
