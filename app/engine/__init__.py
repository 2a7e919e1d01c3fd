"""The turn state machine: runs a claimed thread's steps (`semantics.md` §2–§5)."""
