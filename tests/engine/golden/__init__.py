"""The golden-history scenarios, one module per group; importing the package registers them
all (``tests.helpers.golden.scenario``) for ``tests/engine/test_golden.py``.

A new scenario: an ``async def NAME(run)`` decorated with ``@scenario()`` in the module of its
group; its golden file ``tests/corpus/golden/NAME.json`` is written on its first run.
"""

from tests.engine.golden import examples, features, steps

__all__ = ["examples", "features", "steps"]
