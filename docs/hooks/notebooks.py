"""MkDocs hook: render the tutorials in ``notebooks/`` as pages under ``tutorials/``.

Each notebook becomes ``tutorials/NAME.md``: its Markdown cells as they are, its code cells
as Python blocks, and the outputs stored in the notebook (executed and checked by
``pytest --nbval``): text as text blocks, Markdown (a definition's Mermaid graph) as
Markdown, plots as images. Widgets are live only in Jupyter; the page says so. Nothing is
executed at build time, so the build works offline.

A docs page links a tutorial as its notebook (``../notebooks/NAME.ipynb``), which works
where the Markdown is read in the repository; on the site that link goes to the tutorial's
page instead.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _fence(kind: str, text: str) -> str:
    fence = "````" if "```" in text else "```"
    return f"{fence}{kind}\n{text.rstrip()}\n{fence}\n"


def _output(output: dict[str, Any]) -> str:
    kind = output.get("output_type")
    if kind == "stream":
        return _fence("text", _text(output.get("text", "")))
    if kind == "error":
        return _fence("text", f"{output.get('ename')}: {output.get('evalue')}")
    data = output.get("data", {})
    if "application/vnd.jupyter.widget-view+json" in data:
        return '!!! note "Interactive widget"\n    Run the notebook in JupyterLab to use it.\n'
    if "text/markdown" in data:
        return _text(data["text/markdown"]) + "\n"
    if "image/png" in data:
        png = _text(data["image/png"]).replace("\n", "")
        base64.b64decode(png, validate=True)
        return f'<img alt="plot" src="data:image/png;base64,{png}">\n'
    if "text/plain" in data:
        return _fence("text", _text(data["text/plain"]))
    return ""


def notebook_markdown(path: Path) -> str:
    """One notebook as a Markdown page."""
    notebook = json.loads(path.read_text(encoding="utf-8"))
    parts: list[str] = []
    for cell in notebook["cells"]:
        source = _text(cell.get("source", ""))
        if cell["cell_type"] == "markdown":
            # A notebook links the docs' pictures as `../docs/images/...`; the page sits in
            # `tutorials/`, beside `images/`.
            parts.append(source.replace("](../docs/", "](../") + "\n")
        elif cell["cell_type"] == "code":
            lines = [line for line in source.splitlines() if not line.startswith("# NBVAL_")]
            parts.append(_fence("python", "\n".join(lines)))
            parts.extend(filter(None, (_output(o) for o in cell.get("outputs", []))))
    parts.append(
        f"*This page is the notebook `notebooks/{path.name}`, run and checked by "
        "`pytest --nbval`.*\n"
    )
    return "\n".join(parts)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add a generated page per tutorial notebook."""
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        files.append(
            File.generated(config, f"tutorials/{path.stem}.md", content=notebook_markdown(path))
        )
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Point a page's links to a notebook (``../notebooks/NAME.ipynb``) at its tutorial page."""
    up = "../" * page.file.src_uri.count("/")  # from the page's folder to the docs' root
    notebook = re.escape(up + "../notebooks/") + r"([\w.-]+)\.ipynb"
    return re.sub(rf"\]\({notebook}", lambda m: f"]({up}tutorials/{m[1]}.md", markdown)
