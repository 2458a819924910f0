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
  ``idem_assets[testing]`` extra), which catches ``datetime.now()`` and ``date.today()``; the
  second also runs in a timezone where the real date differs, which catches the clocks no one
  can freeze in-process (DuckDB's ``current_date``, numpy's ``datetime64('today')``);
- ``hash_seed``: the day-by-day runs are repeated in a fresh Python process under another
  ``PYTHONHASHSEED``, which catches ``hash()`` of text and the order of a set of strings;
- ``crash``: a crash injected at each stage of the publish (guards passed, deleted, inserted,
  before commit) of each asset leaves the old window exactly as it was.

The ``rerun`` property also watches what the assets' own code does outside their IO managers
(:mod:`idem_assets.lib.kit.side_effects`): a file it changes again, or an HTTP request that writes
(not sent through :class:`~idem_assets.Outbox`), fails it.

The first difference raises :class:`RerunSafetyError`, an ``AssertionError`` whose message names
the asset, the partition, the property and the rows only one side has.
"""

import contextlib
import hashlib
import importlib
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time as clock_time
import warnings
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo

import dagster as dg
import pandas as pd
import pyarrow as pa

from idem_assets.lib.dagster_layer.frames import to_arrow
from idem_assets.lib.dagster_layer.io_manager import IdempotentIOManager
from idem_assets.lib.kit.side_effects import SideEffect, watching
from idem_assets.lib.model.errors import ConfigurationError
from idem_assets.lib.model.samples import format_sample
from idem_assets.lib.model.windows import as_pairs, cells_for, window_from_keys
from idem_assets.lib.outbox.content import content_fingerprint
from idem_assets.lib.outbox.outbox import DeliveryRecord, Outbox
from idem_assets.lib.sql.predicates import arrow_expression
from idem_assets.lib.write.publish import PUBLISH_STAGES, STAGE_HOOK

Property = Literal["rerun", "chunking", "input_order", "clock", "hash_seed", "crash"]
PROPERTIES: tuple[Property, ...] = (
    "rerun",
    "chunking",
    "input_order",
    "clock",
    "hash_seed",
    "crash",
)

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
        "a value depends on the wall clock (datetime.now(), date.today(), time.time(), DuckDB's"
        " current_date or now(), numpy's datetime64('today')) or on the machine's timezone (a"
        " local date or hour). Derive it from the partition (context.partition_time_window) or"
        " from the data, or keep run facts in Dagster's run metadata."
    ),
    "hash_seed": (
        "a value depends on Python's hash seed, which differs from process to process: hash()"
        " of text (buckets such as hash(x) % 4), or the order a set of strings is iterated in"
        " (numbering rows as a set yields them). Use a stable hash (zlib.crc32, hashlib, uuid5)"
        " and sort before numbering (sorted(the_set))."
    ),
    "crash": (
        "the write is not one transaction, so a crash part-way leaves a partial window (the"
        " DELETE committed without the INSERT). Write through ia.DuckDBOverwriteIOManager or"
        " ia.DuckDBMergeIOManager, which publish in one transaction."
    ),
}
_SIDE_EFFECT_CAUSE = (
    "the asset's own code acts outside its IO managers: it writes a file, or sends a request,"
    " itself, and does it again on every run. Return the rows for an IO manager to store, or"
    " perform the action through ia.Outbox.deliver, which a rerun with the same content skips."
)
_FRESH_PROCESS = (
    "import sys; from idem_assets.testing import _fresh_process_main;"
    " sys.exit(_fresh_process_main(sys.argv[1]))"
)


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
        cause: str | None = None,
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
        lines.append(f"  Likely cause: {cause or _CAUSES[prop]}")
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
    #: What these runs did that the kit could not check: inputs it could not reverse.
    unseen: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        """One line per fact, for a test's log."""
        parts = [
            f"rerun-safe: {', '.join(self.properties)}",
            f"partitions {', '.join(str(p) for p in self.partitions)}",
            f"{len(self.compared)} asset(s) compared, {self.runs} run(s)",
        ]
        parts += [f"{p} skipped ({why})" for p, why in self.skipped.items()]
        parts += [f"not seen: {what}" for what in self.unseen]
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
        if "hash_seed" in properties:
            kit.start_fresh_process()
        for prop in PROPERTIES:
            if prop not in properties:
                continue
            if prop == "chunking" and len(kit.keys) < 2:
                skipped[prop] = "needs a partition_range of two or more partitions"
                continue
            why_not = kit.check(prop)
            if why_not:
                skipped[prop] = why_not
                continue
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


def assert_hash_seed_invariant(assets: Sequence[Any], **kwargs: Any) -> RerunSafetyReport:
    """Repeat the runs in a fresh Python process under another hash seed; the rows must not change.

    The fresh process imports the assets by name, so each must be a module-level name (or in a
    module-level list), and rebuilds each resource from its class (a module-level name) and
    config.
    """
    report = assert_rerun_safe(assets, properties=["hash_seed"], **kwargs)
    if report.skipped:
        raise ConfigurationError(
            f"assert_hash_seed_invariant could not start its fresh process:"
            f" {report.skipped['hash_seed']}."
        )
    return report


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
    #: The timezone its runs happen in (``None``: UTC, which each clock's travel sets).
    timezone: str | None = None
    #: What its runs' own code did outside the IO managers and the outbox.
    effects: list[SideEffect] = field(default_factory=list)


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
        keys: Sequence[str | None] | None = None,
    ) -> None:
        self.assets = list(assets)
        self.resources = resources
        self.workdir = Path(workdir)
        self.partitions_def = _partitions_def(self.assets)
        self.keys = list(keys) if keys else _keys(self.partitions_def, partition, partition_range)
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
        #: Inputs the input_order trial could not reverse: "asset 'x' input 'y' (list)".
        self.unreversed: list[str] = []
        #: When the last run ended, by the real clock.
        self._last_run_end = 0.0
        #: The hash_seed trial's process once started, or why it cannot start.
        self._fresh: _Started | str | None = None
        self._baseline: tuple[_State, Snapshot] | None = None
        self._chunked: tuple[_State, Snapshot] | None = None

    def __enter__(self) -> "_Kit":
        return self

    def __exit__(self, *exc: object) -> None:
        for state in self.states:
            state.instance.dispose()
        # A property that failed first leaves the fresh process nobody waits for.
        if isinstance(self._fresh, _Started) and self._fresh.process.poll() is None:
            self._fresh.process.kill()
            self._fresh.process.wait()

    # --- states and runs -------------------------------------------------------------------

    def state(
        self, name: str, clock: datetime, shuffled: bool = False, timezone: str | None = None
    ) -> _State:
        """A fresh warehouse (and outbox ledger) under ``workdir/name``."""
        directory = self.workdir / name
        directory.mkdir(parents=True, exist_ok=False)
        res = self.resources_for(directory)
        runs_with = {k: _reversing(r, self.unreversed) for k, r in res.items()} if shuffled else res
        instance = dg.DagsterInstance.ephemeral()
        state = _State(name, directory, res, runs_with, instance, clock, timezone)
        self.states.append(state)
        return state

    def resources_for(self, directory: Path) -> dict[str, Any]:
        """The resources of a trial in ``directory``."""
        if callable(self.resources):
            return dict(self.resources(directory))
        return _relocated(self.resources, directory)

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
            with (
                # Inside the travel: time-machine sets the process's timezone to the clock's.
                _travel(state.clock),
                _in_timezone(state.timezone),
                watching() as watch,
                warnings.catch_warnings(),
            ):
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
                    exc.add_note(self._failure_note(state, keys, bool(tags), exc))
                    raise
            state.effects.extend(watch.effects)
            self._last_run_end = clock_time.time()
            self.runs += 1
            self._learn(result)
            results.append(result)
        return results

    def later_second(self) -> None:
        """Wait until the real clock has left the second the last run ended in.

        A clock the kit cannot freeze and that counts whole seconds (numpy's
        ``datetime64('now')``) then reads differently in the runs compared next.
        """
        wait = int(self._last_run_end) + 1 - clock_time.time()
        if wait > 0:
            clock_time.sleep(wait)

    def _failure_note(
        self, state: _State, keys: Sequence[str | None], ranged: bool, exc: Exception
    ) -> str:
        """What the kit was doing when a run failed, and for a range run what avoids it."""
        what = f"{keys[0]}...{keys[-1]}" if ranged else keys[0]
        note = (
            f"idem_assets.testing: the run of {what} in trial '{state.name}' failed before"
            " anything could be compared; fix the run first."
        )
        if not ranged:
            return note
        text = " ".join(str(e) for e in _causes(exc))
        one_key = "partition_key" in text and "range" in text
        policies = [
            f"'{key.to_user_string()}' has {_policy_text(a.backfill_policy)}"
            for a in self.assets
            if isinstance(a, dg.AssetsDefinition) and a.backfill_policy is not None
            for key in a.keys
        ]
        return (
            note
            + (
                " An asset that reads context.partition_key can run only one partition per run,"
                " and this run holds a range."
                if one_key
                else ""
            )
            + (f" Backfill policies: {'; '.join(policies)}." if policies else "")
            + " Fix: read context.partition_keys (or context.partition_time_window) so a range"
            " run works, as a backfill chunk needs; or check one partition at a time:"
            f" assert_rerun_safe(..., partition={str(keys[-1])!r}), which skips chunking."
        )

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
            detail = (
                f"{labels[0]}: {table.num_rows} rows (fingerprint {a}); {labels[1]}:"
                f" {other.num_rows} rows (fingerprint {b})."
            )
            if not (only_first or only_second):
                detail += (
                    " The rows hold equal values, but the columns differ:"
                    f" {_columns(table)} vs {_columns(other)}."
                )
            raise RerunSafetyError(prop, asset, key, detail, only_first, only_second, labels)

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

    def check(self, prop: Property) -> str | None:
        """Run the trials of one property and compare them with the baseline.

        Returns why the property could not be checked, or ``None`` when it was.
        """
        state, base = self.baseline()
        if prop == "rerun":
            self.rerun(state, base, chunked=False)
            if len(self.keys) > 1:
                self.rerun(*self.chunked(), chunked=True)
        elif prop == "chunking":
            _, chunk = self.chunked()
            self.compare(prop, ("day-by-day runs", "range run"), base, chunk)
        elif prop == "input_order":
            shuffled = self.state("input_order", self.clocks[0], shuffled=True)
            self.run(shuffled, self.keys, chunked=False)
            self.compare(prop, ("input in order", "input reversed"), base, self.snapshot(shuffled))
        elif prop == "clock":
            # In a zone where the real date is another one, a date from a clock that no one can
            # freeze in-process (DuckDB's, numpy's) differs even when both trials run today.
            zone = _zone_of_another_date()
            later = self.state("clock", self.clocks[1], timezone=zone)
            self.later_second()
            self.run(later, self.keys, chunked=False)
            labels = (
                f"run at {self.clocks[0]:%Y-%m-%d %H:%M} UTC",
                f"run at {self.clocks[1]:%Y-%m-%d %H:%M} UTC in timezone {zone}",
            )
            self.compare(prop, labels, base, self.snapshot(later))
        elif prop == "hash_seed":
            return self.fresh_process(base)
        else:
            self.crash(state)
        return None

    def rerun(self, state: _State, first: Snapshot, *, chunked: bool) -> None:
        """Run ``state``'s partitions again: the same rows, no action or side effect repeated."""
        deliveries = _outbox_records(state)
        files = _file_states(e.target for e in state.effects if e.kind == "file")
        done = len(state.effects)
        self.later_second()
        self.run(state, self.keys, chunked=chunked)
        labels = ("first range run", "range rerun") if chunked else ("first run", "rerun")
        self.compare("rerun", labels, first, self.snapshot(state))
        _assert_no_new_deliveries(deliveries, _outbox_records(state))
        _assert_no_repeated_side_effects(files, state.effects[done:])

    def start_fresh_process(self) -> None:
        """Start the ``hash_seed`` trial's interpreter, to run while this process runs the others.

        Its runs are the baseline's, in a directory of their own, so nothing here waits for it
        until :meth:`fresh_process` compares.
        """
        references, why_not = _references(self.assets)
        if why_not:
            self._fresh = why_not
            return
        name = "hash_seed"
        directory = self.workdir / name
        directory.mkdir(parents=True, exist_ok=False)
        spec = _FreshProcess(
            references=references,
            keys=list(self.keys),
            clocks=(self.clocks[0], self.clocks[1]),
            workdir=str(self.workdir / f"{name}_process"),
            name=name,
            out=str(directory / "snapshot"),
        )
        try:
            portable = {k: _portable(v) for k, v in self.resources_for(directory).items()}
            payload = pickle.dumps((spec, portable))
            pickle.loads(payload)
        except Exception as exc:
            self._fresh = (
                f"its resources cannot be handed to a fresh process ({type(exc).__name__}:"
                f" {exc}); pass resources whose classes are module-level names"
            )
            return
        spec_path = directory / "spec.pickle"
        spec_path.write_bytes(payload)
        seed = _another_seed()
        env = {**os.environ, "PYTHONHASHSEED": seed}
        # The fresh process finds the same modules as this one (pytest puts the rootdir on it).
        env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
        errors = directory / "stderr.txt"
        with errors.open("w") as stderr:
            child = subprocess.Popen(
                [sys.executable, "-c", _FRESH_PROCESS, str(spec_path)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        self._fresh = _Started(child, seed, Path(spec.out), errors)

    def fresh_process(self, base: Snapshot) -> str | None:
        """Compare the fresh process's runs with the baseline; why it could not run, if so."""
        if self._fresh is None:
            self.start_fresh_process()
        started = self._fresh
        if started is None or isinstance(started, str):
            return started
        code = started.process.wait(timeout=900)
        if code != 0:
            raise RuntimeError(
                f"idem_assets.testing: the runs in a fresh process under"
                f" PYTHONHASHSEED={started.seed} failed (exit {code}) before anything could be"
                " compared:\n" + started.errors.read_text()[-4000:]
            )
        self.runs += len(self.keys)
        here = os.environ.get("PYTHONHASHSEED", "random")
        labels = (
            f"runs in this process (PYTHONHASHSEED={here})",
            f"runs in a fresh process (PYTHONHASHSEED={started.seed})",
        )
        self.compare("hash_seed", labels, base, _read_snapshot(started.out))
        return None

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
            unseen=list(dict.fromkeys(self.unreversed)),
        )


def _reversing(resource: Any, unreversed: list[str]) -> Any:
    """``resource`` with its loads reversed if it is an IO manager; anything else as it is.

    Inputs of a kind it cannot reverse are named in ``unreversed``.
    """
    if isinstance(resource, dg.ConfigurableIOManagerFactory | dg.IOManagerDefinition):
        # Keep the definition's config schema: IO managers read context.resource_config.
        inner = (
            resource
            if isinstance(resource, dg.IOManagerDefinition)
            else resource.get_resource_definition()
        )
        create: Any = inner.resource_fn
        return dg.IOManagerDefinition(
            resource_fn=lambda init: _ReversedLoads(create(init), unreversed),
            config_schema=inner.config_schema,
            required_resource_keys=inner.required_resource_keys,
            description=inner.description,
        )
    if isinstance(resource, dg.IOManager):
        return _ReversedLoads(resource, unreversed)
    return resource


class _ReversedLoads(dg.IOManager):
    """Delegates to an IO manager, but hands every loaded input over in reverse row order.

    Reversal swaps every pair of rows, so any dependence on which of two rows comes first (keep
    the first duplicate, take the first of a group) changes the output.
    """

    def __init__(self, inner: dg.IOManager, unreversed: list[str]) -> None:
        self._inner = inner
        self._unreversed = unreversed

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        """Store exactly as the wrapped IO manager does."""
        self._inner.handle_output(context, obj)

    def load_input(self, context: dg.InputContext) -> Any:
        """Load through the wrapped IO manager, then reverse the rows."""
        value = self._inner.load_input(context)
        reversed_value = reverse_rows(value)
        if reversed_value is value and value is not None:
            reader = context.step_context.step.key if context.step_context else "?"
            self._unreversed.append(
                f"input '{context.name}' of step '{reader}' arrived as {type(value).__name__},"
                " which the input_order trial cannot reverse"
            )
        return reversed_value

    def __getattr__(self, name: str) -> Any:
        # Resources typed as the wrapped IO manager (e.g. a check reading its .database).
        if name in ("_inner", "_unreversed"):
            raise AttributeError(name)
        return getattr(self._inner, name)


def reverse_rows(value: Any) -> Any:
    """The rows of a pandas, Polars or Arrow frame in reverse order; anything else unchanged."""
    if isinstance(value, pd.DataFrame):
        return value.iloc[::-1].reset_index(drop=True)
    if isinstance(value, pa.Table | pa.RecordBatch):
        return value.take(pa.array(range(value.num_rows - 1, -1, -1), pa.int64()))
    # Only a process that imported Polars can hand over a Polars frame.
    pl: Any = sys.modules.get("polars")
    if pl is not None and isinstance(value, pl.DataFrame | pl.LazyFrame):
        return value.reverse()
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
        _refuse_unknown_key(pdef, partition, f"partition={partition!r}")
        return [partition]
    assert partition_range is not None
    first, last = partition_range
    given = f"partition_range=({first!r}, {last!r})"
    for key in (first, last):
        _refuse_unknown_key(pdef, key, given)
    keys: list[str | None] = [*pdef.get_partition_keys_in_range(dg.PartitionKeyRange(first, last))]
    if not keys:
        raise ConfigurationError(
            f"{given} runs backwards: {first!r} comes after {last!r}, so it holds no partition."
            f" Fix: partition_range=({last!r}, {first!r})."
        )
    return keys


def _refuse_unknown_key(pdef: dg.PartitionsDefinition, key: str, given: str) -> None:
    """Refuse a key the assets' partitions definition does not have (spelt otherwise, say)."""
    try:
        window_from_keys(pdef, [key], "the kit")
    except ConfigurationError as exc:
        first = pdef.get_first_partition_key()
        raise ConfigurationError(
            f"{given}: {key!r} is not a partition of the assets' {type(pdef).__name__}. Fix:"
            f" give keys as the definition spells them, e.g. {first!r}."
        ) from exc


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
    """The resources, with each IO manager's tables and outbox ledger moved to ``directory``."""
    moved: dict[str, Any] = {}
    for name, res in resources.items():
        if isinstance(res, IdempotentIOManager):
            fresh = res.relocated(directory)
            if fresh is None:
                raise ConfigurationError(_unmovable(name, res))
            moved[name] = fresh
        elif isinstance(res, Outbox):
            moved[name] = _with_field(res, "ledger", str(directory / Path(res.ledger).name))
        else:
            moved[name] = res
    return moved


def _unmovable(name: str, res: IdempotentIOManager) -> str:
    """Why the kit cannot give each trial a fresh copy of ``res``, and what to pass instead."""
    return (
        f"The rerun-safety kit cannot give each trial a fresh store for resource {name!r}:"
        f" {type(res).__name__} keeps its tables in {res._location()!r}, which is not a"
        " directory the kit can copy, and sharing it would let one trial see another's rows."
        " Nothing was run. Fix: pass resources as a function of the trial's directory that"
        " builds a fresh store for each, e.g. resources=lambda directory: {"
        f"{name!r}: ia.DuckDBOverwriteIOManager(database=str(directory / 'w.duckdb'))}}."
    )


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
        (name, key): table.filter(arrow_expression((box,), types))
        for key, box in cells_for(window, pairs, types, always=True)
    }


def _read_type(stored: _Stored) -> dg.DagsterType:
    """The type the asset declares for its output (IO managers pick a handler by it), else Arrow."""
    output = stored.assets_def.get_output_name_for_asset_key(stored.key)
    declared = stored.assets_def.op.output_dict[output].dagster_type
    return _ARROW if declared.is_any else declared


def _as_table(value: Any) -> pa.Table:
    """A loaded output as Arrow: a pandas, Polars or Arrow frame as its rows, else its repr."""
    if isinstance(value, pd.DataFrame):
        return pa.Table.from_pandas(value, preserve_index=False)
    try:
        return to_arrow(value, "the kit's read-back")
    except TypeError:
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
    """Freeze the wall clock at ``clock`` (ticking on), with time-machine from the extra.

    The clock travels as UTC, and time-machine sets the process's timezone to UTC with it, so a
    trial's own timezone is set inside the travel.
    """
    try:
        import time_machine
    except ImportError as exc:  # pragma: no cover - the dev extra installs it
        raise ImportError(
            "idem_assets.testing runs every trial under a frozen wall clock and needs"
            " time-machine. Fix: pip install 'idem_assets[testing]'."
        ) from exc
    return time_machine.travel(clock.astimezone(UTC), tick=True)


@contextlib.contextmanager
def _in_timezone(zone: str | None) -> Any:
    """Run the block with the process's local timezone set to ``zone`` (unchanged if ``None``)."""
    if zone is None:
        yield
        return
    before = os.environ.get("TZ")
    os.environ["TZ"] = zone
    clock_time.tzset()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = before
        clock_time.tzset()


def _zone_of_another_date() -> str:
    """A timezone whose date right now is not UTC's, the zone every travel sets (one of two).

    The two zones are 26 hours apart, so at any moment at least one has another date.
    """
    now = clock_time.time()
    here = datetime.fromtimestamp(now, UTC).date()
    zones = ("Etc/GMT+12", "Etc/GMT-14")
    return next(z for z in zones if datetime.fromtimestamp(now, ZoneInfo(z)).date() != here)


def _another_seed() -> str:
    """A ``PYTHONHASHSEED`` that is not this process's."""
    here = os.environ.get("PYTHONHASHSEED", "")
    return "2" if here == "1" else "1"


def _columns(table: pa.Table) -> str:
    return ", ".join(f"{f.name} {f.type}" for f in table.schema)


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and the errors it was raised from (Dagster wraps the user's error)."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _policy_text(policy: dg.BackfillPolicy) -> str:
    if policy.max_partitions_per_run is None:
        return "BackfillPolicy.single_run(), so a backfill runs its whole range in one run"
    n = policy.max_partitions_per_run
    if n == 1:
        return "BackfillPolicy.multi_run(1), so Dagster never runs it over a range"
    return f"BackfillPolicy.multi_run({n}), so a backfill runs up to {n} partitions per run"


def _file_states(paths: Iterable[str]) -> dict[str, tuple[int, str] | None]:
    """Each file's size and content hash, ``None`` for a file that does not exist."""
    found: dict[str, tuple[int, str] | None] = {}
    for path in dict.fromkeys(paths):
        try:
            data = Path(path).read_bytes()
        except OSError:
            found[path] = None
            continue
        found[path] = (len(data), hashlib.sha256(data).hexdigest())
    return found


def _assert_no_repeated_side_effects(
    files: Mapping[str, tuple[int, str] | None], rerun: Sequence[SideEffect]
) -> None:
    """Refuse a rerun that changed a file or sent a writing request outside the IO managers."""
    requests = [e for e in rerun if e.kind == "request"]
    if requests:
        first = requests[0]
        raise RerunSafetyError(
            "rerun",
            first.asset,
            first.partition,
            f"the rerun sent {len(requests)} request(s) again, outside the IO managers and the"
            f" outbox, e.g. {first.target}; a rerun with the same data must send nothing.",
            cause=_SIDE_EFFECT_CAUSE,
        )
    written = [e for e in rerun if e.kind == "file"]
    after = _file_states(e.target for e in written)
    for effect in written:
        old, new = files.get(effect.target), after[effect.target]
        if old == new or new is None:
            continue
        change = (
            f"created it ({new[0]} bytes)"
            if old is None
            else f"changed it from {old[0]} to {new[0]} bytes"
        )
        raise RerunSafetyError(
            "rerun",
            effect.asset,
            effect.partition,
            f"the rerun wrote file {effect.target} outside the IO managers and the outbox, and"
            f" {change}; a rerun with the same data must leave it as it was.",
            cause=_SIDE_EFFECT_CAUSE,
        )


@dataclass(frozen=True)
class _Started:
    """The hash_seed trial's interpreter, running: its seed, snapshot folder and error output."""

    process: subprocess.Popen[bytes]
    seed: str
    out: Path
    errors: Path


@dataclass(frozen=True)
class _FreshProcess:
    """What the fresh process runs: the assets by name, the partitions, the clocks."""

    references: list[tuple[str, str, int | None]]
    keys: list[str | None]
    clocks: tuple[datetime, datetime]
    workdir: str
    name: str
    out: str


def _references(assets: Sequence[Any]) -> tuple[list[tuple[str, str, int | None]], str | None]:
    """Where a fresh process imports each asset: ``(module, name, index in a list or None)``."""
    references = []
    for asset in assets:
        found = _reference(asset)
        if found is None:
            name = getattr(asset, "key", None) or getattr(asset, "name", None) or asset
            label = name.to_user_string() if isinstance(name, dg.AssetKey) else str(name)
            return [], (
                f"'{label}' is not a module-level name, so a fresh process cannot import it;"
                " define it at module level (or in a module-level list) to check it"
            )
        references.append(found)
    return references, None


def _reference(asset: Any) -> tuple[str, str, int | None] | None:
    """The module-level name (or list entry) that holds ``asset``, outside ``__main__``."""
    compute = getattr(getattr(asset, "op", None), "compute_fn", None)
    home = getattr(getattr(compute, "decorated_fn", compute), "__module__", None)
    names = [home] if home in sys.modules else []
    for name in [*names, *list(sys.modules)]:
        module = sys.modules.get(name)
        if module is None or name == "__main__":
            continue
        try:
            attributes = list(vars(module).items())
        except TypeError:
            continue
        for attribute, value in attributes:
            if value is asset:
                return name, attribute, None
            # Exactly a list or tuple: Dagster's records are NamedTuples that refuse iteration.
            if type(value) in (list, tuple):
                for index, item in enumerate(value):
                    if item is asset:
                        return name, attribute, index
    return None


@dataclass(frozen=True)
class _Resource:
    """A configurable resource by class and config: Dagster's resources do not unpickle."""

    module: str
    qualname: str
    config: dict[str, Any]


def _portable(value: Any) -> Any:
    """``value`` with every configurable resource in it as a :class:`_Resource`."""
    config = _config_of(value)
    if config is not None:
        cls = type(value)
        if "<locals>" in cls.__qualname__:
            raise TypeError(f"{cls.__qualname__} is defined inside a function")
        return _Resource(
            cls.__module__, cls.__qualname__, {k: _portable(v) for k, v in config.items()}
        )
    if isinstance(value, dict):
        return {k: _portable(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_portable(v) for v in value)
    return value


def _rebuilt(value: Any) -> Any:
    """The resource :func:`_portable` described, built again."""
    if isinstance(value, _Resource):
        cls: Any = importlib.import_module(value.module)
        for part in value.qualname.split("."):
            cls = getattr(cls, part)
        return cls(**{k: _rebuilt(v) for k, v in value.config.items()})
    if isinstance(value, dict):
        return {k: _rebuilt(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_rebuilt(v) for v in value)
    return value


def _fresh_process_main(spec_path: str) -> int:
    """In the fresh process: run the baseline's partitions, write each snapshot table."""
    spec, portable = pickle.loads(Path(spec_path).read_bytes())
    resources = {k: _rebuilt(v) for k, v in portable.items()}
    assets = []
    for module, attribute, index in spec.references:
        value = getattr(importlib.import_module(module), attribute)
        assets.append(value if index is None else value[index])
    with _Kit(
        assets, lambda _: resources, Path(spec.workdir), None, None, spec.clocks, spec.keys
    ) as kit:
        state = kit.state(spec.name, kit.clocks[0])
        kit.run(state, kit.keys, chunked=False)
        snapshot = kit.snapshot(state)
    out = Path(spec.out)
    out.mkdir(parents=True)
    manifest = []
    for i, ((asset, key), table) in enumerate(snapshot.items()):
        with pa.OSFile(str(out / f"{i}.arrow"), "wb") as sink:
            with pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
        manifest.append([asset, key, f"{i}.arrow"])
    (out / "manifest.json").write_text(json.dumps(manifest))
    return 0


def _read_snapshot(out: Path) -> Snapshot:
    """The snapshot a fresh process wrote."""
    snapshot: Snapshot = {}
    for asset, key, name in json.loads((out / "manifest.json").read_text()):
        with pa.memory_map(str(out / name)) as source:
            snapshot[(asset, key)] = pa.ipc.open_file(source).read_all()
    return snapshot
