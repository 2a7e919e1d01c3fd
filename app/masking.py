"""Secret masking: every known secret value in a text, or in JSON-like data, replaced by `***` (the one rule for
logs, events, stored results and provider errors)."""

from __future__ import annotations

from typing import Any


def scrub(text: str, secrets: list[str]) -> str:
    """`text` with every known secret value replaced by `***` (give them longest first, as `Env.secrets` does, so
    none is left half-masked)."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def scrub_data(value: Any, secrets: list[str]) -> Any:
    """JSON-like data with `scrub` applied to every string in it, keys too."""
    if isinstance(value, str):
        return scrub(value, secrets)
    if isinstance(value, dict):
        return {scrub_data(k, secrets): scrub_data(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub_data(v, secrets) for v in value]
    return value
