"""The interpreter: resume a task from its checkpoint and run its steps (DESIGN §2, §4).

``interpreter`` runs one cycle; ``cycle`` holds its state and its fenced writes;
``protocol`` is what every step kind returns and the one loop that applies it; the kinds are
one module each under ``steps``; ``attempts`` (with ``callbacks`` and ``limits``) decides
what an attempt at an effect came to; ``reservations``, ``compensation`` and ``deadline``
are the budget, saga and workflow-deadline rules; ``task`` is the task's own level.
"""

from toolkit.engine.cycle import CycleControl, CycleOutcome
from toolkit.engine.failures import error_data, storable_text
from toolkit.engine.interpreter import Interpreter

__all__ = ["CycleControl", "CycleOutcome", "Interpreter", "error_data", "storable_text"]
