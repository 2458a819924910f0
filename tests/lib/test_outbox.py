"""The outbox: an action runs once per content, a correction runs again, a crash repeats its key.

The receiver is a real HTTP server on 127.0.0.1 that records every request it gets, so a
repeated action shows as a second request, whatever the ledger says.
"""

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

import idem_assets as ia
from tests.helpers import range_tags

from .outbox_worker import ACTION, notify, resources, summary

REPO = Path(__file__).resolve().parents[2]
DAY = "2026-01-02"
RANGE_TAGS = range_tags("2026-01-01", "2026-01-03")


@dataclass
class Receiver:
    """Every request the endpoint got; it answers 500 to the next ``fail_next`` of them."""

    url: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    fail_next: int = 0

    def keys(self) -> list[str]:
        """The Idempotency-Key of every request, in arrival order."""
        return [r["key"] for r in self.requests]

    def deduplicated(self) -> dict[str, Any]:
        """What a receiver that drops repeated keys keeps: one body per key."""
        return {r["key"]: r["body"] for r in self.requests}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """An HTTP endpoint on 127.0.0.1 that records each POST."""
    state = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.requests.append(
                {
                    "key": self.headers["Idempotency-Key"],
                    "supersedes": self.headers.get("Supersedes"),
                    "body": body,
                }
            )
            failing = state.fail_next > 0
            state.fail_next -= failing
            self.send_response(500 if failing else 200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_port}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


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
