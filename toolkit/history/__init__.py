"""Task history after the fact.

Export it to Parquet (``export``), analyse it with DuckDB (``analytics``:
``toolkit.history.open(folder)``), prune what was exported (``retention``), check its
fencing (``audit``), and inspect it in a notebook (``notebook``).
"""

from toolkit.history.analytics import History, open, render_table

__all__ = ["History", "open", "render_table"]
