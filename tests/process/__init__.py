"""Tests that start or kill real worker processes (``python -m toolkit run``)."""
