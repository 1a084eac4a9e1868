"""``--app MODULE[:ATTR]``: an application's handlers, imported and checked as a worker does.

``toolkit run`` needs the app; ``validate`` and ``deploy`` take it optionally, to refuse a
definition the worker would refuse (a handler missing, or one that cannot take its step's
``args``) with the worker's own messages.
"""

from __future__ import annotations

import functools
import importlib
import os
import pathlib
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from toolkit.application import App
from toolkit.definition import WorkflowDefinition
from toolkit.definition.paths import JsonPath
from toolkit.definition.yaml_source import YamlSource, load_yaml
from toolkit.errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])


def load_app(spec: str) -> App:
    """Import ``MODULE[:ATTR]`` (default attribute ``app``) and return the :class:`App`.

    Raises:
        ConfigError: the module cannot be imported (not found, a syntax error, or an
            exception its code raised: one line naming the file and line), or the attribute
            is not an App.
    """
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the app lives beside the user
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--app {spec}: cannot import {module_name!r}: {exc}") from exc
    except SyntaxError as exc:
        where = f"{exc.filename}:{exc.lineno}: " if exc.filename else ""
        raise ConfigError(
            f"--app {spec}: cannot import {module_name!r}: {where}{type(exc).__name__}: "
            f"{exc.msg}"
        ) from exc
    except Exception as exc:  # the module's own code raised while it was imported
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        raise ConfigError(
            f"--app {spec}: importing {module_name!r} raised {type(exc).__name__}: {exc} "
            f"({frame.filename}:{frame.lineno})"
        ) from exc
    name = attr or "app"
    if not hasattr(module, name):
        apps = sorted(key for key, value in vars(module).items() if isinstance(value, App))
        hint = f" (it has {', '.join(apps)})" if apps else ""
        raise ConfigError(f"--app {spec}: module {module_name!r} has no {name!r}{hint}")
    app = getattr(module, name)
    if not isinstance(app, App):
        raise ConfigError(
            f"--app {spec}: {module_name}.{name} is a {type(app).__name__}, not a toolkit.App"
        )
    return app


def checked_app(spec: str | None, definitions: Sequence[WorkflowDefinition]) -> App | None:
    """The app of ``--app``, checked against ``definitions`` as ``toolkit run`` checks it.

    Args:
        spec: the option's ``MODULE[:ATTR]``; None when it was not given.
        definitions: the loaded definitions.

    Returns:
        The app, or None without ``spec``.

    Raises:
        ConfigError: the app cannot be loaded (see :func:`load_app`).
        MissingHandlers: an effect or compensation has no handler in the app, or one that
            cannot take its ``args`` (one line each, naming the file and step).
    """
    if spec is None:
        return None
    app = load_app(spec)
    app.check(definitions, yaml_line)
    return app


def yaml_line(definition: WorkflowDefinition, path: JsonPath) -> int | None:
    """The line of ``path`` in the YAML file ``definition`` was loaded from, or None.

    The file is read again (once per run of a command): a definition keeps no line map.
    """
    return None if definition.source is None else _yaml_lines(definition.source).line_of(path)


@functools.cache
def _yaml_lines(file: str) -> YamlSource:
    """The parsed file's lines by path (empty when it cannot be read any more)."""
    try:
        return load_yaml(pathlib.Path(file).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return YamlSource()


def check_option(*, limits: bool = False) -> Callable[[F], F]:
    """The optional ``--app`` of ``validate`` and ``deploy`` (``TOOLKIT_APP``, as ``run``).

    Args:
        limits: the command also checks the limits the definitions name (``deploy``, which
            can read those set in the store).
    """
    also = ", and every limit named is declared or set" if limits else ""
    return click.option(
        "--app",
        "app_spec",
        envvar="TOOLKIT_APP",
        show_envvar=True,
        metavar="MODULE[:ATTR]",
        help="Also check the definitions against this app as toolkit run does: every "
        f"effect has a handler that takes its args{also}.",
    )
