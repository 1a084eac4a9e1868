"""Tests of ``toolkit.application``: the App registry and spend accounting."""
