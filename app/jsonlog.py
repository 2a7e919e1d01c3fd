"""`LOG_FORMAT=json`: one JSON object per log line, for log shippers (time, level, logger, message, exception)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime


class Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:  # set already when `tokens.Masked` has masked it
            line["exception"] = record.exc_text
        return json.dumps(line, ensure_ascii=False)
