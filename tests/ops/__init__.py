"""Tests of ``toolkit.ops``: doctor and the demo, with the example application it runs."""
