"""The soak's effect: writes a small file when it runs (at least once; again after a crash, with a greater attempt)."""

from pydantic import BaseModel

from app.spec import ThreadState, define_effect


class Args(BaseModel):
    note: str


@define_effect(description="Leaves a trace that it ran.")
async def soak_effect(state: ThreadState, args: Args) -> None:
    effect = state.context["effect"]
    await state.write_file(f"/effects/{effect['id']}.txt", f"{args.note}, attempt {effect['attempt']}", "text/plain")
