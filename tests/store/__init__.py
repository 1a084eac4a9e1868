"""Tests of ``toolkit.store``: PostgreSQL, leases, fencing, tenants, limits, budgets."""
