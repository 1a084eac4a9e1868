"""Checks across the project: the docs, the packaging, the public API, security."""
