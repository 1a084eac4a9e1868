"""The step kinds, one module each behind one protocol (``toolkit.engine.protocol``).

Each module exports ``KIND``, a :class:`~toolkit.engine.protocol.StepKind` whose ``run``
returns what its step came to. The kinds do not know each other: a parallel or map step runs
its branches' steps through the kinds it is handed (``StepContext.kinds``).
"""
