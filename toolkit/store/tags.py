"""Task tags: string key/value pairs an operator finds tasks by (docs/many-tasks.md).

A task has at most :data:`MAX_TAGS` tags. A key is 1 to :data:`MAX_KEY` characters of
letters, digits, ``_``, ``.``, ``-``, ``/`` and ``:``, starting with a letter or ``_``
(``customer``, ``app.region``, ``k8s/namespace``); a value is a string of at most
:data:`MAX_VALUE` characters without control characters. Tags come from the submit, the
definition's ``tags`` (expressions over the input), a handler's ``ctx.tag`` (with its step's
fenced commit) and a parent task (its children inherit its tags); a later source sets a key
again, never removes one.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from typing import Any

from toolkit.errors import InputError

#: Most tags on one task.
MAX_TAGS = 32
#: Longest tag key, characters.
MAX_KEY = 64
#: Longest tag value, characters.
MAX_VALUE = 256
#: A tag key.
TAG_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]*")


def check_tag(key: object, value: object, path: str = "tags") -> tuple[str, str]:
    """Return ``(key, value)`` if they make a tag.

    Raises:
        InputError: the key or value breaks the rules above; ``path`` says where it was
            given (the message names the key).
    """
    if not isinstance(key, str) or len(key) > MAX_KEY or not TAG_KEY.fullmatch(key):
        raise InputError(
            f"tag key {key!r} is not one: 1 to {MAX_KEY} letters, digits, '_', '.', '-', '/' "
            "or ':', starting with a letter or '_'",
            path=path,
        )
    if not isinstance(value, str):
        raise InputError(
            f"tag {key!r}: the value must be a string, not {type(value).__name__} {value!r}",
            path=f"{path}.{key}",
        )
    if len(value) > MAX_VALUE:
        raise InputError(
            f"tag {key!r}: the value is {len(value)} characters, at most {MAX_VALUE}",
            path=f"{path}.{key}",
        )
    if any(unicodedata.category(char) == "Cc" for char in value):
        raise InputError(f"tag {key!r}: the value holds a control character", path=f"{path}.{key}")
    return key, value


def check_tags(tags: Any, path: str = "tags") -> dict[str, str]:
    """Return ``tags`` as a dict if every pair is a tag and there are few enough.

    Raises:
        InputError: it is not a mapping, has more than :data:`MAX_TAGS` pairs, or a pair
            is not a tag (see :func:`check_tag`).
    """
    if not isinstance(tags, Mapping):
        raise InputError(f"tags must be a mapping of key to value, not {tags!r}", path=path)
    if len(tags) > MAX_TAGS:
        raise InputError(f"{len(tags)} tags: a task has at most {MAX_TAGS}", path=path)
    return dict(check_tag(key, value, path) for key, value in tags.items())


def merged_tags(*sources: Mapping[str, str] | None, path: str = "tags") -> dict[str, str]:
    """The tags of several sources, later ones setting a key again; checked together.

    Raises:
        InputError: the union has more than :data:`MAX_TAGS` tags.
    """
    merged: dict[str, str] = {}
    for source in sources:
        merged.update(source or {})
    return check_tags(merged, path)
