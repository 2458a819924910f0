"""The tutorial's multi-partitioned asset, run as printed: each run replaces only its keys."""

from datetime import datetime
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import pandas as pd
import pytest

import idem_assets as ia
from tests.helpers import doc_python, range_tags

HEADING = "### Static, dynamic and multi-dimensional partitions"


def test_the_tutorial_multi_partition_example_replaces_exactly_its_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    exec(compile(doc_python(HEADING), "docs/tutorial.md", "exec"), namespace)
    asset, defs = namespace["borough_revenue"], namespace["defs"]

    def run(key: str | None = None, tags: dict[str, str] | None = None) -> None:
        result = dg.materialize(
            [asset], partition_key=key, tags=tags or {}, resources=defs.resources
        )
        assert result.success

    def rows() -> list[tuple[Any, ...]]:
        con = duckdb.connect(str(tmp_path / "warehouse.duckdb"), read_only=True)
        try:
            return con.execute("SELECT * FROM borough_revenue ORDER BY ALL").fetchall()
        finally:
            con.close()

    run("Queens|2026-01-02")
    run(tags=range_tags("Brooklyn|2026-01-01", "Brooklyn|2026-01-03"))
    expected = [(datetime(2026, 1, d), "Brooklyn", 9.5) for d in (1, 2, 3)] + [
        (datetime(2026, 1, 2), "Queens", 9.5)
    ]
    assert rows() == sorted(expected)

    run("Queens|2026-01-02")
    run(tags=range_tags("Brooklyn|2026-01-02", "Brooklyn|2026-01-03"))
    assert rows() == sorted(expected)

    # The tutorial's claim: a row of another borough (or day) is refused, and nothing changes.
    @dg.asset(
        name="borough_revenue",
        partitions_def=namespace["day_by_borough"],
        io_manager_key="overwrite_io_manager",
        metadata=asset.metadata_by_key[asset.key],
    )
    def with_a_stray_row() -> pd.DataFrame:
        """Queens' day, plus a Brooklyn row."""
        return pd.DataFrame(
            {
                "pickup_day": [pd.Timestamp("2026-01-02")] * 2,
                "borough": ["Queens", "Brooklyn"],
                "revenue": [1.0, 1.0],
            }
        )

    with pytest.raises(ia.StrayRowsError, match="Nothing was changed"):
        dg.materialize(
            [with_a_stray_row], partition_key="Queens|2026-01-02", resources=defs.resources
        )
    assert rows() == sorted(expected)
