"""Test-only fault injection: make a worker process exit at a named point of a step.

Set ``TOOLKIT_FAULT_POINT`` to one of :data:`POINTS` or :data:`PURE_STEP` (and optionally
``TOOLKIT_FAULT_STEP`` to a step id) in a worker's environment, and the process calls
``os._exit`` there, as a crash would: no cleanup, no release, no atexit. Unset, every
check is one comparison. Crash tests use it to prove what happens after a crash at each
point (DESIGN §2, "Effect").
"""

from __future__ import annotations

import os

#: The named points, in the order an effect passes them.
POINTS = ("before_intent", "after_intent", "during_call", "after_call", "after_commit")
#: The point before each pure step (``choice``, ``set``, ``succeed``, ``fail``) runs.
PURE_STEP = "pure_step"
#: The exit status of a process stopped by a fault.
FAULT_EXIT_CODE = 97

_POINT = os.environ.get("TOOLKIT_FAULT_POINT") or None
_STEP = os.environ.get("TOOLKIT_FAULT_STEP") or None

#: True when a fault is armed in this process.
ARMED = _POINT is not None


def fault_point(point: str, step: str) -> None:
    """Exit the process at once if the armed fault names ``point`` (and ``step``).

    Args:
        point: one of :data:`POINTS`, or :data:`PURE_STEP`.
        step: the step id being executed.
    """
    if point == _POINT and (_STEP is None or _STEP == step):
        os._exit(FAULT_EXIT_CODE)
