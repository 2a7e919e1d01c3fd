"""The prompts of the `launch` example: a coordinator (lead and client), a QA team, a researcher, a polisher."""

from app.spec import define_prompt

define_prompt(
    name="launch_lead",
    tool_description="Plans the launch note and delegates.",
    model="launch_team",
    prompt="Lead: plan the launch note; use the researcher, the QA team and the polisher.",
    include_chat=True,
    include_past_tools=True,
    tools=[
        {"name": "qa_team"},  # a blocking subagent (the default)
        {"name": "researcher", "blocking": False, "resumable": {"receives_messages": "side_a", "max_instances": 2}},
        {"name": "polish", "include_tool_calls": False},  # a subprompt
        {"name": "publisher", "optional": "PUBLISH", "blocking": False},  # only with PUBLISH=yes; needs CMS_TOKEN
    ],
)
define_prompt(name="launch_client", tool_description="Accepts or rejects the note.", model="launch_team",
              prompt="Client: accept a good launch note.", include_chat=True)  # fmt: skip
define_prompt(name="qa_worker", tool_description="Writes drafts.", model="launch_team",
              prompt="Worker: write the draft as a file.", include_chat=True, include_past_tools=True,
              tools=["write_draft"])  # fmt: skip
define_prompt(name="qa_reviewer", tool_description="Reviews drafts.", model="launch_team",
              prompt="Reviewer: approve a good draft with its file, or reject it.", include_chat=True)  # fmt: skip
define_prompt(name="research", tool_description="Finds facts.", model="launch_team",
              prompt="Researcher: find facts.", include_chat=True)  # fmt: skip
define_prompt(name="research_check", tool_description="Checks findings.", model="launch_team",
              prompt="Checker: hand the findings back.", include_chat=True)  # fmt: skip
define_prompt(name="polish", tool_description="Polishes a sentence.", model="launch_team",
              prompt="Polisher: make the text shine.")  # fmt: skip
define_prompt(name="publish", tool_description="Publishes a note.", model="launch_team",
              prompt="Publisher: publish the note with the CMS token.", include_chat=True)  # fmt: skip
define_prompt(name="publish_check", tool_description="Confirms publication.", model="launch_team",
              prompt="Editor: confirm the publication.", include_chat=True)  # fmt: skip
