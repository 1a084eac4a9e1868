"""Tests of ``toolkit.definition``: the format, its checks, expressions and drawings."""
