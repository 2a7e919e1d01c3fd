"""How a process logs: one handler on stderr (stdout is for what a command prints), the text or JSON format, and
the libraries' chatter (pgserver and the `initdb` output it relays, alembic, httpx) at WARNING unless `--verbose`."""

from __future__ import annotations

import copy
import logging
from typing import Any

import uvicorn.config

from app import jsonlog

# INFO lines on every start, every migration check (`GET /ready`), every command, every request to a model (its log
# row says more: `GET /threads/{id}/logs`)
CHATTY = ("pgserver", "alembic", "httpx")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(level: str, json_format: bool, *, verbose: bool, quiet: bool) -> None:
    """The root logger at `level` (`quiet`: at WARNING at least, for commands whose output is what they print)."""
    chosen = logging.getLevelName(level.upper())
    if quiet and not verbose:
        chosen = max(chosen, logging.WARNING)
    logging.basicConfig(level=chosen, format=FORMAT)  # basicConfig's handler writes to stderr
    if json_format:
        for handler in logging.getLogger().handlers:
            handler.setFormatter(jsonlog.Formatter())
    for name in CHATTY:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else max(chosen, logging.WARNING))


def uvicorn_text() -> dict[str, Any]:
    """uvicorn's own text logging, its access lines on stderr too (its default writes them to stdout)."""
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["handlers"]["access"]["stream"] = "ext://sys.stderr"
    return config
