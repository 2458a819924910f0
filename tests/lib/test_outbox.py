"""The outbox: an action runs once per content, a correction runs again, a crash repeats its key.

The receiver is a real HTTP server on 127.0.0.1 that records every request it gets, so a
repeated action shows as a second request, whatever the ledger says.
"""

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import pyarrow as pa
import pytest
from pydantic import Field

import idem_assets as ia
from tests.helpers import Receiver, http_receiver, range_tags

from .outbox_worker import ACTION, notify, resources, summary

REPO = Path(__file__).resolve().parents[2]
DAY = "2026-01-02"
RANGE_TAGS = range_tags("2026-01-01", "2026-01-03")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """An HTTP endpoint on 127.0.0.1 that records each POST."""
    with http_receiver() as state:
        yield state


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    """One Dagster instance for the test's runs, so their logs can be read."""
    with dg.instance_for_test() as inst:
        yield inst


@dataclass
class Runner:
    """Materialises ``notify`` against one ledger and receiver."""

    ledger: Path
    receiver: Receiver
    instance: dg.DagsterInstance

    def run(self, version: int = 1, **kwargs: Any) -> dg.ExecuteInProcessResult:
        if "tags" not in kwargs:
            kwargs.setdefault("partition_key", DAY)
        return dg.materialize(
            [notify],
            resources=resources(str(self.ledger), self.receiver.url, version),
            instance=self.instance,
            **kwargs,
        )

    def outcomes(self, result: dg.ExecuteInProcessResult) -> str:
        # A range run records one materialization per partition, with the run's metadata.
        mat = result.asset_materializations_for_node("notify")[0]
        return mat.metadata["outcomes"].value  # type: ignore[return-value]

    def outbox_log(self, result: dg.ExecuteInProcessResult) -> list[str]:
        return [
            e.user_message
            for e in self.instance.all_logs(result.run_id)
            if e.user_message.startswith("Outbox:")
        ]

    def records(self) -> list[ia.DeliveryRecord]:
        return ia.Outbox(ledger=str(self.ledger)).records()


@pytest.fixture
def runner(tmp_path: Path, receiver: Receiver, instance: dg.DagsterInstance) -> Runner:
    return Runner(tmp_path / "outbox.sqlite", receiver, instance)


def key(day: str, version: int, revision: int) -> str:
    return ia.idempotency_key(
        "notify", day, ACTION, revision, ia.content_fingerprint(summary(day, version))
    )


def test_a_rerun_with_the_same_content_skips_the_action_and_says_so(runner: Runner) -> None:
    first = runner.run()
    second = runner.run()

    assert runner.receiver.keys() == [key(DAY, 1, 1)]
    assert runner.receiver.requests[0]["body"] == {
        "rows": [
            {"day": DAY, "metric": "trips", "value": 100},
            {"day": DAY, "metric": "revenue", "value": 1},
        ]
    }
    assert (runner.outcomes(first), runner.outcomes(second)) == ("performed", "skipped")
    assert runner.outbox_log(second) == [
        f"Outbox: skipped post_summary of asset 'notify', partition {DAY}: revision 1 (key"
        f" {key(DAY, 1, 1)}) already delivered this content (fingerprint"
        f" {ia.content_fingerprint(summary(DAY, 1))}); a rerun with the same content does not"
        " repeat it."
    ]
    [record] = runner.records()
    assert (record.status, record.attempts, record.delivery.revision) == ("delivered", 1, 1)


def test_a_correction_is_sent_again_as_a_revision_that_names_the_one_it_supersedes(
    runner: Runner,
) -> None:
    runner.run(version=1)
    corrected = runner.run(version=2)
    runner.run(version=2)
    # Back to the first content: the receiver holds version 2, so it must hear of it again.
    reverted = runner.run(version=1)

    assert runner.receiver.keys() == [key(DAY, 1, 1), key(DAY, 2, 2), key(DAY, 1, 3)]
    assert [r["supersedes"] for r in runner.receiver.requests] == [
        None,
        key(DAY, 1, 1),
        key(DAY, 2, 2),
    ]
    assert (runner.outcomes(corrected), runner.outcomes(reverted)) == ("performed", "performed")
    assert [r.delivery.revision for r in runner.records()] == [1, 2, 3]
    assert runner.outbox_log(corrected)[-1].startswith(
        f"Outbox: corrected post_summary of asset 'notify', partition {DAY}: revision 2"
    )


def test_a_range_run_delivers_each_day_once_and_a_backfill_over_them_sends_nothing(
    runner: Runner,
) -> None:
    runner.run(partition_key="2026-01-02")
    backfill = runner.run(tags=RANGE_TAGS)
    runner.run(tags=RANGE_TAGS)

    assert runner.receiver.keys() == [
        key("2026-01-02", 1, 1),
        key("2026-01-01", 1, 1),
        key("2026-01-03", 1, 1),
    ]
    assert runner.outcomes(backfill) == "performed, skipped, performed"


def test_a_failed_action_is_not_recorded_and_the_next_run_retries_it_with_the_same_key(
    runner: Runner,
) -> None:
    runner.receiver.fail_next = 1
    failed = runner.run(raise_on_error=False)
    assert not failed.success
    [failure] = [e for e in failed.all_events if e.event_type_value == "STEP_FAILURE"]
    error = failure.event_specific_data.error  # type: ignore[union-attr]
    while error.cause is not None and "HTTPError" not in error.cls_name:
        error = error.cause
    assert error.cls_name == "HTTPError"
    assert f"stays pending; the next run performs it again with the same key {key(DAY, 1, 1)}" in (
        error.to_string()
    )
    [pending] = runner.records()
    assert (pending.status, pending.attempts) == ("pending", 1)

    retried = runner.run()
    assert runner.outcomes(retried) == "retried"
    assert runner.receiver.keys() == [key(DAY, 1, 1), key(DAY, 1, 1)]
    assert "never recorded as delivered" in runner.outbox_log(retried)[0]
    [record] = runner.records()
    assert (record.status, record.attempts) == ("delivered", 2)


def killed_at(runner: Runner, stage: str) -> None:
    """Deliver revision 1 of DAY in a child process that SIGKILLs itself at ``stage``."""
    worker = [sys.executable, "-m", "tests.lib.outbox_worker", str(runner.ledger)]
    child = subprocess.run(
        [*worker, runner.receiver.url, "1", DAY, stage],
        cwd=REPO,
        capture_output=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-2000:]


@pytest.mark.slow
def test_a_process_killed_between_the_action_and_the_ledger_write_repeats_the_same_key(
    runner: Runner,
) -> None:
    killed_at(runner, "performed")
    # The receiver got it; the ledger only knows it was started.
    assert runner.receiver.keys() == [key(DAY, 1, 1)]
    [pending] = runner.records()
    assert (pending.status, pending.attempts) == ("pending", 1)

    retried = runner.run()
    again = runner.run()

    # At least once: the repeat carries the same key, so a deduplicating receiver keeps one.
    assert runner.receiver.keys() == [key(DAY, 1, 1), key(DAY, 1, 1)]
    assert list(runner.receiver.deduplicated()) == [key(DAY, 1, 1)]
    assert (runner.outcomes(retried), runner.outcomes(again)) == ("retried", "skipped")
    [record] = runner.records()
    assert (record.status, record.attempts) == ("delivered", 2)


@pytest.mark.slow
def test_a_process_killed_before_the_action_sends_it_once_on_the_next_run(
    runner: Runner,
) -> None:
    killed_at(runner, "claimed")
    assert runner.receiver.keys() == []

    runner.run()
    assert runner.receiver.keys() == [key(DAY, 1, 1)]


def test_a_range_run_must_name_the_partition_of_each_action(tmp_path: Path) -> None:
    @dg.asset(partitions_def=notify.partitions_def)
    def lazy(context: dg.AssetExecutionContext, outbox: ia.Outbox) -> None:
        outbox.deliver(context, "email", "1:0", lambda d: None)

    with pytest.raises(ia.ConfigurationError, match="needs the partition it belongs to"):
        dg.materialize(
            [lazy],
            resources={"outbox": ia.Outbox(ledger=str(tmp_path / "o.sqlite"))},
            tags=RANGE_TAGS,
        )
    assert ia.Outbox(ledger=str(tmp_path / "o.sqlite")).records() == []


def test_an_unpartitioned_asset_delivers_once_per_content(
    tmp_path: Path, receiver: Receiver
) -> None:
    from .outbox_worker import Webhook

    @dg.asset
    def weekly_digest(
        context: dg.AssetExecutionContext, outbox: ia.Outbox, webhook: Webhook
    ) -> None:
        table = summary("all", 7)
        outbox.deliver(context, "digest", table, lambda d: webhook.post(d, {"n": table.num_rows}))

    res = {
        "outbox": ia.Outbox(ledger=str(tmp_path / "o.sqlite")),
        "webhook": Webhook(url=receiver.url),
    }
    for _ in range(2):
        dg.materialize([weekly_digest], resources=res)
    [record] = ia.Outbox(ledger=str(tmp_path / "o.sqlite")).records()
    assert (record.delivery.partition, record.status) == ("", "delivered")
    assert receiver.keys() == [record.delivery.key]


# What counts as the same content


def delivered(outbox: ia.Outbox, *contents: Any) -> list[ia.DeliveryResult]:
    """Deliver each content in turn, one run each, for DAY of an asset ``report``."""
    results: list[ia.DeliveryResult] = []

    @dg.asset(partitions_def=notify.partitions_def)
    def report(context: dg.AssetExecutionContext) -> None:
        results.append(outbox.deliver(context, "email", contents[len(results)], lambda d: None))

    for _ in contents:
        dg.materialize([report], partition_key=DAY)
    return results


def test_a_renamed_column_is_new_content_and_goes_out_as_a_correction(tmp_path: Path) -> None:
    revenue = pa.table({"day": [DAY], "revenue": [120.5]})
    refunds = pa.table({"day": [DAY], "refunds": [120.5]})
    assert ia.content_fingerprint(revenue) != ia.content_fingerprint(refunds)

    first, renamed = delivered(ia.Outbox(ledger=str(tmp_path / "o.sqlite")), revenue, refunds)
    assert (first.outcome, renamed.outcome) == ("performed", "performed")
    assert renamed.delivery.revision == 2
    assert renamed.delivery.supersedes == first.delivery.key


@pytest.mark.parametrize(
    ("before", "after"),
    [
        # The same stored numbers: days since 1970, or a date.
        (pa.array([20455], pa.int32()), pa.array([20455], pa.date32())),
        # The same microseconds: a wall-clock time, or an instant.
        (pa.array([1], pa.timestamp("us")), pa.array([1], pa.timestamp("us", tz="UTC"))),
    ],
    ids=["integer_then_date", "wall_clock_then_instant"],
)
def test_a_column_whose_values_mean_something_else_is_new_content(
    before: pa.Array, after: pa.Array
) -> None:
    assert ia.content_fingerprint(pa.table({"v": before})) != ia.content_fingerprint(
        pa.table({"v": after})
    )


def test_row_order_column_order_and_width_of_a_column_are_the_same_content() -> None:
    table = pa.table({"zone": ["a", "b"], "trips": pa.array([3, 4], pa.int64())})
    same = pa.table({"trips": pa.array([4, 3], pa.int32()), "zone": ["b", "a"]})
    assert ia.content_fingerprint(table) == ia.content_fingerprint(same)


def test_text_bytes_frames_and_json_are_content_and_a_large_payload_is_kept_as_a_hash(
    tmp_path: Path,
) -> None:
    pl = pytest.importorskip("polars")
    body = "x" * 5_000_000
    table = pa.table({"zone": ["a", "b"], "fare": pa.array([1.5, 2.0], pa.float16())})
    contents = [
        body,
        body,
        table.to_pandas(),
        pa.table({"zone": ["a", "b"], "fare": pa.array([1.5, 2.0], pa.float32())}),
        pl.from_arrow(table.cast(pa.schema([("zone", pa.string()), ("fare", pa.float32())]))),
        {"subject": "Revenue", "rows": [{"day": date(2026, 1, 2), "n": 1}]},
        {"rows": [{"n": 1, "day": date(2026, 1, 2)}], "subject": "Revenue"},
        b"\x00\x01",
    ]
    ledger = tmp_path / "o.sqlite"
    outcomes = [r.outcome for r in delivered(ia.Outbox(ledger=str(ledger)), *contents)]
    # The text once; the float16 table, and the same values as float32 from pandas or Polars,
    # once; the dict once whatever its key order; the bytes once.
    assert outcomes == [
        "performed",
        "skipped",
        "performed",
        "skipped",
        "skipped",
        "performed",
        "skipped",
        "performed",
    ]
    records = ia.Outbox(ledger=str(ledger)).records()
    assert [len(r.delivery.fingerprint) for r in records] == [37, 34, 37, 38]
    assert ledger.stat().st_size < 100_000


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"to": {"b@x", "a@x"}}, "Fix: pass sorted(the_set) instead"),
        (object(), "got object"),
        ({"at": object()}, "holds a object, which has no JSON form"),
    ],
    ids=["set", "object", "object_in_a_dict"],
)
def test_content_with_no_stable_fingerprint_is_refused_before_anything_is_sent(
    tmp_path: Path, content: Any, message: str
) -> None:
    sent: list[str] = []

    @dg.asset(partitions_def=notify.partitions_def)
    def report(context: dg.AssetExecutionContext) -> None:
        ia.Outbox(ledger=str(tmp_path / "o.sqlite")).deliver(
            context, "email", content, lambda d: sent.append(d.key)
        )

    with pytest.raises(ia.ConfigurationError, match=re.escape(message)):
        dg.materialize([report], partition_key=DAY)
    assert sent == []


def test_a_ledger_written_before_column_names_counted_still_skips_its_content(
    tmp_path: Path, runner: Runner
) -> None:
    """Fingerprints of earlier versions (values only) are recognised, so nothing is resent."""
    table = summary(DAY, 1)
    names = sorted(table.column_names)
    con = duckdb.connect()
    con.register("content", table.select(names).rename_columns(["c0", "c1", "c2"]))
    count, total = con.execute(
        "SELECT count(*), sum(hash(c0, c1, c2)::HUGEINT) FROM content"
    ).fetchall()[0]
    values_only = f"{count}:{int(total) % (1 << 128):032x}"
    old_key = ia.idempotency_key("notify", DAY, ACTION, 1, values_only)
    with sqlite3.connect(runner.ledger) as ledger:
        ledger.execute(
            "CREATE TABLE outbox_deliveries (asset TEXT NOT NULL, partition_key TEXT NOT NULL,"
            " action TEXT NOT NULL, revision INTEGER NOT NULL, fingerprint TEXT NOT NULL,"
            " idempotency_key TEXT NOT NULL UNIQUE, supersedes TEXT, status TEXT NOT NULL"
            " CHECK (status IN ('pending', 'delivered')), attempts INTEGER NOT NULL, run_id"
            " TEXT, claimed_at TEXT NOT NULL, delivered_at TEXT,"
            " PRIMARY KEY (asset, partition_key, action, revision))"
        )
        ledger.execute(
            "INSERT INTO outbox_deliveries VALUES"
            " ('notify', ?, ?, 1, ?, ?, NULL, 'delivered', 1, 'r', '2026-01-03', '2026-01-03')",
            [DAY, ACTION, values_only, old_key],
        )
    assert runner.outcomes(runner.run()) == "skipped"
    assert runner.receiver.keys() == []


# Which partition a delivery belongs to


class Named(dg.ConfigurableResource):
    """The partition the asset names for its delivery."""

    partition: str = Field(description="As the user spelt it.")


def test_a_delivery_must_name_a_partition_of_its_run_spelt_any_way_dagster_reads_it(
    runner: Runner,
) -> None:
    from .outbox_worker import Webhook

    @dg.asset(name="notify", partitions_def=notify.partitions_def)
    def named(
        context: dg.AssetExecutionContext, outbox: ia.Outbox, webhook: Webhook, named: Named
    ) -> None:
        table = summary(DAY, 1)
        outbox.deliver(
            context,
            ACTION,
            table,
            lambda d: webhook.post(d, {"n": table.num_rows}),
            partition=named.partition,
        )

    def run(partition: str) -> None:
        dg.materialize(
            [named],
            resources={
                **resources(str(runner.ledger), runner.receiver.url),
                "named": Named(partition=partition),
            },
            partition_key=DAY,
            instance=runner.instance,
        )

    runner.run()
    with pytest.raises(ia.ConfigurationError) as caught:
        run("2026-01-09")
    assert str(caught.value) == (
        "Outbox: asset 'notify' delivers 'post_summary' for partition '2026-01-09', which this"
        " run does not materialise (it runs 2026-01-02). Its rerun would not see this"
        " delivery, and a run of that partition would send the same content again under its"
        " own key. Nothing was sent. Fix: deliver from the run of '2026-01-09', or pass one of"
        " this run's partitions, e.g. partition=context.partition_keys[0] ('2026-01-02')."
    )
    # Dagster reads 2026-1-2 as the run's own day: the run's delivery is found, not repeated.
    run("2026-1-2")
    assert runner.receiver.keys() == [key(DAY, 1, 1)]
    assert [r.delivery.partition for r in runner.records()] == [DAY]


def test_an_unpartitioned_asset_names_its_deliveries_by_action_not_partition(
    tmp_path: Path,
) -> None:
    @dg.asset
    def digest(context: dg.AssetExecutionContext) -> None:
        ia.Outbox(ledger=str(tmp_path / "o.sqlite")).deliver(
            context, "email", "body", lambda d: None, partition="north"
        )

    with pytest.raises(ia.ConfigurationError, match=r"outbox.deliver\(context, 'email_north'"):
        dg.materialize([digest])


# The ledger itself: gone, corrupt, locked, read-only


def run_printed_fix(message: str) -> None:
    """Run the shell command after 'Fix: ... knowingly (...): ' exactly as the message prints it."""
    command = message.rsplit("): ", 1)[1]
    subprocess.run(["bash", "-c", command], check=True)


def test_a_ledger_that_vanished_is_refused_until_restored_or_started_again_knowingly(
    runner: Runner,
) -> None:
    runner.run()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{runner.ledger}{suffix}").unlink(missing_ok=True)

    with pytest.raises(ia.OutboxError) as caught:
        runner.run()
    message = str(caught.value)
    assert message.startswith(
        f"Refused to deliver post_summary of asset 'notify', partition {DAY}: its ledger"
        f" {runner.ledger} is gone, though this Dagster instance saw it in use (first on"
    )
    assert message.endswith(f"mkdir -p {runner.ledger.parent} && touch {runner.ledger}")
    assert runner.receiver.keys() == [key(DAY, 1, 1)]

    run_printed_fix(message)
    # Started again: the unchanged content goes out as revision 1 under the key it had.
    assert runner.outcomes(runner.run()) == "performed"
    assert runner.outcomes(runner.run()) == "skipped"
    assert runner.receiver.keys() == [key(DAY, 1, 1), key(DAY, 1, 1)]


def test_a_corrupt_ledger_is_refused_with_the_way_to_start_again(runner: Runner) -> None:
    runner.ledger.write_bytes(b"not a database, " * 512)
    with pytest.raises(ia.OutboxError) as caught:
        runner.run()
    message = str(caught.value)
    assert f"the ledger {runner.ledger} is not a readable SQLite database" in message
    assert "Nothing was sent." in message
    assert runner.receiver.keys() == []
    run_printed_fix(message)
    assert runner.ledger.with_name("outbox.sqlite.corrupt").read_bytes().startswith(b"not a")
    runner.run()
    assert runner.receiver.keys() == [key(DAY, 1, 1)]


@pytest.mark.slow
def test_a_ledger_locked_by_another_process_is_refused_after_the_lock_timeout(
    runner: Runner,
) -> None:
    runner.run()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('BEGIN IMMEDIATE')\n"
            "print('locked', flush=True)\n"
            "time.sleep(120)\n",
            str(runner.ledger),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        started = time.monotonic()
        with pytest.raises(ia.OutboxError) as caught:
            dg.materialize(
                [notify],
                resources={
                    **resources(str(runner.ledger), runner.receiver.url, version=2),
                    "outbox": ia.Outbox(ledger=str(runner.ledger), lock_timeout=0.5),
                },
                partition_key=DAY,
                instance=runner.instance,
            )
        assert time.monotonic() - started < 20
    finally:
        holder.kill()
        holder.wait()
    assert str(caught.value).startswith(
        f"Refused to deliver post_summary of asset 'notify', partition {DAY}: the ledger"
        f" {runner.ledger} stayed locked by another connection for 0.5 s"
    )
    assert runner.receiver.keys() == [key(DAY, 1, 1)]
    # Once the holder is gone, the correction goes out.
    runner.run(version=2)
    assert runner.receiver.keys() == [key(DAY, 1, 1), key(DAY, 2, 2)]


def make_read_only(path: Path) -> None:
    """Make ``path`` unwritable, even for root (which ignores the permission bits)."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(path)], check=True)
    else:
        path.chmod(0o444)


def test_a_read_only_ledger_is_refused_with_the_command_that_makes_it_writable(
    runner: Runner,
) -> None:
    runner.run()
    # A closed ledger has no -wal file; every write then goes to the file itself.
    assert not Path(f"{runner.ledger}-wal").exists()
    make_read_only(runner.ledger)
    try:
        with pytest.raises(ia.OutboxError) as caught:
            runner.run(version=2)
        message = str(caught.value)
        assert message.startswith(
            f"Refused to deliver post_summary of asset 'notify', partition {DAY}: the ledger"
            f" {runner.ledger} cannot be written"
        )
        assert runner.receiver.keys() == [key(DAY, 1, 1)]
        subprocess.run(["bash", "-c", message.rsplit("Fix: ", 1)[1]], check=True)
    finally:
        subprocess.run(["chattr", "-i", str(runner.ledger)], capture_output=True)
        runner.ledger.chmod(0o644)
    runner.run(version=2)
    assert runner.receiver.keys() == [key(DAY, 1, 1), key(DAY, 2, 2)]
