"""The TaskBrowser's filter: widgets for the fields of one :class:`TaskFilter`.

State, tenant, definition and version are dropdowns (their choices come from the tasks the
store holds); tags, error, schedule and "created since" are text fields: tags as
``KEY=VALUE`` pairs (``customer=acme region=eu``, all of them), the schedule's name (its
runs: the ScheduleBoard's *Runs* button fills it in), the time as a duration before now
(``2h``) or an ISO 8601 time. The same names as the keyword arguments of
:class:`~toolkit.store.filters.TaskFilter` and the CLI's filter options (docs/many-tasks.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import ipywidgets as widgets

from toolkit.errors import ConfigError, InputError
from toolkit.lifecycle import TaskState
from toolkit.store.filters import TaskFilter
from toolkit.store.tasks import TaskRecord

#: The dropdowns' "no filter" choice.
ANY = "(any)"


class FilterBar:
    """The filter widgets of a TaskBrowser, and the :class:`TaskFilter` they make.

    Args:
        changed: called when the user changes a filter widget.

    Attributes:
        widget: the bar (two rows of widgets).
    """

    def __init__(self, changed: Callable[[], None]) -> None:
        narrow, wide = widgets.Layout(width="180px"), widgets.Layout(width="260px")
        self.state_filter = widgets.Dropdown(
            options=[ANY, *(s.value for s in TaskState)], value=ANY, description="state",
            layout=narrow,
        )  # fmt: skip
        self.tenant_filter = widgets.Dropdown(
            options=[ANY], value=ANY, description="tenant", layout=narrow
        )
        self.definition_filter = widgets.Dropdown(
            options=[ANY], value=ANY, description="definition", layout=wide
        )
        self.version_filter = widgets.Dropdown(
            options=[ANY], value=ANY, description="version", layout=narrow
        )
        self.tags_filter = widgets.Text(
            description="tags", placeholder="customer=acme region=eu", layout=wide
        )
        self.error_filter = widgets.Text(description="error", placeholder="Declined", layout=narrow)
        self.schedule_filter = widgets.Text(
            description="schedule", placeholder="name", layout=narrow
        )
        self.since_filter = widgets.Text(
            description="since", placeholder="2h or 2026-06-01", layout=narrow
        )
        self._changed = changed
        self._updating = False
        #: Fields set by :meth:`set` that no widget shows (step, wait reason ...).
        self._extra: dict[str, Any] = {}
        for control in self._dropdowns():
            control.observe(self._on_change, names="value")
        for text in self._texts():
            text.continuous_update = False
            text.observe(self._on_change, names="value")
        self.widget = widgets.VBox([
            widgets.HBox(list(self._dropdowns())),
            widgets.HBox(list(self._texts())),
        ])  # fmt: skip

    def _dropdowns(self) -> tuple[widgets.Dropdown, ...]:
        return (self.state_filter, self.tenant_filter, self.definition_filter, self.version_filter)

    def _texts(self) -> tuple[widgets.Text, ...]:
        return (self.tags_filter, self.error_filter, self.schedule_filter, self.since_filter)

    def _on_change(self, change: Mapping[str, Any]) -> None:
        if not self._updating:
            self._changed()

    def set(
        self,
        *,
        state: str | None = None,
        tenant: str | None = None,
        definition: str | None = None,
        version: int | None = None,
        tags: Mapping[str, str] | None = None,
        error: str | None = None,
        schedule: str | None = None,
        created_since: str | None = None,
        **fields: Any,
    ) -> None:
        """Set the filter (None: any), replacing the one set before; no refresh.

        Args:
            state: the state dropdown's value.
            tenant: the tenant dropdown's.
            definition: the definition dropdown's (a name).
            version: the version dropdown's.
            tags: the tags field's, key to value.
            error: the error field's.
            schedule: the schedule field's (a schedule's name: its runs).
            created_since: the "since" field's: a duration before now or a time.
            fields: other :class:`TaskFilter` fields (``step``, ``wait_reason``,
                ``finished_since`` ...), kept although no widget shows them.

        Raises:
            ValueError: a value a dropdown does not offer (refresh first to load the tenants,
                definitions and versions), or a field TaskFilter does not have.
        """
        unknown = set(fields) - set(TaskFilter.__dataclass_fields__)
        if unknown:
            raise ValueError(f"no filter field {', '.join(sorted(unknown))}")
        self._updating = True
        try:
            self.state_filter.value = state or ANY
            self.tenant_filter.value = tenant or ANY
            self.definition_filter.value = definition or ANY
            self.version_filter.value = ANY if version is None else str(version)
            self.tags_filter.value = " ".join(f"{k}={v}" for k, v in (tags or {}).items())
            self.error_filter.value = error or ""
            self.schedule_filter.value = schedule or ""
            self.since_filter.value = created_since or ""
            self._extra = {k: v for k, v in fields.items() if v is not None}
        except Exception as exc:  # traitlets raises TraitError for a value not offered
            raise ValueError(f"no such filter value: {exc}") from None
        finally:
            self._updating = False

    @property
    def where(self) -> TaskFilter:
        """The filter the widgets show.

        Raises:
            ConfigError: a text field does not parse (a tag without ``=``, a time that is
                neither a time nor a duration); the message names the field.
        """
        name, version = _value(self.definition_filter), _value(self.version_filter)
        try:
            return TaskFilter(
                state=_value(self.state_filter),
                tenant=_value(self.tenant_filter),
                definition=None if name is None else name + (f"@{version}" if version else ""),
                tags=_tags(self.tags_filter.value) or None,
                error=self.error_filter.value.strip() or None,
                schedule=self.schedule_filter.value.strip() or None,
                created_since=self.since_filter.value.strip() or None,
                **self._extra,
            )
        except InputError as exc:
            raise ConfigError(f"filter {exc.path}: {exc.message}") from None

    def offer(self, records: Iterable[TaskRecord]) -> None:
        """Offer the tenants, definitions and versions of ``records`` (and those chosen)."""
        records = list(records)
        tenant, name = _value(self.tenant_filter), _value(self.definition_filter)
        version = _value(self.version_filter)
        tenants = sorted({r.tenant for r in records} | ({tenant} if tenant else set()))
        names = sorted({r.definition_name for r in records} | ({name} if name else set()))
        versions = sorted(
            {str(r.definition_version) for r in records if name in (None, r.definition_name)}
            | ({version} if version else set()),
            key=int,
        )
        self._updating = True
        try:
            self.tenant_filter.options = [ANY, *tenants]
            self.tenant_filter.value = tenant or ANY
            self.definition_filter.options = [ANY, *names]
            self.definition_filter.value = name or ANY
            self.version_filter.options = [ANY, *versions]
            self.version_filter.value = version or ANY
        finally:
            self._updating = False


def _value(control: widgets.Dropdown) -> str | None:
    value = control.value
    return None if value in (ANY, None) else str(value)


def _tags(text: str) -> dict[str, str]:
    """``customer=acme region=eu`` (spaces or commas between) as a mapping.

    Raises:
        ConfigError: a pair without ``=``.
    """
    tags = {}
    for pair in text.replace(",", " ").split():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"filter tags: {pair!r} is not KEY=VALUE, e.g. customer=acme")
        tags[key] = value
    return tags
