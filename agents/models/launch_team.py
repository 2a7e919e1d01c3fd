"""The `launch` example's offline model: one `respond` that plays every prompt of the team, told apart by the first
word of its system prompt. Each role is a small state machine over what it sees, so the example runs the same way
whatever order the subagents finish in.
"""

from app.spec import define_model


def _last(request):
    """The last message before the registry of subagents the runtime appends for a parent."""
    return next(
        m for m in reversed(request.messages) if not (m.role == "system" and m.content.startswith("Subagents of"))
    )


def _tool_results(request):
    return {m.name: m.content for m in request.messages if m.role == "tool"}


def lead(request):
    done = _tool_results(request)
    if "subagent_create" not in done:  # a researcher, non-blocking: its findings arrive later as a message
        message = "Find two facts about the harbour café for its launch note."
        return {
            "tool_calls": [
                {"name": "subagent_create", "arguments": {"agent": "researcher", "message": message, "attachments": []}}
            ]
        }
    if "qa_team" not in done:  # blocking: the lead waits (holding no worker) until the team approves or fails
        return {"tool_calls": [{"name": "qa_team", "arguments": {"message": "Draft the launch note for the café."}}]}
    if "polish" not in done:  # a subprompt: one step, in this thread
        draft = done["qa_team"].split("\n\n")[0]
        return {"tool_calls": [{"name": "polish", "arguments": {"message": draft}}]}
    offered = {t.name for t in request.tools}
    if "publisher" in offered and "publisher" not in done:  # needs a scoped CMS_TOKEN: the bootstrap flow (§6.7)
        return {"tool_calls": [{"name": "publisher", "arguments": {"message": done["polish"]}}]}
    last = _last(request)
    if last.role == "user" and "Published the launch note" in (last.content or ""):
        return "Published: " + last.content.split("\n\n", 1)[1]
    research = [
        m.content
        for m in request.messages
        if m.role == "user" and "has returned" in (m.content or "") and "Published" not in (m.content or "")
    ]
    facts = research[-1].split("\n\n", 1)[1] if research else "(the researcher is still at work)"
    waiting = ""
    if done.get("publisher", "").startswith('Subagent "publisher" requires'):
        waiting = " Publishing waits for CMS_TOKEN: " + done["publisher"].rsplit("via GET/POST ", 1)[1].rstrip(".")
    return f"Launch note ready. {done['polish']} Research: {facts}{waiting}"


def client(request):
    return {"tool_calls": [{"name": "accept", "arguments": {"summary": "Accepted: " + (_last(request).content or "")}}]}


def worker(request):
    if request.messages[-1].role == "tool":
        return "The draft is in /drafts/launch.md."
    text = "# The harbour café opens\n\nCoffee, cake and the best view of the boats, from Saturday."
    return {"tool_calls": [{"name": "write_draft", "arguments": {"text": text}}]}


def reviewer(request):
    summary = "Approved: a short, friendly launch note."
    return {"tool_calls": [{"name": "approve", "arguments": {"summary": summary, "files": ["/drafts/launch.md"]}}]}


def researcher(request):
    return "It opened in 1921 as a fishermen's canteen; its cinnamon buns sell out by ten."


def checker(request):
    facts = next((m.content for m in reversed(request.messages) if m.role == "user" and m.content), "")
    return {"tool_calls": [{"name": "done", "arguments": {"findings": facts}}]}


def publisher(request):
    return "Published the launch note to the café's website."


def editor(request):
    text = next((m.content for m in reversed(request.messages) if m.role == "user" and m.content), "")
    return {"tool_calls": [{"name": "published", "arguments": {"summary": text}}]}


def polish(request):
    return "Polished: " + (request.messages[-1].content or "").replace("Approved: ", "").capitalize()


ROLES = {"Lead": lead, "Client": client, "Worker": worker, "Reviewer": reviewer, "Researcher": researcher,
         "Checker": checker, "Polisher": polish, "Publisher": publisher, "Editor": editor}  # fmt: skip


def respond(request):
    role = (request.messages[0].content or "").split(":", 1)[0]
    return ROLES[role](request)


# prices (USD per million tokens) give each call a cost in `/logs` (the playground's trace shows it); the text streams
# in 4-character chunks 20 ms apart, as a real model's would
define_model(
    name="launch_team",
    provider="test",
    respond=respond,
    input_price=0.4,
    output_price=1.6,
    chunk_size=4,
    chunk_delay_ms=20,
)
