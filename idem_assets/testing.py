"""Prove, from your own pytest suite, that your assets are safe to rerun.

Each property materialises your assets for real (``dg.materialize`` on fresh DuckDB files under a
directory you give, usually ``tmp_path``) in two ways that must not matter, reads every stored
output back through its own IO manager, and compares the rows partition by partition:

- ``rerun``: the same partitions materialised twice (day by day, and the range in one run) leave
  the same rows, and no :class:`~idem_assets.Outbox` action is performed a second time;
- ``chunking``: the range materialised in one run equals the same days materialised one by one;
- ``input_order``: the rows an asset *receives* are reversed (every input is loaded through a
  wrapping IO manager that permutes the loaded rows), and the output must not change;
- ``clock``: the runs happen under two different frozen wall clocks (time-machine, the
  ``idem_assets[testing]`` extra), which catches ``datetime.now()`` and ``date.today()``;
- ``crash``: a crash injected at each stage of the publish (guards passed, deleted, inserted,
  before commit) of each asset leaves the old window exactly as it was.

The first difference raises :class:`RerunSafetyError`, an ``AssertionError`` whose message names
the asset, the partition, the property and the rows only one side has.
"""

import contextlib
import tempfile
import warnings
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta
from pathlib import Path
from typing import Any, Literal

import dagster as dg
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from idem_assets.lib.content import content_fingerprint
from idem_assets.lib.errors import ConfigurationError
from idem_assets.lib.outbox import DeliveryRecord, Outbox
from idem_assets.lib.publish import PUBLISH_STAGES, STAGE_HOOK
from idem_assets.lib.samples import format_sample
from idem_assets.lib.windows import Box, as_pairs, cells_for, window_from_keys

Property = Literal["rerun", "chunking", "input_order", "clock", "crash"]
PROPERTIES: tuple[Property, ...] = ("rerun", "chunking", "input_order", "clock", "crash")

#: A mapping of resources (the DuckDB files and outbox ledgers of idem_assets' resources are moved
#: into each trial's directory), or a function of the trial's directory that builds them.
Resources = Mapping[str, Any] | Callable[[Path], Mapping[str, Any]]

_PROBE = "idem_rerun_safety_probe"
_RANGE_START = "dagster/asset_partition_range_start"
_RANGE_END = "dagster/asset_partition_range_end"
_ARROW = dg.PythonObjectDagsterType(pa.Table)
_SHOWN = 5

_CAUSES: dict[Property, str] = {
    "rerun": (
        "the second run added rows or wrote new values. Write through a replacing IO manager"
        " (ia.DuckDBOverwriteIOManager or ia.DuckDBMergeIOManager, never an append), and derive"
        " every value from the input (uuid5 of the natural key, not uuid4; no counters)."
    ),
    "chunking": (
        "the asset computes across the whole run instead of per partition (a row number, a rank"
        " or a total over all of context.partition_keys). Compute per partition: group or"
        " partition by the day column, or loop over context.partition_keys."
    ),
    "input_order": (
        "the output depends on the order the input rows arrive in (drop_duplicates(keep='first')"
        " or groupby().first() without sorting, a row number without ORDER BY). Sort by a"
        " deterministic key first, or let the merge pick the winner:"
        " metadata={'primary_key': [...], 'dedupe_order_by': ['updated_at']}."
    ),
    "clock": (
        "a value depends on the wall clock (datetime.now(), date.today(), time.time()). Derive it"
        " from the partition (context.partition_time_window) or from the data, or keep run facts"
        " in Dagster's run metadata."
    ),
    "crash": (
        "the write is not one transaction, so a crash part-way leaves a partial window (the"
        " DELETE committed without the INSERT). Write through ia.DuckDBOverwriteIOManager or"
        " ia.DuckDBMergeIOManager, which publish in one transaction."
    ),
}


class RerunSafetyError(AssertionError):
    """An asset is not safe to rerun: two ways of materialising a partition left different rows."""

    def __init__(
        self,
        prop: Property,
        asset: str,
        partition: str | None,
        detail: str,
        only_first: Sequence[Mapping[str, Any]] = (),
        only_second: Sequence[Mapping[str, Any]] = (),
        labels: tuple[str, str] = ("first", "second"),
    ) -> None:
        self.property = prop
        self.asset = asset
        self.partition = partition
        self.only_first = list(only_first)
        self.only_second = list(only_second)
        self.labels = labels
        where = f"asset '{asset}'" + (f", partition {partition}" if partition else "")
        lines = [f"Not safe to rerun: {where}, property '{prop}': {detail}"]
        if only_first or only_second:
            for label, rows in zip(labels, (self.only_first, self.only_second), strict=True):
                lines.append(f"  Rows only in the {label} ({len(rows)}):")
                lines.append(_show_rows(rows) if rows else "    (none)")
        lines.append(f"  Likely cause: {_CAUSES[prop]}")
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class RerunSafetyReport:
    """What a passing check covered: properties, assets compared, partitions and runs."""

    properties: list[Property]
    partitions: list[str | None]
    #: Assets whose stored output was read back and compared.
    compared: list[str]
    #: Assets with no stored output (side effects only); their outbox actions are still counted.
    not_stored: list[str]
    #: Properties that did not apply, with the reason.
    skipped: dict[str, str] = field(default_factory=dict)
    runs: int = 0

    def __str__(self) -> str:
        """One line per fact, for a test's log."""
        parts = [
            f"rerun-safe: {', '.join(self.properties)}",
            f"partitions {', '.join(str(p) for p in self.partitions)}",
            f"{len(self.compared)} asset(s) compared, {self.runs} run(s)",
        ]
        parts += [f"{p} skipped ({why})" for p, why in self.skipped.items()]
        return "; ".join(parts)


def assert_rerun_safe(
    assets: Sequence[Any],
    *,
    resources: Resources,
    workdir: Path | None = None,
    partition: str | None = None,
    partition_range: tuple[str, str] | None = None,
    properties: Collection[Property] = PROPERTIES,
    clocks: tuple[datetime, datetime] | None = None,
) -> RerunSafetyReport:
    """Check every property (or ``properties``) on ``assets``; raise on the first unsafe one.

    ``assets`` is what ``dg.materialize`` takes (asset checks included). Give one ``partition``
    or a ``partition_range`` (first, last); ``chunking`` needs a range of two or more. Each trial
    gets a directory under ``workdir`` (pytest's ``tmp_path`` keeps them for a look after a
    failure); without one, a temporary directory is used and removed.
    """
    unknown = set(properties) - set(PROPERTIES)
    if unknown:
        raise ConfigurationError(
            f"Unknown rerun-safety properties {sorted(unknown)}. Fix: choose from {PROPERTIES}."
        )
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="idem_rerun_")))
        kit = stack.enter_context(
            _Kit(assets, resources, workdir, partition, partition_range, clocks)
        )
        checked: list[Property] = []
        skipped: dict[str, str] = {}
        for prop in PROPERTIES:
            if prop not in properties:
                continue
            if prop == "chunking" and len(kit.keys) < 2:
                skipped[prop] = "needs a partition_range of two or more partitions"
                continue
            kit.check(prop)
            checked.append(prop)
        return kit.report(checked, skipped)


def assert_rerun_idempotent(assets: Sequence[Any], **kwargs: Any) -> RerunSafetyReport:
    """Materialise the partition(s) twice, day by day and as one range; the rows must not change."""
    return assert_rerun_safe(assets, properties=["rerun"], **kwargs)


def assert_chunking_invariant(assets: Sequence[Any], **kwargs: Any) -> RerunSafetyReport:
    """The range in one run must equal the same partitions run one at a time."""
    report = assert_rerun_safe(assets, properties=["chunking"], **kwargs)
    if report.skipped:
        raise ConfigurationError(
            "assert_chunking_invariant compares a range run with day-by-day runs. Fix: pass"
            " partition_range=(first, last) spanning two or more partitions."
        )
    return report


def assert_input_order_invariant(assets: Sequence[Any], **kwargs: Any) -> RerunSafetyReport:
    """Reverse the rows every asset receives; its output must not change."""
    return assert_rerun_safe(assets, properties=["input_order"], **kwargs)


def assert_clock_invariant(assets: Sequence[Any], **kwargs: Any) -> RerunSafetyReport:
    """Materialise under two different frozen wall clocks; the rows must not change."""
    return assert_rerun_safe(assets, properties=["clock"], **kwargs)


def assert_crash_safe(assets: Sequence[Any], **kwargs: Any) -> RerunSafetyReport:
    """Crash each asset's publish at each stage; the old window must survive unchanged."""
    return assert_rerun_safe(assets, properties=["crash"], **kwargs)


class InjectedCrash(RuntimeError):
    """Raised inside a publish by the ``crash`` property."""


Snapshot = dict[tuple[str, str | None], pa.Table]


@dataclass
class _State:
    """One warehouse under test: its directory, resources, Dagster instance and wall clock."""

    name: str
    directory: Path
    #: As given (files moved into ``directory``); snapshots read through these.
    resources: dict[str, Any]
    #: What the runs use: the same, or with every IO manager's loads reversed.
    run_resources: dict[str, Any]
    instance: dg.DagsterInstance
    clock: datetime


@dataclass(frozen=True)
class _Stored:
    """An asset whose output an IO manager stored, and how to read it back."""

    key: dg.AssetKey
    assets_def: dg.AssetsDefinition

    @property
    def name(self) -> str:
        return self.key.to_user_string()


class _Kit:
    """The trials of one check: states, runs, snapshots and comparisons."""

    def __init__(
        self,
        assets: Sequence[Any],
        resources: Resources,
        workdir: Path,
        partition: str | None,
        partition_range: tuple[str, str] | None,
        clocks: tuple[datetime, datetime] | None,
    ) -> None:
        self.assets = list(assets)
        self.resources = resources
        self.workdir = Path(workdir)
        self.partitions_def = _partitions_def(self.assets)
        self.keys = _keys(self.partitions_def, partition, partition_range)
        # A naive clock is UTC, as the partitions' windows are.
        self.clocks = tuple(
            c if c.tzinfo else c.replace(tzinfo=UTC)
            for c in clocks or _default_clocks(self.partitions_def, self.keys)
        )
        self.states: list[_State] = []
        self.runs = 0
        self.order: list[str] = []
        self.stored: dict[str, _Stored] = {}
        self.not_stored: list[str] = []
        self._baseline: tuple[_State, Snapshot] | None = None
        self._chunked: tuple[_State, Snapshot] | None = None

    def __enter__(self) -> "_Kit":
        return self

    def __exit__(self, *exc: object) -> None:
        for state in self.states:
            state.instance.dispose()

    # --- states and runs -------------------------------------------------------------------

    def state(self, name: str, clock: datetime, shuffled: bool = False) -> _State:
        """A fresh warehouse (and outbox ledger) under ``workdir/name``."""
        directory = self.workdir / name
        directory.mkdir(parents=True, exist_ok=False)
        res = dict(
            self.resources(directory)
            if callable(self.resources)
            else _relocated(self.resources, directory)
        )
        runs_with = {k: _reversing(r) for k, r in res.items()} if shuffled else res
        instance = dg.DagsterInstance.ephemeral()
        state = _State(name, directory, res, runs_with, instance, clock)
        self.states.append(state)
        return state

    def run(
        self,
        state: _State,
        keys: Sequence[str | None],
        *,
        chunked: bool,
        selection: Sequence[dg.AssetKey] | None = None,
        raise_on_error: bool = True,
    ) -> list[dg.ExecuteInProcessResult]:
        """Materialise ``keys`` in one run (``chunked``) or one run per key, oldest first."""
        batches = (
            [_partition_args(keys, chunked=True)]
            if chunked
            else [_partition_args([key], chunked=False) for key in keys]
        )
        results = []
        for partition_key, tags in batches:
            with _travel(state.clock), warnings.catch_warnings():
                # One ephemeral job holds assets with different backfill policies by design.
                warnings.filterwarnings("ignore", message=".*varying BackfillPolicies")
                try:
                    result = dg.materialize(
                        self.assets,
                        resources=state.run_resources,
                        instance=state.instance,
                        partition_key=partition_key,
                        tags=tags,
                        selection=list(selection) if selection is not None else None,
                        raise_on_error=raise_on_error,
                    )
                except Exception as exc:
                    what = f"{keys[0]}...{keys[-1]}" if tags else partition_key
                    exc.add_note(
                        f"idem_assets.testing: the run of {what} in trial '{state.name}' failed"
                        " before anything could be compared; fix the run first."
                    )
                    raise
            self.runs += 1
            self._learn(result)
            results.append(result)
        return results

    def _learn(self, result: dg.ExecuteInProcessResult) -> None:
        """Record which assets were materialised, in run order, and which had stored output."""
        handled = {
            (e.step_key, getattr(e.event_specific_data, "output_name", None))
            for e in result.all_events
            if e.event_type_value == "HANDLED_OUTPUT"
        }
        for event in result.get_asset_materialization_events():
            key = event.materialization.asset_key
            name = key.to_user_string()
            if name in self.order:
                continue
            self.order.append(name)
            assets_def = _definition_of(self.assets, key)
            output = assets_def.get_output_name_for_asset_key(key)
            if (event.step_key, output) in handled:
                self.stored[name] = _Stored(key, assets_def)
            else:
                self.not_stored.append(name)

    # --- snapshots ---------------------------------------------------------------------------

    def snapshot(self, state: _State, only: Sequence[str] | None = None) -> Snapshot:
        """Every stored asset's rows per partition, as a downstream asset receives them."""
        names = [n for n in self.order if n in self.stored and (only is None or n in only)]
        tables = self._probe(state, names)
        snap: Snapshot = {}
        for name in names:
            snap.update(_per_partition(name, tables[name], self.stored[name], self.keys))
        return snap

    def _probe(self, state: _State, names: Sequence[str]) -> dict[str, pa.Table]:
        """Load ``names`` for the trial's partitions in a real run of a downstream probe asset.

        A real run, not a hand-built InputContext: an IO manager may read anything from its
        context (the step, the instance, its own config), and this is what a reader gets.
        """
        captured: dict[str, pa.Table] = {}
        ins = {
            f"input_{i}": dg.AssetIn(
                key=self.stored[n].key, dagster_type=_read_type(self.stored[n])
            )
            for i, n in enumerate(names)
        }

        @dg.asset(name=_PROBE, partitions_def=self.partitions_def, ins=ins)
        def probe(**inputs: Any) -> None:
            for i, n in enumerate(names):
                captured[n] = _as_table(inputs[f"input_{i}"])

        partition_key, tags = _partition_args(self.keys, chunked=True)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*varying BackfillPolicies")
            dg.materialize(
                [*self.assets, probe],
                resources=state.resources,
                instance=state.instance,
                selection=[probe.key],
                partition_key=partition_key,
                tags=tags,
            )
        return captured

    def compare(
        self, prop: Property, labels: tuple[str, str], first: Snapshot, second: Snapshot
    ) -> None:
        """Raise :class:`RerunSafetyError` at the first (asset, partition) that differs."""
        for (asset, key), table in first.items():
            other = second[(asset, key)]
            a, b = content_fingerprint(table), content_fingerprint(other)
            if a == b:
                continue
            only_first, only_second = _diff(table, other)
            raise RerunSafetyError(
                prop,
                asset,
                key,
                f"{labels[0]}: {table.num_rows} rows (fingerprint {a}); {labels[1]}:"
                f" {other.num_rows} rows (fingerprint {b}).",
                only_first,
                only_second,
                labels,
            )

    # --- properties --------------------------------------------------------------------------

    def baseline(self) -> tuple[_State, Snapshot]:
        """Day by day under the first clock: the reference every property compares with."""
        if self._baseline is None:
            state = self.state("baseline", self.clocks[0])
            self.run(state, self.keys, chunked=False)
            self._baseline = (state, self.snapshot(state))
        return self._baseline

    def chunked(self) -> tuple[_State, Snapshot]:
        """The range in one run, under the first clock."""
        if self._chunked is None:
            state = self.state("chunked", self.clocks[0])
            self.run(state, self.keys, chunked=True)
            self._chunked = (state, self.snapshot(state))
        return self._chunked

    def check(self, prop: Property) -> None:
        """Run the trials of one property and compare them with the baseline."""
        state, base = self.baseline()
        if prop == "rerun":
            before = _outbox_records(state)
            self.run(state, self.keys, chunked=False)
            self.compare(prop, ("first run", "rerun"), base, self.snapshot(state))
            _assert_no_new_deliveries(before, _outbox_records(state))
            if len(self.keys) > 1:
                chunk_state, first = self.chunked()
                before = _outbox_records(chunk_state)
                self.run(chunk_state, self.keys, chunked=True)
                self.compare(
                    prop, ("first range run", "range rerun"), first, self.snapshot(chunk_state)
                )
                _assert_no_new_deliveries(before, _outbox_records(chunk_state))
        elif prop == "chunking":
            _, chunk = self.chunked()
            self.compare(prop, ("day-by-day runs", "range run"), base, chunk)
        elif prop == "input_order":
            shuffled = self.state("input_order", self.clocks[0], shuffled=True)
            self.run(shuffled, self.keys, chunked=False)
            self.compare(prop, ("input in order", "input reversed"), base, self.snapshot(shuffled))
        elif prop == "clock":
            later = self.state("clock", self.clocks[1])
            self.run(later, self.keys, chunked=False)
            labels = (
                f"run at {self.clocks[0]:%Y-%m-%d %H:%M} UTC",
                f"run at {self.clocks[1]:%Y-%m-%d %H:%M} UTC",
            )
            self.compare(prop, labels, base, self.snapshot(later))
        else:
            self.crash(state)

    def crash(self, state: _State) -> None:
        """Crash each stored asset's publish at each stage; its windows must stay as they were."""
        before = self.snapshot(state)
        target = self.keys[-1]
        for name in list(self.order):
            stored = self.stored.get(name)
            if stored is None:
                continue
            for stage in PUBLISH_STAGES:
                fired: list[str] = []

                def crash_at(reached: str, stage: str = stage, fired: list[str] = fired) -> None:
                    fired.append(reached)
                    if reached == stage and fired.count(stage) == 1:
                        raise InjectedCrash(f"crash injected at publish stage '{stage}'")

                token = STAGE_HOOK.set(crash_at)
                try:
                    (result,) = self.run(
                        state, [target], chunked=False, selection=[stored.key], raise_on_error=False
                    )
                finally:
                    STAGE_HOOK.reset(token)
                if stage not in fired:
                    raise RerunSafetyError(
                        "crash",
                        name,
                        target,
                        f"its write never reached the publish stage '{stage}', so no crash could"
                        " be injected there: its IO manager does not publish through"
                        " idem_assets (reached: "
                        f"{fired or 'none'}).",
                    )
                if result.success:
                    raise RerunSafetyError(
                        "crash",
                        name,
                        target,
                        f"a crash injected at '{stage}' did not fail the run; the IO manager"
                        " swallowed it, so a half-done write would be reported as a success.",
                    )
                after = self.snapshot(state, only=[name])
                self.compare(
                    "crash",
                    ("window before", f"window after a crash at '{stage}'"),
                    {k: v for k, v in before.items() if k[0] == name},
                    after,
                )

    def report(self, checked: list[Property], skipped: dict[str, str]) -> RerunSafetyReport:
        """The summary of a passing check."""
        return RerunSafetyReport(
            properties=checked,
            partitions=list(self.keys),
            compared=[n for n in self.order if n in self.stored],
            not_stored=list(self.not_stored),
            skipped=skipped,
            runs=self.runs,
        )


def _reversing(resource: Any) -> Any:
    """``resource`` with its loads reversed if it is an IO manager; anything else as it is."""
    if isinstance(resource, dg.ConfigurableIOManagerFactory | dg.IOManagerDefinition):
        # Keep the definition's config schema: IO managers read context.resource_config.
        inner = (
            resource
            if isinstance(resource, dg.IOManagerDefinition)
            else resource.get_resource_definition()
        )
        create: Any = inner.resource_fn
        return dg.IOManagerDefinition(
            resource_fn=lambda init: _ReversedLoads(create(init)),
            config_schema=inner.config_schema,
            required_resource_keys=inner.required_resource_keys,
            description=inner.description,
        )
    if isinstance(resource, dg.IOManager):
        return _ReversedLoads(resource)
    return resource


class _ReversedLoads(dg.IOManager):
    """Delegates to an IO manager, but hands every loaded input over in reverse row order.

    Reversal swaps every pair of rows, so any dependence on which of two rows comes first (keep
    the first duplicate, take the first of a group) changes the output.
    """

    def __init__(self, inner: dg.IOManager) -> None:
        self._inner = inner

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        """Store exactly as the wrapped IO manager does."""
        self._inner.handle_output(context, obj)

    def load_input(self, context: dg.InputContext) -> Any:
        """Load through the wrapped IO manager, then reverse the rows."""
        return reverse_rows(self._inner.load_input(context))

    def __getattr__(self, name: str) -> Any:
        # Resources typed as the wrapped IO manager (e.g. a check reading its .database).
        if name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)


def reverse_rows(value: Any) -> Any:
    """The rows of a DataFrame or Arrow table in reverse order; anything else unchanged."""
    if isinstance(value, pd.DataFrame):
        return value.iloc[::-1].reset_index(drop=True)
    if isinstance(value, pa.Table):
        return value.take(pa.array(range(value.num_rows - 1, -1, -1), pa.int64()))
    return value


def _partitions_def(assets: Sequence[Any]) -> dg.PartitionsDefinition | None:
    for a in assets:
        pdef = getattr(a, "partitions_def", None)
        if pdef is not None:
            return pdef
    return None


def _keys(
    pdef: dg.PartitionsDefinition | None,
    partition: str | None,
    partition_range: tuple[str, str] | None,
) -> list[str | None]:
    if pdef is None:
        if partition or partition_range:
            raise ConfigurationError(
                "The assets are unpartitioned, but a partition was given. Fix: drop partition=..."
                " and partition_range=...."
            )
        return [None]
    if (partition is None) == (partition_range is None):
        raise ConfigurationError(
            "Give exactly one of partition='2026-01-02' or partition_range=('2026-01-01',"
            " '2026-01-03'), the partitions the trials materialise."
        )
    if partition is not None:
        return [partition]
    assert partition_range is not None
    keys = pdef.get_partition_keys_in_range(dg.PartitionKeyRange(*partition_range))
    return list(keys)


def _default_clocks(
    pdef: dg.PartitionsDefinition | None, keys: Sequence[str | None]
) -> tuple[datetime, datetime]:
    """The morning after the last partition, and a year and a season later in the afternoon."""
    end = datetime(2026, 1, 1, tzinfo=UTC)
    if pdef is not None and keys[-1] is not None:
        window = window_from_keys(pdef, [str(k) for k in keys], "clock")
        # A time partition exists only once its window has ended: the clock must be past it.
        if window.timed:
            end = window.end.astimezone(UTC)
    day_after = datetime.combine(end.date() + timedelta(days=1), time(6, 5), UTC)
    return day_after, day_after + timedelta(days=400, hours=11, minutes=32)


def _relocated(resources: Mapping[str, Any], directory: Path) -> dict[str, Any]:
    """The resources, with each idem_assets DuckDB file and outbox ledger moved to ``directory``."""
    from idem_assets.lib.io_managers import DuckDBMergeIOManager, DuckDBOverwriteIOManager

    moved: dict[str, Any] = {}
    for name, res in resources.items():
        if isinstance(res, DuckDBOverwriteIOManager | DuckDBMergeIOManager):
            moved[name] = _with_field(res, "database", str(directory / Path(res.database).name))
        elif isinstance(res, Outbox):
            moved[name] = _with_field(res, "ledger", str(directory / Path(res.ledger).name))
        else:
            moved[name] = res
    return moved


def _config_of(resource: Any) -> dict[str, Any] | None:
    """A configurable resource's config, by the names its config schema uses."""
    if not isinstance(resource, dg.ConfigurableResource | dg.ConfigurableIOManagerFactory):
        return None
    fields = type(resource).model_fields
    return {(info.alias or f): getattr(resource, f) for f, info in fields.items()}


def _with_field(resource: Any, name: str, value: Any) -> Any:
    # model_copy keeps Dagster's stored config, so build a new resource from the fields.
    kwargs = _config_of(resource) or {}
    kwargs[type(resource).model_fields[name].alias or name] = value
    return type(resource)(**kwargs)


def _definition_of(assets: Sequence[Any], key: dg.AssetKey) -> dg.AssetsDefinition:
    for a in assets:
        if isinstance(a, dg.AssetsDefinition) and key in a.keys:
            return a
    raise ConfigurationError(f"Asset {key.to_user_string()} is not among the assets given.")


def _partition_args(keys: Sequence[str | None], chunked: bool) -> tuple[str | None, dict[str, str]]:
    """``partition_key`` and tags of a run over ``keys``: one key, or the range as one run."""
    if chunked and len(keys) > 1:
        return None, {_RANGE_START: str(keys[0]), _RANGE_END: str(keys[-1])}
    return keys[0], {}


def _per_partition(
    name: str, table: pa.Table, stored: _Stored, keys: Sequence[str | None]
) -> Snapshot:
    """Split an asset's rows of the whole range by partition, on its ``partition_expr`` column."""
    pdef = stored.assets_def.partitions_def
    if pdef is None:
        return {(name, None): table}
    if len(keys) == 1:
        return {(name, keys[0]): table}
    columns = stored.assets_def.metadata_by_key.get(stored.key, {}).get("partition_expr")
    pairs = as_pairs(getattr(columns, "value", columns))
    if not pairs or any(c not in table.column_names for _, c in pairs):
        return {(name, f"{keys[0]}...{keys[-1]}"): table}
    window = window_from_keys(pdef, [str(k) for k in keys], name)
    types = {c: table.schema.field(c).type for _, c in pairs}
    return {
        (name, key): table.filter(_in_box(box, types))
        for key, box in cells_for(window, pairs, types, always=True)
    }


def _in_box(box: Box, types: Mapping[str, pa.DataType]) -> pc.Expression:
    """An Arrow filter for the rows of one partition's box."""
    condition = pc.scalar(True)
    for cond in box:
        field, ctype = pc.field(cond.column), types[cond.column]
        if cond.spans:
            lo, hi = cond.spans[0]
            inside = (field >= pa.scalar(lo, ctype)) & (field < pa.scalar(hi, ctype))
        else:
            inside = field.isin(pa.array(cond.values, ctype))
        condition = condition & inside
    return condition


def _read_type(stored: _Stored) -> dg.DagsterType:
    """The type the asset declares for its output (IO managers pick a handler by it), else Arrow."""
    output = stored.assets_def.get_output_name_for_asset_key(stored.key)
    declared = stored.assets_def.op.output_dict[output].dagster_type
    return declared if isinstance(declared.typing_type, type) else _ARROW


def _as_table(value: Any) -> pa.Table:
    if isinstance(value, pa.Table):
        return value
    if isinstance(value, pa.RecordBatch):
        return pa.Table.from_batches([value])
    if isinstance(value, pd.DataFrame):
        return pa.Table.from_pandas(value, preserve_index=False)
    return pa.table({"value": [repr(value)]})


def _hashable(value: Any) -> Any:
    if isinstance(value, list | dict):
        return repr(value)
    return value


def _diff(first: pa.Table, second: pa.Table) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rows only in ``first`` and only in ``second``, as multisets (a doubled row shows once)."""
    columns = list(dict.fromkeys(first.column_names + second.column_names))

    def rows(table: pa.Table) -> Counter:
        return Counter(tuple(_hashable(row.get(c)) for c in columns) for row in table.to_pylist())

    a, b = rows(first), rows(second)
    only_a = [dict(zip(columns, r, strict=True)) for r in sorted((a - b).elements(), key=repr)]
    only_b = [dict(zip(columns, r, strict=True)) for r in sorted((b - a).elements(), key=repr)]
    return only_a, only_b


def _show_rows(rows: Sequence[Mapping[str, Any]]) -> str:
    columns = list(rows[0])
    text = format_sample(columns, [[r[c] for c in columns] for r in rows], limit=_SHOWN)
    if len(rows) > _SHOWN:
        text += f"\n    ... and {len(rows) - _SHOWN} more"
    return text


def _outbox_records(state: _State) -> dict[str, DeliveryRecord]:
    """Every delivery in the state's outbox ledgers, by idempotency key."""
    return {
        r.delivery.key: r
        for res in state.resources.values()
        if isinstance(res, Outbox)
        for r in res.records()
    }


def _assert_no_new_deliveries(
    before: Mapping[str, DeliveryRecord], after: Mapping[str, DeliveryRecord]
) -> None:
    repeated = [r for k, r in after.items() if before.get(k) != r]
    if repeated:
        first = repeated[0]
        d = first.delivery
        raise RerunSafetyError(
            "rerun",
            d.asset,
            d.partition or None,
            f"the rerun performed {len(repeated)} outbox action(s) again, e.g. '{d.action}'"
            f" revision {d.revision} (key {d.key}, {first.attempts} attempt(s), now"
            f" {first.status}); with the same content a rerun must skip it. Deliver through"
            " Outbox.deliver with the content the action carries, never a run-time value.",
        )


def _travel(clock: datetime) -> Any:
    """Freeze the wall clock at ``clock`` (ticking on), with time-machine from the extra."""
    try:
        import time_machine
    except ImportError as exc:  # pragma: no cover - the dev extra installs it
        raise ImportError(
            "idem_assets.testing runs every trial under a frozen wall clock and needs"
            " time-machine. Fix: pip install 'idem_assets[testing]'."
        ) from exc
    return time_machine.travel(clock, tick=True)
