"""Security: YAML is data, expressions are queries, handler names are registry keys, SQL is
parameterised, and tenant names and keys are literals (the DSN's password, through every
command: ``tests/process/test_security.py``)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from tests.apps.counting import app
from tests.helpers.processes import REPO
from tests.helpers.workflows import THREE_STEPS, definition
from toolkit.application import App
from toolkit.definition import parse_definition
from toolkit.definition.expressions import compile_template
from toolkit.errors import DefinitionError, ExpressionSyntaxError, HandlerNotFound, MissingHandlers
from toolkit.runtime.supervisor import SupervisorConfig, WorkflowSupervisor
from toolkit.runtime.worker import Worker
from toolkit.store import Store
from toolkit.store.names import SIGNAL_NAME

TOOLKIT = REPO / "toolkit"


# --- YAML -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tag",
    [
        "!!python/object/apply:os.system ['touch {marker}']",
        "!!python/object/new:subprocess.check_output [['touch', '{marker}']]",
        "!!python/name:os.system",
        "!!python/object:os.stat_result {{}}",
    ],
)
def test_python_tags_in_yaml_are_located_faults_never_objects(tmp_path: Path, tag: str) -> None:
    marker = tmp_path / "pwned"
    text = THREE_STEPS.replace("input: {type: object}", f"input: {tag.format(marker=marker)}")
    with pytest.raises(DefinitionError) as info:
        parse_definition(text, source="evil.yaml")
    (fault,) = info.value.faults
    assert fault.file == "evil.yaml" and fault.line == 4
    assert not marker.exists()


# --- expressions ----------------------------------------------------------------------------------

SCOPE = {"input": {"n": 1}, "steps": {}, "context": {"task_id": 1}}


@pytest.mark.parametrize(
    "text",
    ["${ env }", "${ env.HOME }", "${ environ.PATH }", "${ input.__class__ }", "${ os }"],
)
def test_expressions_see_only_the_scope_not_the_environment(text: str) -> None:
    assert compile_template(text).render(SCOPE) is None
    assert compile_template(f"home={text}").render(SCOPE) == "home="


@pytest.mark.parametrize(
    "text",
    [
        "${ env('HOME') }",
        "${ getenv('PATH') }",
        "${ eval('1+1') }",
        "${ exec(input) }",
        "${ open('/etc/passwd') }",
        "${ __import__('os').system('true') }",
    ],
)
def test_expressions_cannot_call_code(text: str) -> None:
    with pytest.raises(ExpressionSyntaxError):
        compile_template(text)


def test_a_definition_reaching_for_the_environment_is_refused_at_load() -> None:
    text = THREE_STEPS.replace('"${ input.n }"', "\"${ env('TOOLKIT_DSN') }\"")
    with pytest.raises(DefinitionError, match=r"\$\.steps\.first\.args\.value.*unknown function"):
        parse_definition(text, source="env.yaml")


# --- handler names --------------------------------------------------------------------------------


def test_handler_names_resolve_only_through_the_registry() -> None:
    """An effect naming ``os.system`` or a module path is a missing handler: nothing named in
    YAML is ever imported or called."""
    module = "toolkit_security_probe_never_imported"
    text = f"""
name: evil
version: 1
input: {{type: object}}
start: shell
steps:
  shell: {{effect: os.system, idempotent: true, args: {{command: "touch /tmp/x"}}, next: load}}
  load: {{effect: {module}.run, idempotent: true}}
"""
    d = parse_definition(text, source="evil.yaml")
    assert d.handlers() == {"os.system", f"{module}.run"}
    with pytest.raises(MissingHandlers) as info:
        Worker(object(), App("mine"), [d])  # type: ignore[arg-type]
    assert "evil.yaml: $.steps.shell.effect: no handler 'os.system'" in str(info.value)
    assert f"no handler '{module}.run'" in str(info.value)
    with pytest.raises(HandlerNotFound):
        App("mine").handler("os.system")
    assert module not in sys.modules


# --- SQL ------------------------------------------------------------------------------------------

SQL_WORDS = re.compile(
    r"\b(SELECT\b.*\bFROM|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|"
    r"CREATE\s+(TABLE|INDEX|DATABASE)|DROP\s+(TABLE|DATABASE)|ALTER\s+TABLE)\b",
    re.S,
)


def _python_files() -> list[Path]:
    files = sorted(TOOLKIT.rglob("*.py"))
    assert len(files) > 20
    return files


def _is_sql(node: ast.AST) -> bool:
    """A string literal (or f-string) whose text reads as an SQL statement."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return bool(SQL_WORDS.search(node.value))
    if isinstance(node, ast.JoinedStr):
        text = "".join(
            v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)
        )
        return bool(SQL_WORDS.search(text))
    return False


def test_sql_is_never_built_by_string_formatting() -> None:
    """No f-string, ``%`` formatting, ``.format()`` or concatenation builds SQL text in
    toolkit/ (mypy adds the rest: psycopg's ``execute`` takes only ``LiteralString``)."""
    faults = []
    for path in _python_files():
        source = path.read_text()
        tree = ast.parse(source)
        for node in ast.walk(tree):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.JoinedStr) and _is_sql(node):
                if any(isinstance(v, ast.FormattedValue) for v in node.values):
                    faults.append(f"{where}: SQL in an f-string")
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod | ast.Add):
                if _is_sql(node.left) or _is_sql(node.right):
                    faults.append(f"{where}: SQL built with {type(node.op).__name__}")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "format"
                and _is_sql(node.func.value)
            ):
                faults.append(f"{where}: SQL built with .format()")
        for number, line in enumerate(source.splitlines(), 1):
            if re.search(r"execute\(\s*f[\"']", line):
                faults.append(f'{path.relative_to(REPO)}:{number}: execute(f"...")')
            if re.search(r"\.format\(", line) and SQL_WORDS.search(line.upper()):
                faults.append(f"{path.relative_to(REPO)}:{number}: .format() near SQL")
    assert faults == []


def test_the_sql_check_would_catch_formatted_sql() -> None:
    """The check above is not vacuous: it flags each way of building SQL from values."""
    bad = [
        'cur.execute(f"SELECT * FROM t WHERE id = {x}")',
        'cur.execute("SELECT * FROM t WHERE id = %s" % x)',
        'cur.execute("DELETE FROM t WHERE id = {}".format(x))',
        'cur.execute("UPDATE t SET a = 1 WHERE b = " + x)',
    ]
    for line in bad:
        tree = ast.parse(line)
        assert any(
            (isinstance(n, ast.JoinedStr) and _is_sql(n))
            or (isinstance(n, ast.BinOp) and (_is_sql(n.left) or _is_sql(n.right)))
            or (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and n.func.attr == "format" and _is_sql(n.func.value))
            for n in ast.walk(tree)
        ), line  # fmt: skip


# --- tenants, keys and names are literals -----------------------------------------------------

NASTY = [
    "o'brien",
    'say "hi"',
    "x'; DROP TABLE toolkit_tasks; --",
    "a b c",
    "%",
    "_",
    "SELECT * FROM toolkit_tasks",
    "\\",
    "ünïcödé ✓",
]


@pytest.mark.anyio
async def test_nasty_tenants_keys_and_names_are_stored_and_matched_literally(
    store: Store,
) -> None:
    d = definition(THREE_STEPS)
    await store.definitions.deploy(d)
    ids: dict[str, int] = {}
    for name in NASTY:
        task_id, created = await store.tasks.submit_keyed(d, {"n": 1}, key=name, tenant=name)
        assert created
        ids[name] = task_id
        assert await store.tasks.submit_keyed(d, {"n": 1}, key=name, tenant=name) == (
            task_id,
            False,
        )
    for name in NASTY:
        listed = await store.tasks.list(tenant=name)
        assert [t.id for t in listed] == [ids[name]], name  # '%' and '_' are no wildcards
        record = await store.tasks.get(ids[name])
        assert record.tenant == name and record.idempotency_key == name
        # A signal name follows the format's rule (tests/project/test_checked_inputs.py): those of
        # the nasty names that do ("_") are stored literally too.
        signal_name = name if SIGNAL_NAME.fullmatch(name) else "from-a-nasty-tenant"
        signal_id = await store.tasks.signal(ids[name], signal_name, {"from": name}, force=True)
        (signal,) = await store.tasks.signals(ids[name])
        assert signal["id"] == signal_id and signal["name"] == signal_name
    worker = Worker(store, app, [d], worker_id="w'; DELETE FROM toolkit_tasks; --")
    report = await WorkflowSupervisor(
        worker, SupervisorConfig(until_idle=True, lease=6, heartbeat=0.5, idle_backoff_max=0.05)
    ).run()
    assert report.succeeded == len(NASTY)
    assert (await store.tasks.counts_by_state()) == {"succeeded": len(NASTY)}
    assert {r.worker_id for r in await store.workers.list()} == {worker.worker_id}
