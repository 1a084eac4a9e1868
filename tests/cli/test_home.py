"""The embedded server's home is found as git finds ``.git``: the nearest ``.toolkit`` in the
current folder or a parent; a new one is announced, with its folder (issue 24, item 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from toolkit.cli import cli
from toolkit.cli.session import Settings, choose_home
from toolkit.store.embedded import find_home, stop_embedded


def make_home(folder: Path) -> Path:
    """A folder that looks like an initialised home (the server need not run)."""
    pgdata = folder / ".toolkit" / "pgdata"
    pgdata.mkdir(parents=True)
    (pgdata / "PG_VERSION").write_text("18\n")
    return folder / ".toolkit"


def test_the_nearest_home_above_the_current_folder_is_found(tmp_path: Path) -> None:
    home = make_home(tmp_path / "project")
    deep = tmp_path / "project" / "notebooks" / "more"
    deep.mkdir(parents=True)
    assert find_home(deep) == home.resolve()
    assert find_home(tmp_path / "project") == home.resolve()
    inner = make_home(tmp_path / "project" / "notebooks")
    assert find_home(deep) == inner.resolve(), "the nearest home wins"


def test_a_home_not_yet_initialised_is_found(tmp_path: Path) -> None:
    """``toolkit init`` makes an empty ``.toolkit``: the project's commands must use it, not a
    home further up."""
    make_home(tmp_path)
    (tmp_path / "project" / ".toolkit").mkdir(parents=True)
    assert find_home(tmp_path / "project") == (tmp_path / "project" / ".toolkit").resolve()


def test_commands_in_a_subfolder_use_the_project_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = make_home(tmp_path)
    sub = tmp_path / "notebooks"
    sub.mkdir()
    monkeypatch.chdir(sub)
    monkeypatch.delenv("TOOLKIT_HOME", raising=False)
    result = CliRunner().invoke(cli, ["db", "stop"])
    assert result.exit_code == 0, result.output
    assert f"embedded PostgreSQL in {home.resolve()} was not running" in result.output


def test_an_explicit_home_wins_over_the_nearest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_home(tmp_path)
    other = tmp_path / "elsewhere"
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["--home", str(other), "db", "stop"])
    assert f"embedded PostgreSQL in {other.resolve()} was not running" in result.output


def test_a_new_embedded_server_is_announced_with_its_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "fresh" / ".toolkit"
    settings = Settings(dsn=None, home=home)
    try:
        settings.resolve_dsn()
        first = capsys.readouterr().err
        settings.resolve_dsn()  # running now: nothing more to say
        second = capsys.readouterr().err
    finally:
        stop_embedded(home)
    assert f"creating a new embedded PostgreSQL in {home.resolve()}" in first, first
    assert second == ""


def test_the_new_server_note_says_how_its_folder_was_chosen(tmp_path: Path) -> None:
    """Regression: it said `none in this folder or its parents` whatever the case: for an
    empty `.toolkit` (`mkdir`, `toolkit init`), with a server further up, and for --home."""
    parent = make_home(tmp_path)
    project = tmp_path / "project"
    (project / ".toolkit").mkdir(parents=True)
    home, origin = choose_home(None, project)
    assert (home, origin) == ((project / ".toolkit").resolve(), "found")
    note = Settings(dsn=None, home=home, home_origin=origin).new_server_note()
    assert note == (
        f"note: creating a new embedded PostgreSQL in {home} (the nearest .toolkit folder has "
        f"no server yet, so the server in {parent.resolve()} further up is not used; --home or "
        "TOOLKIT_HOME names another); the first start takes a few seconds"
    )
    alone = Settings(dsn=None, home=tmp_path / "x" / ".toolkit", home_origin="default")
    assert "(no .toolkit folder in this folder or its parents; --home" in str(
        alone.new_server_note()
    )
    given = tmp_path / "given"
    for origin in ("--home", "TOOLKIT_HOME"):
        note = Settings(dsn=None, home=given, home_origin=origin).new_server_note()
        assert f"in {given.resolve()} ({origin} names this folder, which has no server yet);" in (
            str(note)
        )
    assert Settings(dsn=None, home=parent).new_server_note() is None, "it exists: no note"
    assert Settings(dsn="postgresql://x", home=given).new_server_note() is None


def test_the_home_is_given_or_the_nearest_found(tmp_path: Path) -> None:
    parent = make_home(tmp_path)
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    assert choose_home(None, deep) == (parent.resolve(), "found")
    given = tmp_path / "given"
    assert choose_home(given, deep) == (given, "--home")
    assert choose_home(given, deep, from_environment=True) == (given, "TOOLKIT_HOME")


def test_toolkit_home_from_the_environment_is_named_in_the_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group tells TOOLKIT_HOME from --home (a real server is created)."""
    home = tmp_path / "env-home"
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TOOLKIT_DSN", raising=False)
    try:
        result = CliRunner().invoke(cli, ["tasks"], env={"TOOLKIT_HOME": str(home)})
    finally:
        stop_embedded(home)
    assert result.exit_code == 0, result.output
    assert f"in {home.resolve()} (TOOLKIT_HOME names this folder, which has" in result.stderr
