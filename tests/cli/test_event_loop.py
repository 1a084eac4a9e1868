"""Commands and workers run on uvloop where it is installed, on asyncio's own loop when asked
(``--event-loop``, ``TOOLKIT_EVENT_LOOP``), and say so when uvloop is asked for and missing
(issue 22: a worker's CPU per task)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click
import pytest
import uvloop
from click.testing import CliRunner

from toolkit.cli import cli
from toolkit.cli.session import Settings, default_event_loop, run_async
from toolkit.errors import ConfigError


async def _loop_type() -> type[asyncio.AbstractEventLoop]:
    return type(asyncio.get_running_loop())


def test_run_async_takes_the_loop_asked_for() -> None:
    assert run_async(_loop_type, "uvloop") is uvloop.Loop
    assert run_async(_loop_type, "asyncio") is not uvloop.Loop
    assert default_event_loop() == "uvloop", "uvloop is a dependency on this platform"
    assert run_async(_loop_type) is uvloop.Loop, "the default"


def test_uvloop_asked_for_and_not_installed_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` raises ImportError
    with pytest.raises(ConfigError, match=r"--event-loop uvloop \(TOOLKIT_EVENT_LOOP\): uvloop "
                       r"is not installed here; install it .* or choose asyncio"):  # fmt: skip
        run_async(_loop_type, "uvloop")


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ([], {}, "uvloop"),
        (["--event-loop", "asyncio"], {}, "asyncio"),
        ([], {"TOOLKIT_EVENT_LOOP": "asyncio"}, "asyncio"),
        (["--event-loop", "uvloop"], {"TOOLKIT_EVENT_LOOP": "asyncio"}, "uvloop"),
    ],
)
def test_the_option_and_its_variable_reach_the_settings(
    tmp_path: Path, args: list[str], env: dict[str, str], expected: str
) -> None:
    """The settings a command is given (its own work is replaced: only the group's choice
    is looked at)."""
    seen: list[Settings] = []
    command = cli.commands["validate"]
    callback = command.callback

    def spy(*_args: object, **_kwargs: object) -> None:
        seen.append(click.get_current_context().obj)

    command.callback = spy
    try:
        result = CliRunner().invoke(cli, [*args, "--home", str(tmp_path), "validate", "."],
                                    env=env)  # fmt: skip
    finally:
        command.callback = callback
    assert result.exit_code == 0, result.output
    assert [s.event_loop for s in seen] == [expected]


def test_an_unknown_loop_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["--event-loop", "trio", "validate", "."])
    assert result.exit_code == 2
    assert "Invalid value for '--event-loop'" in result.output, result.output
