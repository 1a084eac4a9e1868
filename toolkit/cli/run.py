"""``run``: a worker for an application's handlers, until a signal or an idle queue."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import anyio
import click

from toolkit.cli.apps import load_app, yaml_line
from toolkit.cli.definitions import load_by_line
from toolkit.cli.session import Settings, run_in_store
from toolkit.definition import WorkflowDefinition
from toolkit.errors import ConfigError, ToolkitError
from toolkit.metrics import WorkerMetrics
from toolkit.runtime.collector import worker_collector
from toolkit.runtime.supervisor import (
    CancellationToken,
    SupervisorConfig,
    SupervisorReport,
    WorkflowSupervisor,
)
from toolkit.runtime.worker import Worker
from toolkit.store import Store


@click.command()
@click.option(
    "--app",
    "app_spec",
    envvar="TOOLKIT_APP",
    show_envvar=True,
    required=True,
    help="The handlers: MODULE[:ATTR], an importable toolkit.App (ATTR defaults to app).",
)
@click.option(
    "--definitions",
    "definitions_path",
    envvar="TOOLKIT_DEFINITIONS",
    show_envvar=True,
    default="definitions",
    show_default=True,
    type=click.Path(exists=True, path_type=Path),
    help="Definition files or folder this worker runs.",
)
@click.option("--concurrency", default=8, show_default=True, help="Cycles running steps at most.")
@click.option(
    "--claim-batch",
    type=int,
    help="Tasks per claim at most. Default: half the concurrency, at least 16.",
)
@click.option(
    "--worker-id",
    envvar="TOOLKIT_WORKER_ID",
    show_envvar=True,
    help="Unique worker id. Default: HOST:HASH of the working directory.",
)
@click.option("--lease", default=30.0, show_default=True, help="Lease duration, seconds.")
@click.option(
    "--heartbeat",
    default=10.0,
    show_default=True,
    help="Heartbeat interval, seconds (at most lease/3).",
)
@click.option("--grace", default=10.0, show_default=True, help="Shutdown grace period, seconds.")
@click.option(
    "--poll-max",
    default=2.0,
    show_default=True,
    help="Longest wait between two claims of an idle worker, seconds (new work wakes it at "
    "once through LISTEN/NOTIFY; polling is the fallback).",
)
@click.option(
    "--listen-probe",
    default=10.0,
    show_default=True,
    help="After this long without a notification, the LISTEN connection must answer a probe "
    "within as long again, or it is opened anew, seconds.",
)
@click.option(
    "--call-grace",
    default=5.0,
    show_default=True,
    help="How long a handler may run past its step's timeout, or a cycle past its "
    "cancellation, before the worker gives it up (stops renewing its lease), seconds.",
)
@click.option(
    "--checkpoint-window",
    default=SupervisorConfig.checkpoint_window,
    show_default=True,
    help="Idempotent effects that end within this long of their cycle's last write leave "
    "their outcomes to its next write (a crash calls at most this much idempotent work "
    "again, with the same keys); 0 writes every outcome before the next call, seconds.",
)
@click.option(
    "--summary-every",
    default=60.0,
    show_default=True,
    help="Print a line of what the worker did every this many seconds, on stderr, when it did "
    "anything (0: never).",
)
@click.option(
    "--until-idle",
    is_flag=True,
    help="Exit once no task is queued, leased, or waiting and due (future timers and signal "
    "waits do not keep it up).",
)
@click.option(
    "--metrics-port",
    type=int,
    envvar="TOOLKIT_METRICS_PORT",
    show_envvar=True,
    help="Serve Prometheus metrics on HOST:PORT/metrics (see --metrics-host).",
)
@click.option(
    "--metrics-host",
    envvar="TOOLKIT_METRICS_HOST",
    show_envvar=True,
    default="127.0.0.1",
    show_default=True,
    help="Address the metrics endpoint binds (0.0.0.0 for every interface).",
)
@click.pass_obj
def run(
    settings: Settings,
    app_spec: str,
    definitions_path: Path,
    concurrency: int,
    claim_batch: int | None,
    worker_id: str | None,
    lease: float,
    heartbeat: float,
    grace: float,
    poll_max: float,
    listen_probe: float,
    call_grace: float,
    checkpoint_window: float,
    summary_every: float,
    until_idle: bool,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Run a worker until SIGINT/SIGTERM (or, with --until-idle, until the queue drains)."""
    config = SupervisorConfig(
        concurrency=concurrency, claim_batch=claim_batch, lease=lease, heartbeat=heartbeat,
        grace=grace, until_idle=until_idle, idle_backoff_max=poll_max,
        idle_backoff_min=min(SupervisorConfig.idle_backoff_min, poll_max),
        listen_probe=listen_probe, call_grace=call_grace, checkpoint_window=checkpoint_window,
    )  # fmt: skip
    app = load_app(app_spec)
    # A version registered before a check was made stricter still runs; registering one
    # anew with such a fault is refused when the worker deploys its definitions.
    definitions = load_by_line([definitions_path], accept_new_only=True)
    app.check(definitions, yaml_line)  # as the worker does, with the files' lines

    unserved: list[str] = []  # --until-idle: the versions nobody ran (see `_unserved`)

    async def serve(store: Store) -> SupervisorReport:
        worker = Worker(store, app, definitions, worker_id=worker_id)
        shutdown = CancellationToken()
        metrics = WorkerMetrics(store.db.pool_stats)
        if metrics_port is not None:
            try:
                metrics.serve(metrics_port, metrics_host)
            except OSError as exc:
                raise ConfigError(f"--metrics-port {metrics_port}: {exc}") from exc
        supervisor = WorkflowSupervisor(worker, config, metrics)
        names = ", ".join(f"{d.name}@{d.version}" for d in definitions)
        start_line = (
            f"worker {worker.worker_id}: running {len(definitions)} definition(s) ({names}) "
            f"from {definitions_path}, concurrency {concurrency}, on {settings.describe()}"
            f"{'' if metrics_port is None else f', metrics on {metrics_host}:{metrics_port}'}; "
            f"{'exits when idle' if until_idle else 'Ctrl-C stops it gracefully'}"
        )
        with worker_collector():  # what is loaded by now stays: out of the collector's way
            async with anyio.create_task_group() as tg:
                tg.start_soon(_stop_on_signals, shutdown, tg.cancel_scope, worker.worker_id,
                              grace)  # fmt: skip
                tg.start_soon(_announce, supervisor, start_line, summary_every)
                await supervisor.run(shutdown)
                tg.cancel_scope.cancel()
        if until_idle:
            unserved.extend(await _unserved(store, definitions))
        if supervisor.report.abandoned:
            # A handler that ignores cancellation cannot be stopped, and would hold the
            # interpreter's exit up (its task is cancelled again and again): the process
            # ends here, its work written and its leases released or lapsing.
            _print_report(supervisor.report)
            click.echo(
                f"warning: {supervisor.report.abandoned} handler call(s) ignored their "
                "cancellation and were given up; the worker exits without waiting for them",
                err=True,
            )
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        return supervisor.report

    report = run_in_store(settings, serve, pool_size=concurrency + 2)
    _print_report(report)
    if unserved:  # --until-idle: why some tasks did not run here
        click.echo(
            f"note: live tasks of definition versions no live worker has loaded: "
            f"{', '.join(unserved)}; run a worker with their definitions (`toolkit doctor`)",
            err=True,
        )
    if report.registration_lost:
        raise ToolkitError(
            f"worker id {report.worker_id!r} was taken over by another process while this one "
            "was stalled; this worker stopped (give each worker its own --worker-id)"
        )


async def _unserved(store: Store, definitions: list[WorkflowDefinition]) -> list[str]:
    """Live tasks of versions this worker did not load and no live worker has loaded.

    As ``NAME vVERSION (N)``; none when the store cannot say (the run's outcome stands).
    """
    loaded = {(d.name, d.version) for d in definitions}
    try:
        counts = await store.definitions.unavailable()
    except ToolkitError:
        return []
    return [f"{name} v{version} ({n})" for (name, version), n in sorted(counts.items())
            if (name, version) not in loaded]  # fmt: skip


def _print_report(report: SupervisorReport) -> None:
    """The supervisor report, one line (docs/operations.md)."""
    click.echo(
        f"worker {report.worker_id}: claimed {report.claimed}, succeeded {report.succeeded}, "
        f"failed {report.failed}, cancelled {report.cancelled}, waiting {report.waiting}, "
        f"retried {report.retried}, "
        f"released {report.released}, lease lost {report.lease_lost}, "
        f"database outages {report.database_outages}, cycles {report.cycles}, "
        f"max loop lag {report.max_loop_lag * 1000:.0f} ms, "
        f"wall {report.wall_time:.2f} s"
    )


async def _announce(supervisor: WorkflowSupervisor, start_line: str, every: float) -> None:
    """The start line on stderr once the worker is registered, then a line of what changed.

    The summary comes every ``every`` seconds (0: never), when something changed.
    """
    await supervisor.registered.wait()
    click.echo(start_line, err=True)
    report = supervisor.report
    fields = ("claimed", "succeeded", "failed", "cancelled", "waiting", "retried")
    before = {name: 0 for name in fields}
    while every > 0:
        await anyio.sleep(every)
        now = {name: getattr(report, name) for name in fields}
        if now == before:
            continue
        done = ", ".join(f"{name} {now[name] - before[name]}" for name in fields)
        click.echo(f"worker {report.worker_id}: in the last {every:g} s: {done}", err=True)
        before = now


async def _stop_on_signals(
    shutdown: CancellationToken, scope: anyio.CancelScope, worker_id: str, grace: float
) -> None:
    """First SIGINT/SIGTERM: graceful shutdown, said on stderr. A second one: stop at once."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            if shutdown.cancelled:
                scope.cancel()
                return
            shutdown.cancel()
            click.echo(
                f"worker {worker_id}: stopping: no more claims; the "
                f"cycles running get up to {grace:g} s to end (--grace), then are cancelled "
                "and release their tasks; a second Ctrl-C stops at once",
                err=True,
            )
