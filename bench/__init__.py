"""Benchmarks of the runifold engine against the raw SQL floor (see ``bench/throughput.py``)."""
