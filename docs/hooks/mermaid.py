"""MkDocs hook: the site serves its own copy of Mermaid, so diagrams render offline.

The theme fetches Mermaid from a CDN when a page has a diagram, unless a global ``mermaid``
is defined already. This hook adds ``javascripts/mermaid.min.js`` to every page and writes
that file into the site: taken from the npm registry's tarball of a pinned release, checked
against the registry's integrity hash, and cached under ``~/.cache/runifold/`` so that a
second build needs no network (issue 24, item 7).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tarfile
import urllib.request
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError

#: The pinned release: the major version the theme itself would load (``mermaid@11``).
VERSION = "11.9.0"
TARBALL = f"https://registry.npmjs.org/mermaid/-/mermaid-{VERSION}.tgz"
#: The registry's ``dist.integrity`` of that tarball (``npm view mermaid@VERSION``).
INTEGRITY = (
    "sha512-YdPXn9slEwO0omQfQIsW6vS84weVQftIyyTGAZCwM//MGhPzL1+l6vO6bkf0wnP4tHigH1alZ5Ooy3HXI2gOag=="
)
MEMBER = "package/dist/mermaid.min.js"
SITE_PATH = "javascripts/mermaid.min.js"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "runifold"


def mermaid_script() -> bytes:
    """The pinned ``mermaid.min.js``, from the cache or the registry.

    Raises:
        PluginError: the registry is unreachable and nothing is cached, or the tarball's
            hash is not the pinned one.
    """
    cached = CACHE / f"mermaid-{VERSION}.min.js"
    if cached.is_file():
        return cached.read_bytes()
    try:
        with urllib.request.urlopen(TARBALL, timeout=120) as response:
            tarball = response.read()
    except OSError as exc:
        raise PluginError(
            f"cannot fetch Mermaid {VERSION} from {TARBALL} ({exc}); the docs serve their own "
            f"copy: put mermaid.min.js of that release at {cached}"
        ) from exc
    digest = "sha512-" + base64.b64encode(hashlib.sha512(tarball).digest()).decode()
    if digest != INTEGRITY:
        raise PluginError(f"{TARBALL}: integrity {digest} is not the pinned {INTEGRITY}")
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as archive:
        member = archive.extractfile(MEMBER)
        if member is None:
            raise PluginError(f"{TARBALL} holds no {MEMBER}")
        script = member.read()
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(".partial")
    partial.write_bytes(script)
    partial.replace(cached)
    return script


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    """Load the local copy on every page, before the theme would look for one."""
    config.extra_javascript.append(SITE_PATH)
    return config


def on_post_build(config: MkDocsConfig) -> None:
    """Write the script into the built site."""
    target = Path(config.site_dir) / SITE_PATH
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(mermaid_script())
