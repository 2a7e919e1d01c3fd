from app.spec import define_agent

define_agent(
    name="haiku_review",
    type="dual_ai",
    title="Haiku with review",
    description="A writer drafts a haiku, a reviewer sends it back until it is right (two AI sides, offline).",
    max_session_turns=6,
    side_a={"label": "Writer", "prompt": "haiku_writer", "stop_on_response": True, "max_steps": 4},
    side_b={
        "label": "Reviewer",
        "prompt": "haiku_reviewer",
        "stop_on_response": True,
        "max_steps": 4,
        "session_stop": {"name": "approve", "message_property": "verdict"},
        "session_fail": {"name": "reject", "message_property": "reason"},
    },
)
