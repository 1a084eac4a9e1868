"""Tests of ``toolkit.runtime``: the worker and the supervisor, in-process (worker processes:
``tests/process/``)."""
