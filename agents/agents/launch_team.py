"""The `launch` example: a `dual_ai` coordinator whose lead delegates to subagents (see the README)."""

from app.spec import define_agent

define_agent(
    name="launch",
    type="dual_ai",
    title="Launch note team",
    description="A lead delegates to a QA team (blocking), a researcher (resumable, non-blocking) and a polisher "
    "(a subprompt); a client accepts the result (offline).",
    max_session_turns=4,
    side_a={"label": "Lead", "prompt": "launch_lead", "stop_on_response": True},
    side_b={"label": "Client", "prompt": "launch_client",
            "session_stop": {"name": "accept", "message_property": "summary"}},
)  # fmt: skip
define_agent(
    name="qa_team",
    type="dual_ai",
    title="QA team",
    expose_as_tool=True,
    tool_description="A worker drafts, a reviewer approves (with the file) or rejects.",
    max_session_turns=6,
    side_a={"label": "Worker", "prompt": "qa_worker", "stop_on_response": True},
    side_b={
        "label": "Reviewer",
        "prompt": "qa_reviewer",
        "session_stop": {"name": "approve", "message_property": "summary", "attachments_property": "files"},
        "session_fail": {"name": "reject", "message_property": "reason"},
    },
)
define_agent(
    name="researcher",
    type="dual_ai",
    title="Researcher",
    expose_as_tool=True,
    tool_description="Finds facts and hands them back.",
    max_session_turns=4,
    side_a={"label": "Researcher", "prompt": "research", "stop_on_response": True},
    side_b={"label": "Checker", "prompt": "research_check",
            "session_stop": {"name": "done", "message_property": "findings"}},
)  # fmt: skip
define_agent(
    name="publisher",
    type="dual_ai",
    title="Publisher",
    expose_as_tool=True,
    tool_description="Publishes a note to the café's website.",
    max_session_turns=4,
    variables=[{"name": "CMS_TOKEN", "type": "secret", "required": True, "scoped": True,
                "description": "The website's API token; given to this subagent only."}],
    side_a={"label": "Publisher", "prompt": "publish", "stop_on_response": True},
    side_b={"label": "Editor", "prompt": "publish_check",
            "session_stop": {"name": "published", "message_property": "summary"}},
)  # fmt: skip
