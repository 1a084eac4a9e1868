"""The worker's garbage collector (toolkit/runtime/collector.py): set within the worker's
run, given back after it."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from toolkit.cli import cli
from toolkit.runtime.collector import YOUNG_THRESHOLD, worker_collector

PROBE = """
name: collector-probe
version: 1
input: {type: object}
start: probe
steps:
  probe: {effect: probe.collector, idempotent: true}
"""


def test_the_block_freezes_what_exists_and_raises_the_young_threshold() -> None:
    before = gc.get_threshold()
    survivor = [object() for _ in range(10)]  # a container that outlives the block's start
    with worker_collector():
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > len(survivor), gc.get_freeze_count()
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_toolkit_run_runs_its_handlers_under_the_worker_collector(
    dsn: str, tmp_path: Path
) -> None:
    definition = tmp_path / "probe.yaml"
    definition.write_text(PROBE)
    before = gc.get_threshold()
    runner = CliRunner()
    env = {"TOOLKIT_DSN": dsn}

    def invoke(*args: str) -> str:
        result = runner.invoke(cli, list(args), env=env, catch_exceptions=False)
        assert result.exit_code == 0, result.stderr
        return result.stdout

    invoke("deploy", str(definition))
    task_id = invoke("submit", "collector-probe", "--input", "{}").strip()
    invoke("run", "--app", "tests.apps.collector", "--definitions", str(definition),
           "--until-idle")  # fmt: skip
    shown = json.loads(invoke("show", task_id, "--json"))
    assert shown["task"]["state"] == "succeeded", shown
    result = shown["task"]["result"]
    assert result["young_threshold"] == YOUNG_THRESHOLD and result["frozen"] > 0, shown
    assert gc.get_threshold() == before  # the test process got its own collector back


def test_the_exit_does_not_walk_the_heap_again(tmp_path: Path) -> None:
    # A cyclic garbage left at exit is what the interpreter's final pass would collect (its
    # finaliser printing): after the block, the exit freezes everything first.
    script = tmp_path / "leave.py"
    script.write_text(
        "import gc\n"
        "from toolkit.runtime.collector import worker_collector\n"
        "class Node:\n"
        "    def __del__(self): print('collected at exit', flush=True)\n"
        "with worker_collector():\n"
        "    pass\n"
        "gc.disable()\n"
        "node = Node(); node.self = node; del node\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    assert done.stdout == "", done
