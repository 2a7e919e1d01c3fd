"""How a process logs: the libraries' INFO chatter is left out unless `--verbose`."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from app import logconfig


@pytest.fixture
def levels() -> Iterator[None]:
    kept = {name: logging.getLogger(name).level for name in logconfig.CHATTY}
    yield
    for name, level in kept.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.usefixtures("levels")
def test_a_request_to_a_model_logs_no_line_of_httpx_unless_verbose() -> None:
    logconfig.configure("info", False, verbose=False, quiet=False)
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)  # the request's log row says more
    assert logging.getLogger("httpx").isEnabledFor(logging.WARNING)
    logconfig.configure("info", False, verbose=True, quiet=False)
    assert logging.getLogger("httpx").level == logging.NOTSET  # as the root logger is set
