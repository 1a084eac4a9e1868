"""The tests of runifold. They mirror the package (``toolkit/``): a folder per area, a module
per concept inside it, and the leaf modules' tests at the top.

- ``definition/``, ``store/``, ``application/``, ``engine/``, ``runtime/``, ``history/``,
  ``ops/``, ``cli/``: the areas of ``toolkit/`` (docs/architecture.md). A test goes in the
  folder of the area it exercises, in the module of the concept (``engine/test_wait.py`` for a
  wait step, ``store/test_tenants.py`` for tenant admission).
- ``engine/``: one module per step kind (``test_effect.py``, ``test_wait.py``, ``test_fanout.py``
  ...), with the features across them (``test_compensation.py``, ``test_deadline.py``) and the
  golden histories (``test_golden.py``, scenarios in ``engine/golden/``).
- ``process/``: every test that starts or kills real worker processes (``toolkit run``), whatever
  it is about: the crash matrix, the acceptance scenarios, outages, the chaos run.
- ``project/``: checks across the project: the docs, the packaging, the public API, security.
- ``test_durations.py``, ``test_errors.py``, ``test_payload.py``: the leaf modules.
- ``helpers/``: what several modules share: workflow definitions (``helpers/workflows.py``),
  running workflows in-process (``helpers/inprocess.py``) and as processes
  (``helpers/processes.py``), the golden harness (``helpers/golden.py``); ``apps/``: the handler
  registries the tests run; ``corpus/``: definitions and golden histories as files.

The fixtures (a real PostgreSQL, a fresh database per test) are in ``conftest.py``.
"""
