"""Peers run beside runifold on the same server (``bench/peers/compare.py``)."""
