"""The worker process: what it runs and how.

``worker`` is its identity, handlers and definitions; ``supervisor`` runs its
claim-and-execute cycles, heartbeats and shutdown.
"""
