"""Tests of ``toolkit.engine``: one module per step kind (``test_effect.py``, ``test_choice.py``,
``test_set.py``, ``test_wait.py``, ``test_fanout.py``, ``test_workflow.py``; a test of succeed or
fail steps alone goes in ``test_succeed_fail.py``), the features across kinds
(``test_callbacks.py``, ``test_compensation.py``, ``test_deadline.py``), a cycle through
database faults (``test_cycle.py``) and the golden histories (``test_golden.py``)."""
