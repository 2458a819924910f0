"""The daily revenue report is exported once per content: across reruns, backfills, corrections.

The export folder is the witness: every performed export writes a file, and a file that is not
rewritten keeps its inode and modification time.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import idem_assets as ia
from idem_assets import landing
from idem_assets.defs.daily_revenue_report import EXPORT_ACTION, report_csv, report_table

from .support import REPO, Pipeline, d, metadata

REPORT = "revenue_report"
FIRST, DAY, LAST = "2026-01-01", "2026-01-02", "2026-01-03"
DAYS = (FIRST, DAY, LAST)
ASSET = "daily_revenue_report"


def export_dir(pipeline: Pipeline) -> Path:
    return pipeline.database.parent / "exports" / "daily_revenue"


def exports(pipeline: Pipeline) -> dict[str, tuple[int, int]]:
    """Every exported file (relative path) with its inode and modification time."""
    root = export_dir(pipeline)
    return {
        str(p.relative_to(root)): (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def outbox(pipeline: Pipeline) -> ia.Outbox:
    return ia.Outbox(ledger=str(pipeline.database.parent / "outbox.sqlite"))


def expected_file(pipeline: Pipeline, day: str, revision: int) -> tuple[str, str]:
    """The relative path and CSV text the export must hold for ``day``, from the warehouse."""
    import duckdb

    with duckdb.connect(str(pipeline.database), read_only=True) as con:
        revenue = con.sql("SELECT * FROM daily_zone_revenue").to_arrow_table()
    report = report_table(revenue, day)
    key = ia.idempotency_key(ASSET, day, EXPORT_ACTION, revision, ia.content_fingerprint(report))
    return f"{day}/daily_revenue_{day}_r{revision}_{key}.csv", report_csv(report)


def outbox_log(pipeline: Pipeline, result: object) -> list[str]:
    return [line for line in pipeline.logs(result) if line.startswith("Outbox:")]  # type: ignore[arg-type]


def test_each_day_is_exported_once_across_reruns_and_a_backfill(pipeline: Pipeline) -> None:
    pipeline.generate(FIRST, LAST)
    pipeline.run_ok(FIRST, LAST)
    for day in DAYS:
        pipeline.run_ok(day, job_name=REPORT)
    files = exports(pipeline)
    expected = [expected_file(pipeline, day, 1) for day in DAYS]
    assert sorted(files) == [path for path, _ in expected]
    for path, text in expected:
        assert (export_dir(pipeline) / path).read_text() == text
    assert text.splitlines()[0] == "pickup_zone,trips,passengers,fares,tips,revenue"

    rerun = pipeline.run_ok(DAY, job_name=REPORT)
    backfill = pipeline.run_ok(FIRST, LAST, job_name=REPORT)

    assert exports(pipeline) == files
    assert metadata(rerun, ASSET)["exports_skipped"] == 1
    assert metadata(backfill, ASSET)["exports_skipped"] == 3
    assert metadata(backfill, ASSET)["exports_performed"] == 0
    log = outbox_log(pipeline, backfill)
    assert len(log) == 3
    assert log[1].startswith(
        f"Outbox: skipped export_csv of asset '{ASSET}', partition {DAY}: revision 1"
    )
    assert [r.status for r in outbox(pipeline).records()] == ["delivered"] * 3


def test_a_backfill_exports_each_day_once_and_a_corrected_day_once_more(
    pipeline: Pipeline,
) -> None:
    pipeline.generate(FIRST, LAST)
    pipeline.run_ok(FIRST, LAST)
    backfill = pipeline.run_ok(FIRST, LAST, job_name=REPORT)
    assert metadata(backfill, ASSET)["exports_performed"] == 3
    before = exports(pipeline)
    [first_key] = [
        r.delivery.key for r in outbox(pipeline).records() if r.delivery.partition == DAY
    ]

    landing.correct(pipeline.root, d(DAY), changed=10, removed=5)
    pipeline.run_ok(DAY)
    corrected = pipeline.run_ok(DAY, job_name=REPORT)
    pipeline.run_ok(DAY, job_name=REPORT)
    pipeline.run_ok(FIRST, LAST, job_name=REPORT)

    after = exports(pipeline)
    revision_2, text = expected_file(pipeline, DAY, 2)
    # The other days' files untouched; the corrected day gains exactly one file, revision 2.
    assert after == {**before, revision_2: after[revision_2]}
    assert (export_dir(pipeline) / revision_2).read_text() == text
    assert metadata(corrected, ASSET)["exports_performed"] == 1
    assert outbox_log(pipeline, corrected)[0].startswith(
        f"Outbox: corrected export_csv of asset '{ASSET}', partition {DAY}: revision 2"
    )
    [record] = [r for r in outbox(pipeline).records() if r.delivery.revision == 2]
    assert (record.delivery.partition, record.delivery.supersedes) == (DAY, first_key)


def test_a_process_killed_after_the_export_retries_it_under_the_same_name(
    pipeline: Pipeline,
) -> None:
    pipeline.generate(FIRST, LAST)
    pipeline.run_ok(FIRST, LAST)
    child = subprocess.run(
        [sys.executable, "-m", "tests.defs.report_worker", DAY, "performed"],
        cwd=REPO,
        env={
            **os.environ,
            "IDEM_DUCKDB_PATH": str(pipeline.database),
            "IDEM_LANDING_DIR": str(pipeline.root),
        },
        capture_output=True,
        timeout=180,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-2000:]
    path, text = expected_file(pipeline, DAY, 1)
    assert list(exports(pipeline)) == [path]
    [pending] = outbox(pipeline).records()
    assert (pending.status, pending.attempts) == ("pending", 1)

    retried = pipeline.run_ok(DAY, job_name=REPORT)
    again = pipeline.run_ok(DAY, job_name=REPORT)

    # At least once, under one name: the retry rewrote the same file, so the folder holds one.
    assert list(exports(pipeline)) == [path]
    assert (export_dir(pipeline) / path).read_text() == text
    assert metadata(retried, ASSET)["exports_retried"] == 1
    assert metadata(again, ASSET)["exports_skipped"] == 1
    assert "never recorded as delivered" in outbox_log(pipeline, retried)[0]
    [record] = outbox(pipeline).records()
    assert (record.status, record.attempts) == ("delivered", 2)
