"""The daily schedule and the late-file sensor."""

import json
from datetime import UTC, datetime
from typing import Any

import dagster as dg
import pytest
import time_machine

from idem_assets import landing
from idem_assets.defs.resources import LandingZone
from idem_assets.defs.sensors import late_file_requests, run_key_for

from .support import RANGE_END, RANGE_START, Pipeline, d, days, failure_text, materialized

SHA_TAG = "idem_assets/landing_sha256"
RUNNING_TOTAL = dg.AssetKey("revenue_running_total")
#: 2026-01-06 is in progress at this time, so 2026-01-05 is the last finished partition.
NOW = datetime(2026, 1, 6, 2, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("tick", "partition"),
    [
        (datetime(2026, 1, 5, 1, 0, tzinfo=UTC), "2026-01-04"),
        (datetime(2026, 3, 1, 1, 0, tzinfo=UTC), "2026-02-28"),
    ],
)
def test_schedule_requests_only_the_day_that_just_ended(
    pipeline: Pipeline, tick: datetime, partition: str
) -> None:
    schedule = pipeline.defs.resolve_schedule_def("taxi_daily_schedule")
    assert schedule.cron_schedule == "0 1 * * *"
    assert schedule.execution_timezone == "UTC"
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    assert schedule.job_name == "taxi_daily"
    assert "Catch-up is off" in (schedule.description or "")

    pipeline.generate(partition)
    data = schedule.evaluate_tick(schedule_context(pipeline, tick))

    assert data.skip_message is None
    assert [(r.partition_key, r.run_key) for r in data.run_requests or []] == [
        (partition, partition)
    ]


def schedule_context(pipeline: Pipeline, tick: datetime) -> dg.ScheduleEvaluationContext:
    """A tick of the schedule at ``tick``, with the pipeline's landing zone."""
    return dg.build_schedule_context(
        scheduled_execution_time=tick,
        resources={"landing": LandingZone(root=str(pipeline.root))},
        repository_def=pipeline.defs.get_repository_def(),
    )


def test_schedule_skips_a_day_whose_file_has_not_arrived(pipeline: Pipeline) -> None:
    pipeline.generate("2026-01-03")
    schedule = pipeline.defs.resolve_schedule_def("taxi_daily_schedule")

    data = schedule.evaluate_tick(
        schedule_context(pipeline, datetime(2026, 1, 5, 1, 0, tzinfo=UTC))
    )

    assert list(data.run_requests or []) == []
    assert data.skip_message == (
        f"No landing file for 2026-01-04 yet: {pipeline.root}/trips/2026-01-04.csv does not"
        " exist. late_file_sensor loads the day when it arrives; or backfill it."
    )


class Sensor:
    """Evaluates late_file_sensor the way the daemon does: resources, cursor, frozen clock."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.sensor = pipeline.defs.resolve_sensor_def("late_file_sensor")
        self.cursor: str | None = None

    def tick(self) -> list[dg.RunRequest]:
        context = dg.build_sensor_context(
            instance=self.pipeline.instance,
            cursor=self.cursor,
            resources={"landing": LandingZone(root=str(self.pipeline.root))},
            definitions=self.pipeline.defs,
        )
        with time_machine.travel(NOW, tick=False):
            data = self.sensor.evaluate_tick(context)
        self.cursor = data.cursor
        return list(data.run_requests or [])


def sha(pipeline: Pipeline, day: str) -> str:
    fingerprint = landing.landing_fingerprint(pipeline.root, d(day))
    assert fingerprint is not None
    return fingerprint


def test_sensor_first_tick_records_a_baseline_and_requests_nothing(pipeline: Pipeline) -> None:
    pipeline.generate("2026-01-01", "2026-01-05")
    sensor = Sensor(pipeline)
    assert sensor.sensor.job_name == "taxi_daily"
    assert sensor.sensor.minimum_interval_seconds == 60
    assert "first tick only records the files already there" in (sensor.sensor.description or "")

    context = dg.build_sensor_context(
        instance=pipeline.instance,
        resources={"landing": LandingZone(root=str(pipeline.root))},
        definitions=pipeline.defs,
    )
    with time_machine.travel(NOW, tick=False):
        data = sensor.sensor.evaluate_tick(context)

    assert list(data.run_requests or []) == []
    assert data.skip_message == (
        "First tick: recorded 5 landing file(s) as the baseline; a file that appears or changes"
        " from now on reruns its day. Backfill the days already there."
    )
    assert json.loads(data.cursor or "") == {
        day: {"sha256": sha(pipeline, day), "versions": 1}
        for day in days("2026-01-01", "2026-01-05")
    }


def test_sensor_requests_each_file_version_once(pipeline: Pipeline) -> None:
    pipeline.generate("2026-01-01", "2026-01-04")
    sensor = Sensor(pipeline)
    assert sensor.tick() == []  # the baseline

    pipeline.generate("2026-01-05", "2026-01-05")  # a late file
    (late,) = sensor.tick()
    assert late.partition_key == "2026-01-05"
    assert late.run_key == f"2026-01-05:{sha(pipeline, '2026-01-05')[:16]}:1"
    assert late.tags[SHA_TAG] == sha(pipeline, "2026-01-05")
    assert late.asset_selection is None

    pipeline.generate("2026-01-06", "2026-01-06")
    assert sensor.tick() == []  # 2026-01-06 is still the schedule's

    old_key = run_key_for(d("2026-01-03"), sha(pipeline, "2026-01-03"))
    landing.correct(pipeline.root, d("2026-01-03"))
    (rerun,) = sensor.tick()
    assert rerun.partition_key == "2026-01-03"
    assert rerun.run_key == f"2026-01-03:{sha(pipeline, '2026-01-03')[:16]}:2" != old_key

    assert sensor.tick() == []

    # A withdrawn correction brings back the original bytes: loaded again, under a new key.
    pipeline.generate("2026-01-03", "2026-01-03")
    (reverted,) = sensor.tick()
    assert reverted.partition_key == "2026-01-03"
    assert reverted.run_key == f"{(old_key or '')[:-2]}:3"


def test_sensor_follows_a_corrected_day_with_the_later_running_totals(
    pipeline: Pipeline,
) -> None:
    pipeline.generate("2026-01-01", "2026-01-04")
    for day in days("2026-01-01", "2026-01-04"):
        pipeline.run_ok(day)
    sensor = Sensor(pipeline)
    assert sensor.tick() == []  # the baseline

    landing.correct(pipeline.root, d("2026-01-02"))
    requests = sensor.tick()

    day_run, totals_run = requests
    assert day_run.partition_key == "2026-01-02"
    assert (totals_run.run_key or "").startswith("running_total:2026-01-03...2026-01-04:")
    assert totals_run.asset_selection == [RUNNING_TOTAL]
    assert totals_run.partition_key is None
    assert totals_run.tags == {
        RANGE_START: "2026-01-03",
        RANGE_END: "2026-01-04",
        # evaluate_tick adds the sensor's name to every request
        "dagster/sensor_name": "late_file_sensor",
    }
    assert sensor.tick() == []

    # Run both in order, as the daemon would (the warehouse pool runs them one at a time).
    assert pipeline.run_request(day_run).success
    assert totals(pipeline) != cumulative(pipeline)  # 2026-01-03 on still add the old revenue
    follow_up = pipeline.run_request(totals_run)
    assert follow_up.success, failure_text(follow_up)
    assert materialized(follow_up) == {"revenue_running_total": ["2026-01-03", "2026-01-04"]}
    assert totals(pipeline) == cumulative(pipeline)


def totals(pipeline: Pipeline) -> dict[str, object]:
    return dict(
        pipeline.query("SELECT day::VARCHAR, running_total FROM revenue_running_total ORDER BY day")
    )


def cumulative(pipeline: Pipeline) -> dict[str, object]:
    """The running total recomputed from daily_zone_revenue."""
    return dict(
        pipeline.query(
            "SELECT day::VARCHAR, sum(sum(revenue)) OVER (ORDER BY day)"
            " FROM daily_zone_revenue GROUP BY day ORDER BY day"
        )
    )


def test_late_file_requests_skips_unfinished_and_seen_days() -> None:
    seen: dict[str, dict[str, Any]] = {"2026-01-01": {"sha256": "a" * 64, "versions": 1}}
    fingerprints = {"2026-01-01": "a" * 64, "2026-01-02": "b" * 64, "2026-01-03": "c" * 64}

    requests = late_file_requests(seen, fingerprints, "2026-01-02", None)

    assert [(r.run_key, r.partition_key) for r in requests] == [
        (run_key_for(d("2026-01-02"), "b" * 64), "2026-01-02")
    ]
    assert requests[0].run_key == "2026-01-02:" + "b" * 16 + ":1"
    # The unfinished day is not marked seen, so it is requested once it has finished.
    assert seen == {
        "2026-01-01": {"sha256": "a" * 64, "versions": 1},
        "2026-01-02": {"sha256": "b" * 64, "versions": 1},
    }
    assert late_file_requests(seen, fingerprints, "2026-01-02", None) == []
    assert [
        r.partition_key for r in late_file_requests(seen, fingerprints, "2026-01-03", None)
    ] == ["2026-01-03"]


def test_late_file_requests_without_partitions_requests_nothing() -> None:
    seen: dict[str, dict[str, Any]] = {}
    assert late_file_requests(seen, {"2026-01-01": "a" * 64}, None, None) == []
    assert seen == {}


@pytest.mark.parametrize(
    ("last_total", "follow_up"),
    [
        (None, None),
        ("2026-01-01", None),
        ("2026-01-02", None),
        ("2026-01-03", ("2026-01-03", "2026-01-03")),
        ("2026-02-10", ("2026-01-03", "2026-02-10")),
    ],
)
def test_late_file_requests_recomputes_later_running_totals(
    last_total: str | None, follow_up: tuple[str, str] | None
) -> None:
    requests = late_file_requests({}, {"2026-01-02": "f" * 64}, "2026-03-01", last_total)

    assert requests[0].partition_key == "2026-01-02"
    assert requests[0].tags == {SHA_TAG: "f" * 64}
    if follow_up is None:
        assert len(requests) == 1
    else:
        assert len(requests) == 2
        assert (requests[1].run_key or "").startswith(f"running_total:{follow_up[0]}...")
        assert requests[1].asset_selection == [RUNNING_TOTAL]
        assert requests[1].tags == {RANGE_START: follow_up[0], RANGE_END: follow_up[1]}


def test_late_file_requests_coalesce_the_running_total_follow_up() -> None:
    fingerprints = {f"2026-01-0{i}": str(i) * 64 for i in range(2, 6)}

    requests = late_file_requests({}, fingerprints, "2026-03-01", "2026-02-10")

    assert [r.partition_key for r in requests[:-1]] == list(fingerprints)
    # Four changed days, one recomputation of the totals, from the day after the earliest.
    (follow_up,) = [r for r in requests if r.asset_selection == [RUNNING_TOTAL]]
    assert follow_up is requests[-1]
    assert follow_up.tags == {RANGE_START: "2026-01-03", RANGE_END: "2026-02-10"}
