"""The notebook console and the docs in a real browser (headless Chromium, Playwright).

JupyterLab runs tutorial 3 to its end; the test then works the ``TaskBrowser`` as a user
would — picks a task with the mouse, moves with the arrow keys, sends a signal with the
widget's button, previews and applies the redrive of a cancelled task — and saves
screenshots. Tutorial 7's ``ScheduleBoard`` is worked the same
way: resume, trigger and pause a schedule with its buttons, then show its runs in the
browser. The docs site, built to a folder and served on 127.0.0.1 with every other address
blocked, must draw its diagrams (offline Mermaid).

Skipped, with the reason, when Playwright or a Chromium is missing (``.ci/run`` installs
both). Set ``TOOLKIT_SCREENSHOTS=docs`` to write the screenshots to ``docs/images/`` (the
TaskBrowser and ScheduleBoard pictures the docs show), else they go to the test's temporary
folder.
"""

from __future__ import annotations

import functools
import http.server
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers.processes import REPO, wait_for

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt install chromium)"),
    pytest.mark.timeout(300),
]

#: Milliseconds a page may take for what it waits on (the notebook's whole run included).
PATIENCE = 120_000


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for_http(url: str, seconds: float, process: subprocess.Popen[bytes], log: Path) -> None:
    def answers() -> bool:
        tail = log.read_text(errors="replace")[-3000:]
        assert process.poll() is None, f"the server exited ({process.returncode}):\n{tail}"
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except OSError:
            return False

    wait_for(answers, timeout=seconds, what=f"{url} to answer")


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    if os.environ.get("TOOLKIT_SCREENSHOTS") == "docs":
        folder = REPO / "docs" / "images"
        folder.mkdir(exist_ok=True)
        return folder
    return tmp_path


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """JupyterLab on 127.0.0.1 over a copy of the tutorials; yields a tutorial's URL by name."""
    root = tmp_path / "lab"
    shutil.copytree(REPO / "notebooks", root)
    token, port = secrets.token_hex(16), free_port()
    settings = tmp_path / "settings"
    # No "get notified about Jupyter news?" toast over the widgets (and no request for news).
    news = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text('{"fetchNews": "false"}')
    env = {
        **os.environ, "PYTHONPATH": str(REPO), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"),
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
    }  # fmt: skip
    command = [
        sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}", f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}", "--ServerApp.open_browser=False",
        *(["--allow-root"] if os.geteuid() == 0 else []),
    ]  # fmt: skip
    log_path = tmp_path / "lab.log"
    log = log_path.open("wb")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        status = f"http://127.0.0.1:{port}/api/status?token={token}"
        wait_for_http(status, 60, process, log_path)
        yield lambda notebook: f"http://127.0.0.1:{port}/lab/tree/{notebook}?token={token}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def chromium(playwright: sync_api.Playwright) -> sync_api.Browser:
    assert CHROMIUM is not None
    return playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])


def run_all(page: sync_api.Page, url: str, last_output: str) -> None:
    """Open a notebook, run all its cells, and wait for the run to end with ``last_output``."""
    page.set_default_timeout(PATIENCE)
    page.goto(url)
    page.locator(".jp-Notebook").wait_for()
    page.get_by_text("Python 3 (ipykernel) | Idle").wait_for()
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    # The run has ended when no prompt shows a star and the last output is there.
    page.wait_for_function(
        "() => { const p = [...document.querySelectorAll('.jp-InputArea-prompt')];"
        " return p.length > 0 && !p.some(e => e.textContent.includes('*')); }"
    )
    page.locator("pre", has_text=last_output).first.wait_for()


def test_the_task_browser_works_in_jupyterlab(
    lab: Callable[[str], str], shots: Path, tmp_path: Path
) -> None:
    with sync_api.sync_playwright() as playwright:
        browser = chromium(playwright)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        run_all(page, lab("03-inspect.ipynb"), "error: task 2 was cancelled")
        listing = page.locator(".toolkit-task-list[role=listbox]").first
        listing.scroll_into_view_if_needed()

        # Pick a task with the mouse, then move with the arrow keys (issue 24, item 6).
        options = listing.locator("[role=option]")
        assert options.count() == 3, options.all_text_contents()
        detail = page.locator(".widget-html", has_text="approve-order v1").first
        options.nth(2).click()
        detail.get_by_text("task 1:").wait_for()  # newest first: task 1 is the last
        page.keyboard.press("ArrowUp")
        detail.get_by_text("task 2:").wait_for()
        page.keyboard.press("Home")
        detail.get_by_text("task 3:").wait_for()
        assert options.nth(0).get_attribute("aria-selected") == "true"
        page.screenshot(path=str(tmp_path / "task-browser.png"), full_page=False)

        # Task 3 waits for `approved`: the name is filled in; send it with the button.
        signal = page.locator(".widget-text").filter(has_text="signal").locator("input").first
        assert signal.input_value() == "approved"
        payload = page.locator(".widget-text").filter(has_text="payload").locator("input").first
        payload.fill('{"by": "browser"}')
        page.get_by_role("button", name="Send signal").click()
        page.get_by_text("sent to task 3").wait_for()
        page.screenshot(path=str(shots / "task-browser-signal.png"), full_page=False)
        # Its cancel and reconcile buttons: a waiting task can be cancelled, not reconciled,
        # nor redriven.
        assert page.get_by_role("button", name="Cancel task").is_enabled()
        assert page.get_by_role("button", name="Reconcile").is_disabled()
        assert page.get_by_role("button", name="Preview redrive").is_disabled()

        # Task 2 was cancelled: preview its redrive, then apply what the preview showed.
        options.nth(1).click()
        detail.get_by_text("task 2:").wait_for()
        redrive = page.get_by_role("button", name="Redrive task")
        assert redrive.is_disabled()
        page.get_by_role("button", name="Preview redrive").click()
        page.locator("pre", has_text="task 2 (approve-order v1, cancelled) resumes at").wait_for()
        redrive.click()
        page.get_by_text("task 2 redriven at step").wait_for()
        browser.close()


def test_the_schedule_board_works_in_jupyterlab(lab: Callable[[str], str], shots: Path) -> None:
    with sync_api.sync_playwright() as playwright:
        browser = chromium(playwright)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        run_all(page, lab("07-schedules.ipynb"), "the task browser shows the runs of schedule")
        row = page.locator(".toolkit-schedule-board-row", has_text="weekday-report").first
        row.scroll_into_view_if_needed()
        assert "paused: holidays" in row.inner_text()  # the tutorial paused it
        assert row.get_by_role("button", name="Pause").is_disabled()

        # Resume and trigger it with its buttons: the store changes, the row shows it.
        row.get_by_role("button", name="Resume").click()
        page.get_by_text("schedule weekday-report resumed; next tick").wait_for()
        row.get_by_role("button", name="Trigger").click()
        page.get_by_text("schedule weekday-report: task 4 started").wait_for()
        row.locator(".toolkit-schedule-run[data-task='4']").wait_for()
        assert row.locator(".toolkit-schedule-active").count() == 1
        assert row.locator(".toolkit-schedule-run").count() == 3
        page.screenshot(path=str(shots / "schedule-board.png"), full_page=False)

        # Pause it with a note typed in its row.
        row.locator("input[placeholder='why pause (a note)']").fill("from the browser")
        row.get_by_role("button", name="Pause").click()
        page.get_by_text("schedule weekday-report paused: from the browser").wait_for()

        # Runs: the task browser lists the schedule's three runs, not the other task.
        row.get_by_role("button", name="Runs").click()
        page.get_by_text(
            "the task browser shows the runs of schedule weekday-report: 3 tasks"
        ).wait_for()
        options = page.locator(".toolkit-task-list[role=listbox]").first.locator("[role=option]")
        assert options.count() == 3, options.all_text_contents()
        field = page.locator(".widget-text").filter(has_text="schedule").locator("input").first
        assert field.input_value() == "weekday-report"
        browser.close()


@pytest.fixture
def docs_site(tmp_path: Path) -> Iterator[str]:
    """The docs built with ``mkdocs build --strict`` and served on 127.0.0.1."""
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(site)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_docs_draw_their_diagrams_offline(docs_site: str, tmp_path: Path) -> None:
    blocked: list[str] = []

    def only_local(route: sync_api.Route) -> None:
        if route.request.url.startswith(docs_site):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    with sync_api.sync_playwright() as playwright:
        browser = chromium(playwright)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.set_default_timeout(PATIENCE)
        page.route("**/*", only_local)
        for path, shot in (
            ("/concepts/", "docs-task-states.png"),
            ("/tutorials/01-definitions/", "docs-tutorial-diagram.png"),
        ):
            page.goto(docs_site + path)
            # The theme draws each diagram into a closed shadow root of a `div.mermaid` that
            # replaces the source's `pre.mermaid`: drawn means no source is left, and a box.
            drawn = page.locator("div.mermaid").first
            drawn.wait_for()
            page.wait_for_function("() => !document.querySelector('pre.mermaid')")
            box = drawn.bounding_box()
            assert box is not None and box["height"] > 100, f"{path}: diagram box {box}"
            drawn.scroll_into_view_if_needed()
            page.screenshot(path=str(tmp_path / shot), full_page=False)
        browser.close()
    assert not [url for url in blocked if "mermaid" in url], f"fetched from outside: {blocked}"
