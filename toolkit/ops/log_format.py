"""Log formatting for the ``toolkit`` command: readable text, or one JSON object per line.

The library only logs through module loggers with a stable ``action`` key and task, worker
and token fields in ``extra`` (STYLE.md); it never configures handlers. The CLI picks a
formatter from this module.
"""

from __future__ import annotations

import json
import logging
from typing import Any

#: Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, and every ``extra`` field."""

    def format(self, record: logging.LogRecord) -> str:
        """Render ``record`` as a JSON line."""
        data: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_extras(record),
        }
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


class TextFormatter(logging.Formatter):
    """Readable lines: time, level, logger, message, then ``key=value`` extras.

    A traceback follows on the next lines, after the extras.
    """

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        """The record's first line: the format's fields and its extras."""
        line = super().formatMessage(record)
        extras = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        return f"{line} [{extras}]" if extras else line
