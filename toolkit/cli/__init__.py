"""The ``toolkit`` command: a thin adapter that parses, calls the library and prints.

Every error the toolkit raises on purpose prints as one line (or one line per fault) on
stderr and exits 1; nothing is written when a command is refused.

One module per area of commands:

- ``group``: the ``toolkit`` group, its global options, where each command goes, and how
  errors become one line and exit status 1;
- ``session``: where the store is (:class:`~toolkit.cli.session.Settings`) and the one
  helper that opens it and runs a command's coroutine;
- ``options`` and ``output``: option text to values, values to text;
- ``definitions`` (validate, deploy, definitions), ``tasks`` (submit, tasks, signal,
  complete, cancel, reconcile), ``show``, ``run``, ``workers`` (workers, doctor),
  ``tenants``, ``limits``, ``history`` (export, stats, prune), ``demo``, ``db``.
"""

from toolkit.cli.group import cli, main

__all__ = ["cli", "main"]
