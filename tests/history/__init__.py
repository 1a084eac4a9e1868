"""Tests of ``toolkit.history``: export, analytics, retention, the fencing audit, the notebook."""
