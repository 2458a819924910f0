"""Write-audit-publish on a branch: the checks read the branch, main moves only when they pass."""

import pyarrow as pa
import pytest

import idem_assets as ia
from idem_assets.lib.backends.iceberg.audit_branch import BRANCH_PREFIX
from idem_assets.lib.backends.iceberg.backend import IcebergBackend
from idem_assets.lib.backends.iceberg.catalog import IcebergLocation
from tests.conformance.test_replace_contract import ALL_DAYS, EVENTS, events
from tests.helpers import NOW, settings, window
from tests.iceberg.conftest import expected, fill, publish, stored

#: An upsert: the window keeps its rows whose key the batch does not hold.
UPSERT = {**EVENTS, "delete_missing": False}


def audited(
    location: IcebergLocation, batch: pa.Table, mode: str, checks: list[ia.Check], **kwargs: object
) -> ia.PublishResult:
    with IcebergBackend(location, audit=checks) as backend:
        return ia.publish(
            backend,
            batch,
            settings(mode, UPSERT if mode == "merge" else EVENTS, table="events"),
            window(ALL_DAYS[1]),
            now=NOW,
            **kwargs,  # type: ignore[arg-type]
        )


def table_of(location: IcebergLocation):
    with IcebergBackend(location) as backend:
        return backend.catalog.load_table(("main", "events"))


def two_rows(version: int) -> pa.Table:
    """One update of an existing event of day 2 and one new event."""
    day = events(ALL_DAYS[1], version=version)
    return pa.concat_tables(
        [day.slice(0, 1), day.slice(1, 1).set_column(0, "event_id", pa.array([7], pa.int64()))]
    )


def test_the_checks_read_the_window_as_the_branch_holds_it(location: IcebergLocation) -> None:
    fill(location, "merge")
    history = [h.snapshot_id for h in table_of(location).history()]
    # The batch has 2 rows; the window after the merge has 1,001: the check sees the branch.
    audited(location, two_rows(5), "merge", [ia.row_count(min_rows=1001)])
    after = table_of(location)
    assert [h.snapshot_id for h in after.history()][:-1] == history
    assert len(after.history()) == len(history) + 1
    assert list(after.refs()) == ["main"]
    assert len([r for r in stored(location) if r[1].date().isoformat() == ALL_DAYS[1]]) == 1001


def test_a_failing_check_leaves_main_and_its_history_untouched(location: IcebergLocation) -> None:
    fill(location)
    before, main = stored(location), table_of(location).current_snapshot().snapshot_id
    history = [h.snapshot_id for h in table_of(location).history()]
    with pytest.raises(ia.BlockingCheckError) as refused:
        audited(
            location, events(ALL_DAYS[1], version=60), "overwrite", [ia.between("amount", 0, 100)]
        )
    text = str(refused.value)
    assert "amount_between_0_and_100" in text and "main was not moved" in text
    after = table_of(location)
    assert stored(location) == before
    assert after.current_snapshot().snapshot_id == main
    assert [h.snapshot_id for h in after.history()] == history
    assert not [r for r in after.refs() if r.startswith(BRANCH_PREFIX)]
    # The audited snapshot was written (only time travel by id reaches it) and never published.
    assert len(after.snapshots()) == len(history) + 1


@pytest.mark.parametrize("stage", ["branched", "audited"])
def test_a_writer_that_moves_main_meanwhile_makes_the_publish_start_over(
    location: IcebergLocation, stage: str
) -> None:
    """Once the branch exists, or once the audit passed, another writer commits day 3 to main."""
    fill(location)
    moved: list[str] = []

    def other_day_writer(reached: str) -> None:
        if reached == stage and not moved:
            moved.append(reached)
            publish(location, events(ALL_DAYS[2], version=3), "overwrite", ALL_DAYS[2])

    audited(
        location,
        events(ALL_DAYS[1], version=2),
        "overwrite",
        [ia.row_count(min_rows=1)],
        on_stage=other_day_writer,
    )
    assert moved == [stage]
    # Neither writer's day was lost: the audited publish started over on the new main.
    assert stored(location) == expected(
        events(ALL_DAYS[0]), events(ALL_DAYS[1], version=2), events(ALL_DAYS[2], version=3)
    )
    assert not [r for r in table_of(location).refs() if r.startswith(BRANCH_PREFIX)]


def test_the_first_audited_publish_creates_the_table_without_unaudited_rows(
    location: IcebergLocation,
) -> None:
    with pytest.raises(ia.BlockingCheckError):
        audited(location, events(ALL_DAYS[1]), "overwrite", [ia.row_count(min_rows=5000)])
    assert stored(location) == []
    audited(location, events(ALL_DAYS[1]), "overwrite", [ia.row_count(min_rows=1000)])
    assert stored(location) == expected(events(ALL_DAYS[1]))
