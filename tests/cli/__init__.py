"""Tests of ``toolkit.cli``: the command's parsing, its one-line errors and its output."""
