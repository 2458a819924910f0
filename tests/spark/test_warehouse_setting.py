"""The taxi code location on Spark by one setting: IDEM_WAREHOUSE=spark."""

import json
from pathlib import Path
from typing import Any

import pytest

import idem_assets as ia
from idem_assets.defs.raw_trips import raw_trips
from idem_assets.defs.reconciliation import counts_per_day
from idem_assets.defs.revenue_running_total import revenue_running_total
from idem_assets.defs.stale_totals import stored_totals
from idem_assets.defs.warehouse import SPARK_CONF, WAREHOUSE_ENV, warehouse_slots
from tests.defs.support import ROWS, MakePipeline, days
from tests.defs.test_warehouse import run_documented_switch, run_the_chain_and_check_it
from tests.spark_session import drop_schema

DAYS = days("2026-01-01", "2026-01-03")


@pytest.fixture(autouse=True)
def empty_main(spark: Any) -> None:
    """The location writes schema main of the worker's catalog: each test starts without it."""
    drop_schema(spark, "main")


@pytest.mark.slow
@pytest.mark.full
def test_the_chain_runs_on_spark_by_one_setting(
    make_pipeline: MakePipeline,
    spark_conf: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The chain, its checks and totals on Spark tables; the worker's session is the one."""
    monkeypatch.setenv(WAREHOUSE_ENV, "spark")
    monkeypatch.setenv(SPARK_CONF, json.dumps(spark_conf))
    pipeline = make_pipeline()
    pipeline.generate(DAYS[0], DAYS[-1])
    overwrite = pipeline.defs.resources["overwrite_io_manager"]
    assert isinstance(overwrite, ia.SparkOverwriteIOManager)
    assert isinstance(pipeline.defs.resources["merge_io_manager"], ia.SparkMergeIOManager)
    assert warehouse_slots() == 1

    run_the_chain_and_check_it(pipeline, overwrite)


@pytest.mark.slow
def test_the_docs_spark_switch_runs_as_printed(
    make_pipeline: MakePipeline, spark: Any, spark_conf: dict[str, str], tmp_path: Path
) -> None:
    """The printed launch, in a process of its own on the worker's metastore server."""
    pipeline = make_pipeline()
    pipeline.generate(DAYS[0])
    conf = {**spark_conf, "spark.local.dir": str(tmp_path / "local")}
    done = run_documented_switch(
        "docs/spark.md", "## The code location on Spark", tmp_path, {SPARK_CONF: json.dumps(conf)}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert not pipeline.database.exists()
    reader = ia.SparkOverwriteIOManager(spark_conf=spark_conf)
    assert counts_per_day(reader.read_asset(raw_trips), "pickup_at") == {DAYS[0]: ROWS}
    assert list(stored_totals(reader.read_asset(revenue_running_total))) == [DAYS[0]]
