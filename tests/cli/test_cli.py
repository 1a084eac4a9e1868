"""The `toolkit` command: clear one-line errors, nothing written on refusal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.helpers.workflows import MINIMAL, THREE_STEPS
from toolkit.cli import cli

UNREACHABLE = "postgresql://user:hunter2@127.0.0.1:1/nowhere?connect_timeout=2"


def invoke(*args: str, dsn: str | None = None) -> tuple[int, str, str]:
    runner = CliRunner()
    env = {"TOOLKIT_DSN": dsn} if dsn else {}
    result = runner.invoke(cli, list(args), env=env, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def three_steps(tmp_path: Path) -> Path:
    path = tmp_path / "three.yaml"
    path.write_text(THREE_STEPS)
    return path


def test_validate_reports_every_fault_with_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        THREE_STEPS.replace("next: second", "next: nowhere").replace("version: 1", "version: 0")
    )
    code, out, err = invoke("validate", str(bad))
    assert code == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) >= 2
    assert all(line.startswith(f"error: {bad}:") for line in lines)
    assert any("$.version" in line for line in lines)
    assert any("nowhere" in line for line in lines)
    assert "Traceback" not in err


def test_validate_accepts_the_examples() -> None:
    code, out, _ = invoke("validate", "definitions")
    assert code == 0 and out.count("ok: ") >= 2


def test_invalid_yaml_is_one_located_error(tmp_path: Path) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: x\nsteps: [unclosed\n")
    code, _, err = invoke("validate", str(bad))
    assert code == 1 and f"{bad}:" in err and "Traceback" not in err


def test_unreachable_database_is_one_line_without_the_password(three_steps: Path) -> None:
    code, _, err = invoke("deploy", str(three_steps), dsn=UNREACHABLE)
    assert code == 1
    assert err.startswith("error: cannot reach PostgreSQL at ") and err.count("\n") == 1
    assert "hunter2" not in err


def test_a_database_that_does_not_exist_is_named_as_refused(dsn: str) -> None:
    """Regression: it was "cannot reach PostgreSQL at ...", though the server answered."""
    missing = dsn.replace("dbname=", "dbname=nowhere_") if "dbname=" in dsn else dsn + "_nowhere"
    code, _, err = invoke("tasks", dsn=missing)
    assert code == 1 and err.startswith("error: PostgreSQL at ") and err.count("\n") == 1, err
    assert "refused the connection: database " in err and "does not exist" in err, err


@pytest.mark.parametrize("bad", ["not a dsn", "mysql://user:hunter2@db/app"])
def test_a_malformed_dsn_names_the_option_and_hides_the_password(bad: str) -> None:
    """Regression: ``error: database error: missing "=" after "not" in connection info
    string`` named neither --dsn nor TOOLKIT_DSN (and quoted a password given in it)."""
    code, _, err = invoke("tasks", dsn=bad)
    assert code == 2, err
    assert "--dsn (TOOLKIT_DSN): not a PostgreSQL connection string" in err, err
    assert "postgresql://USER@HOST:PORT/DATABASE" in err and "hunter2" not in err, err


def test_show_gives_a_live_tasks_deadline(dsn: str, three_steps: Path) -> None:
    """Regression: neither ``show`` nor ``show --json`` said when a task would time out."""
    assert invoke("deploy", str(three_steps), dsn=dsn)[0] == 0
    code, out, err = invoke("submit", "three-steps", "--input", '{"n": 1}', "--timeout", "1h",
                            dsn=dsn)  # fmt: skip
    assert code == 0, err
    task_id = out.strip()
    code, out, err = invoke("show", task_id, dsn=dsn)
    assert code == 0 and "  deadline:   " in out and "fails with Timeout" in out, (out, err)
    shown = json.loads(invoke("show", task_id, "--json", dsn=dsn)[1])
    assert shown["task"]["deadline_at"] is not None, shown["task"]


def test_an_empty_input_is_refused_not_taken_for_the_empty_object(
    dsn: str, three_steps: Path
) -> None:
    assert invoke("deploy", str(three_steps), dsn=dsn)[0] == 0
    code, out, err = invoke("submit", "three-steps", "--input", "", dsn=dsn)
    assert (code, out) == (1, "") and err.startswith("error: --input: not valid JSON"), err


def test_submit_and_show_and_tasks(dsn: str, three_steps: Path) -> None:
    assert invoke("deploy", str(three_steps), dsn=dsn)[0] == 0
    code, out, err = invoke("deploy", str(three_steps), dsn=dsn)
    assert code == 0 and out.startswith("unchanged"), err
    code, out, err = invoke("submit", "three-steps", "--input", '{"n": 3}', dsn=dsn)
    assert code == 0, err
    task_id = int(out)
    code, out, _ = invoke("show", str(task_id), "--json", dsn=dsn)
    shown = json.loads(out)
    assert shown["task"]["state"] == "queued" and shown["events"][0]["kind"] == "submitted"
    code, out, _ = invoke("tasks", "--state", "queued", dsn=dsn)
    assert code == 0 and f"{task_id:>8}  queued" in out


def test_show_cuts_long_values_with_an_ellipsis_and_json_keeps_them(
    dsn: str, three_steps: Path
) -> None:
    assert invoke("deploy", str(three_steps), dsn=dsn)[0] == 0
    task_id = invoke("submit", "three-steps", "--input", '{"n": 3}', dsn=dsn)[1].strip()
    note = "x" * 300
    signal = ("signal", task_id, "note", "--payload", json.dumps(note), "--force")
    assert invoke(*signal, dsn=dsn)[0] == 0  # no step waits for it: stored all the same
    out = invoke("show", task_id, dsn=dsn)[1]
    (line,) = [line for line in out.splitlines() if " note " in line]
    assert line.endswith("xxx…") and len(line) < 200
    shown = json.loads(invoke("show", task_id, "--json", dsn=dsn)[1])
    assert shown["signals"][0]["payload"] == note


def test_validate_refuses_a_folder_without_definitions(tmp_path: Path) -> None:
    code, out, err = invoke("validate", str(tmp_path))
    assert (code, out) == (1, "")
    assert err == f"error: {tmp_path}: $: no *.yaml or *.yml file in this folder\n"


def test_demo_without_its_definitions_folder_says_where_to_run_it(tmp_path: Path) -> None:
    code, out, err = invoke("demo", "--definitions", str(tmp_path / "none"), dsn=UNREACHABLE)
    assert (code, out) == (1, "") and "run it from the repository's root" in err


@pytest.mark.parametrize("command", [("submit", "x"), ("tenants", "set", "acme")])
def test_a_budget_without_a_resource_or_an_amount_is_refused_naming_the_option(
    command: tuple[str, ...],
) -> None:
    """Regression: ``tenants set --budget tokens=-5`` said "budget 'tokens' of tenant 'acme'
    must be at least 0", not which option; ``submit`` took a negative amount."""
    for text, message in [
        ("=5", "error: --budget =5: expected RESOURCE=AMOUNT"),
        ("tokens=", "error: --budget tokens=: expected RESOURCE=AMOUNT"),
        ("tokens=lots", "error: --budget tokens=lots: the amount must be a number, not 'lots'"),
        ("tokens=-5", "error: --budget tokens=-5: the amount must be at least 0, not '-5'"),
        ("tokens=inf", "error: --budget tokens=inf: the amount must be a finite number"),
    ]:
        code, out, err = invoke(*command, "--budget", text, dsn=UNREACHABLE)
        assert (code, out) == (1, "") and err.startswith(message), err


def test_tasks_refuses_a_limit_below_one() -> None:
    code, _, err = invoke("tasks", "--limit", "-1", dsn=UNREACHABLE)
    assert code == 2 and "Invalid value for '--limit'" in err and "Traceback" not in err


def test_submit_refuses_bad_input_and_writes_nothing(dsn: str, tmp_path: Path) -> None:
    path = tmp_path / "strict.yaml"
    path.write_text(
        THREE_STEPS.replace("input: {type: object}", "input: {type: object, required: [n]}")
    )
    invoke("deploy", str(path), dsn=dsn)
    code, _, err = invoke("submit", "three-steps", "--input", '{"m": 1}', dsn=dsn)
    assert code == 1 and "n" in err and "Traceback" not in err
    code, _, err = invoke("submit", "three-steps", "--input", "{not json", dsn=dsn)
    assert code == 1 and "--input: not valid JSON" in err
    code, _, err = invoke("submit", "no-such-workflow", dsn=dsn)
    assert code == 1 and "no definition 'no-such-workflow'" in err
    assert invoke("tasks", "--json", dsn=dsn)[1].strip() == "[]"


def test_run_refuses_missing_handlers_naming_file_and_step(dsn: str, three_steps: Path) -> None:
    code, _, err = invoke(
        "run", "--app", "toolkit.examples", "--definitions", str(three_steps), dsn=dsn
    )
    assert code == 1
    assert f"{three_steps}:8: $.steps.first.effect: no handler 'count.work'" in err
    code, _, err = invoke(
        "run", "--app", "no.such.module", "--definitions", str(three_steps), dsn=dsn
    )
    assert code == 1 and "cannot import 'no.such.module'" in err
    for spec, message in [
        ("tests.apps.counting:nope", "module 'tests.apps.counting' has no 'nope' (it has app)"),
        ("tests.apps.counting:CREATE_CALLS", "tests.apps.counting.CREATE_CALLS is a str, not a"),
    ]:
        code, _, err = invoke("run", "--app", spec, "--definitions", str(three_steps), dsn=dsn)
        assert code == 1 and message in err, err
    code, _, err = invoke(
        "run", "--app", "tests.apps.counting", "--definitions", str(three_steps),
        "--lease", "3", "--heartbeat", "2", dsn=dsn,
    )  # fmt: skip
    assert code == 1 and "at most a third of the lease" in err


def test_an_app_that_fails_to_import_is_named_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A syntax error in the app's module, or an exception its code raises at import, gives
    one line naming the file and line, not the import machinery's traceback."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "three.yaml").write_text(THREE_STEPS)
    (tmp_path / "app_with_typo.py").write_text("import toolkit\n\ndef broken(:\n    pass\n")
    (tmp_path / "app_that_raises.py").write_text("x = 1\nraise RuntimeError('config missing')\n")
    for module, message in [
        ("app_with_typo", f"{tmp_path / 'app_with_typo.py'}:3: SyntaxError: "),
        ("app_that_raises", "raised RuntimeError: config missing ("
                            f"{tmp_path / 'app_that_raises.py'}:2)"),
    ]:  # fmt: skip
        code, _, err = invoke("validate", "--app", module, str(tmp_path / "three.yaml"))
        assert code == 1 and message in err and "Traceback" not in err, err


def test_run_until_idle_drains_the_queue(dsn: str, three_steps: Path) -> None:
    invoke("deploy", str(three_steps), dsn=dsn)
    for n in range(3):
        invoke("submit", "three-steps", "--input", json.dumps({"n": n}), dsn=dsn)
    code, out, err = invoke(
        "run", "--app", "tests.apps.counting", "--definitions", str(three_steps), "--until-idle",
        dsn=dsn,
    )  # fmt: skip
    assert code == 0, err
    assert "succeeded 3" in out
    # It said what it runs, where, and how it stops; a DSN without its password.
    (start,) = [line for line in err.splitlines() if "running 1 definition(s)" in line]
    assert "(three-steps@1)" in start and "concurrency 8" in start, start
    assert "on PostgreSQL at " in start and "exits when idle" in start, start
    assert "password" not in start.lower()


def test_tasks_no_worker_can_run_are_named_by_until_idle_and_a_timed_out_wait(
    dsn: str, three_steps: Path, tmp_path: Path
) -> None:
    """Regression: a worker that drained its own definitions exited with `claimed 0` and a
    wait timed out saying only `queued`, with a task of a version nobody had loaded."""
    other = tmp_path / "demo.yaml"
    other.write_text(MINIMAL)
    assert invoke("deploy", str(three_steps), str(other), dsn=dsn)[0] == 0
    code, out, err = invoke("submit", "demo", "--wait", "--wait-timeout", "100ms", dsn=dsn)
    assert code == 5, err
    assert "queued after 0.1 s of waiting; it goes on; no live worker has loaded demo v1" in err
    code, out, err = invoke(
        "run", "--app", "tests.apps.counting", "--definitions", str(three_steps), "--until-idle",
        dsn=dsn,
    )  # fmt: skip
    assert code == 0 and "claimed 0" in out, err
    assert "note: live tasks of definition versions no live worker has loaded: demo v1 (1)" in err


def test_a_worker_id_held_by_a_live_process_is_one_clear_error(dsn: str, three_steps: Path) -> None:
    """Regression: the refusal came out of the worker's task group as a traceback."""
    import anyio

    from toolkit.store import Store

    async def hold() -> None:
        async with await Store.open(dsn, migrate_schema=False) as store:
            await store.workers.register(
                "busy", incarnation="other", concurrency=1, definitions=[], lease_seconds=60,
                heartbeat_seconds=20,
            )

    anyio.run(hold)
    code, _, err = invoke(
        "run", "--app", "tests.apps.counting", "--definitions", str(three_steps),
        "--worker-id", "busy", "--until-idle", dsn=dsn,
    )  # fmt: skip
    assert code == 1
    assert err.startswith("error: worker id 'busy' is held by another live process")
    assert "Traceback" not in err and err.count("\n") == 1


def test_deploy_registers_nothing_when_one_file_conflicts(dsn: str, tmp_path: Path) -> None:
    """Regression: files before a conflicting one stayed registered."""
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    second.write_text(THREE_STEPS)
    assert invoke("deploy", str(second), dsn=dsn)[0] == 0
    first.write_text(THREE_STEPS.replace("name: three-steps", "name: another"))
    second.write_text(THREE_STEPS.replace("succeed: {output: zero}", "succeed: {output: two}"))
    code, _, err = invoke("deploy", str(first), str(second), dsn=dsn)
    assert code == 1 and "bump `version`" in err
    code, out, _ = invoke("definitions", "list", "--json", dsn=dsn)
    assert [entry["name"] for entry in json.loads(out)] == ["three-steps"]


def test_run_logs_a_failing_handler_with_its_traceback(dsn: str, tmp_path: Path) -> None:
    """Regression: `toolkit run` printed only its summary, `toolkit show` the error's name and
    message; nothing said where the handler failed."""
    import inspect

    from tests.apps import counting

    path = tmp_path / "failing.yaml"
    path.write_text(
        "name: failing\nversion: 1\nstart: a\n"
        "steps:\n  a: {effect: count.fail, idempotent: true, retry: {max_attempts: 1}}\n"
    )
    invoke("deploy", str(path), dsn=dsn)
    invoke("submit", "failing", dsn=dsn)
    code, out, err = invoke(
        "run", "--app", "tests.apps.counting", "--definitions", str(path), "--until-idle",
        dsn=dsn,
    )  # fmt: skip
    assert code == 0 and "failed 1" in out, err
    lines = err.splitlines()
    (logged,) = [n for n, line in enumerate(lines) if "action=effect_failed" in line]
    assert "WARNING" in lines[logged] and "handler 'count.fail' failed: Broken" in lines[logged]
    assert "task_id=1 step=a occurrence=a#1 attempt=1" in lines[logged], lines[logged]
    assert lines[logged + 1] == "Traceback (most recent call last):"
    source, first = inspect.getsourcelines(counting.fail)
    raise_line = first + next(n for n, line in enumerate(source) if "raise" in line)
    assert f'File "{counting.__file__}", line {raise_line}, in fail' in err, err


UNFIT = """
name: unfit
version: 1
start: a
steps:
  a: {effect: count.work, idempotent: true, args: {nope: 1}, next: b}
  b: {effect: count.missing, idempotent: true, next: c}
  c: {effect: count.wrok, idempotent: true}
"""


def test_validate_with_app_lists_handler_faults_beside_another_file_s_schema_faults(
    tmp_path: Path,
) -> None:
    """Regression: the handlers were checked only once every file passed the schema, so a
    folder with one bad file hid the missing handlers of the others."""
    (tmp_path / "a-bad.yaml").write_text(THREE_STEPS.replace("name: three-steps", "name: 7"))
    (tmp_path / "b-unfit.yaml").write_text(UNFIT)
    code, out, err = invoke("validate", str(tmp_path), "--app", "tests.apps.counting")
    assert code == 1 and out == "", out
    lines = err.splitlines()
    assert lines[0].startswith(f"error: {tmp_path / 'a-bad.yaml'}:"), err
    assert lines[1:] == [
        f"error: {tmp_path / 'b-unfit.yaml'}:6: $.steps.a.args: handler 'count.work' cannot "
        "take these arguments: it has no parameter 'nope'",
        f"error: {tmp_path / 'b-unfit.yaml'}:7: $.steps.b.effect: no handler 'count.missing' "
        "is registered in app 'counting'",
        f"error: {tmp_path / 'b-unfit.yaml'}:8: $.steps.c.effect: no handler 'count.wrok' is "
        "registered in app 'counting'; did you mean 'count.work'?",
    ], err


def test_validate_and_deploy_with_app_refuse_what_run_refuses(dsn: str, tmp_path: Path) -> None:
    """Regression: validate and deploy accepted handlers the worker refuses; only run said so."""
    path = tmp_path / "unfit.yaml"
    path.write_text(UNFIT)
    code, out, _ = invoke("validate", str(path))
    assert code == 0 and out.startswith("ok: "), "without --app, no handler is checked"
    app = ["--app", "tests.apps.counting"]
    code, _, refused = invoke("run", *app, "--definitions", str(path), "--until-idle", dsn=dsn)
    assert code == 1
    assert refused.splitlines() == [
        f"error: {path}:6: $.steps.a.args: handler 'count.work' cannot take these arguments: "
        "it has no parameter 'nope'",
        f"error: {path}:7: $.steps.b.effect: no handler 'count.missing' is registered in app "
        "'counting'",
        f"error: {path}:8: $.steps.c.effect: no handler 'count.wrok' is registered in app "
        "'counting'; did you mean 'count.work'?",
    ]
    code, out, err = invoke("validate", str(path), *app)
    assert (code, out, err) == (1, "", refused)
    code, out, err = invoke("deploy", str(path), *app, dsn=dsn)
    assert (code, out, err) == (1, "", refused)
    assert invoke("definitions", "list", "--json", dsn=dsn)[1].strip() == "[]", "nothing deployed"
    code, out, err = invoke("validate", "definitions", "--app", "toolkit.examples")
    assert code == 0 and out.count("ok: ") == len(list(Path("definitions").glob("*.yaml"))), err


def test_deploy_with_app_refuses_a_limit_declared_nowhere(dsn: str, tmp_path: Path) -> None:
    path = tmp_path / "limited.yaml"
    path.write_text(
        "name: limited\nversion: 1\nstart: a\n"
        "steps:\n  a: {effect: count.work, idempotent: true, limits: [nowhere]}\n"
    )
    app = ["--app", "tests.apps.counting"]
    code, _, refused = invoke("run", *app, "--definitions", str(path), "--until-idle", dsn=dsn)
    assert code == 1 and "limit 'nowhere' is not declared" in refused, refused
    code, out, err = invoke("deploy", str(path), *app, dsn=dsn)
    assert (code, out, err) == (1, "", refused)
    invoke("limits", "set", "nowhere", "--max-concurrency", "2", dsn=dsn)
    code, out, err = invoke("deploy", str(path), *app, dsn=dsn)
    assert code == 0 and out.startswith("registered: limited v1"), err


APPROVAL = """
name: approval
version: 1
start: approve
steps:
  approve: {wait: {signal: approved}, next: done}
  done: {succeed: {output: "${ steps.approve }"}}
"""


def test_show_says_a_sent_signal_was_received_and_the_task_waits_for_a_worker(
    dsn: str, tmp_path: Path
) -> None:
    """Regression: a waiting task whose signal was sent read `waits for: signal 'approved' at
    approve#1, due NOW` until a worker came, as if the signal were lost."""
    path = tmp_path / "approval.yaml"
    path.write_text(APPROVAL)
    invoke("deploy", str(path), dsn=dsn)
    task_id = invoke("submit", "approval", dsn=dsn)[1].strip()
    run = ("run", "--app", "tests.apps.counting", "--definitions", str(path), "--until-idle")
    assert invoke(*run, dsn=dsn)[0] == 0
    out = invoke("show", task_id, dsn=dsn)[1]
    assert "  waits for:  signal 'approved' at approve#1, due 9999-12-31" in out, out
    assert "  evidence:   (none)\n  events:\n" in out, "not an empty header"
    invoke("signal", task_id, "approved", "--payload", '{"by": "maria"}', dsn=dsn)
    out = invoke("show", task_id, dsn=dsn)[1]
    assert (
        "  waits for:  signal 'approved' at approve#1 received; due now, waiting for a worker\n"
        in out
    ), out
    assert invoke(*run, dsn=dsn)[0] == 0
    out = invoke("show", task_id, dsn=dsn)[1]
    assert "  state:      succeeded" in out and "waits for" not in out, out


def test_signal_refusal_names_the_cli_option_not_the_python_argument(
    dsn: str, tmp_path: Path
) -> None:
    """Regression: the command's error said `force=True, or toolkit signal --force`."""
    path = tmp_path / "approval.yaml"
    path.write_text(APPROVAL)
    invoke("deploy", str(path), dsn=dsn)
    task_id = invoke("submit", "approval", dsn=dsn)[1].strip()
    code, _, err = invoke("signal", task_id, "aproved", dsn=dsn)
    assert code == 1
    assert err == (
        f"error: task {task_id}: no step of its definition waits for signal 'aproved' (it waits "
        "for 'approved'); nothing was stored (--force stores it anyway)\n"
    )
    code, out, err = invoke("signal", task_id, "aproved", "--force", dsn=dsn)
    assert code == 0 and out.startswith("signal "), err


def test_validate_prints_each_files_faults_by_line(tmp_path: Path) -> None:
    """Regression: the schema's best match came first, so line 2 was printed before line 1."""
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(
        "name: Bad_Name\nversion: 0\nstart: a\nsteps:\n"
        "  a: {effect: x.y, idempotent: maybe}\n"
    )
    second.write_text(THREE_STEPS.replace("version: 1", "version: 0").replace("input", "inptu"))
    code, _, err = invoke("validate", str(first), str(second))
    assert code == 1
    located = [line.split(": ", 2)[1] for line in err.splitlines()]
    files = [where.rsplit(":", 1)[0] for where in located]
    assert files == sorted(files, key=[str(first), str(second)].index), err
    lines = [int(where.rsplit(":", 1)[1]) for where in located]
    assert lines[:3] == [1, 2, 5] and lines[3:] == sorted(lines[3:]), err
