"""The README's Delta Lake configuration, executed exactly as printed."""

from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from deltalake import DeltaTable

import idem_assets as ia
from tests.conformance.test_replace_contract import ALL_DAYS, events
from tests.delta.test_delta_backend import daily_events, expected, stored
from tests.helpers import readme_python


def test_the_readme_delta_configuration_runs_as_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    exec(compile(readme_python("### On Delta Lake"), "README.md", "exec"), namespace)
    resources = namespace["resources"]
    assert isinstance(resources["io_manager"], ia.DeltaOverwriteIOManager)
    assert isinstance(resources["merge_io_manager"], ia.DeltaMergeIOManager)
    assert namespace["on_s3"].root == "s3://my-bucket/lake"

    for _ in range(2):
        result = dg.materialize([daily_events], resources=resources, partition_key=ALL_DAYS[0])
    metadata = result.get_asset_materialization_events()[0].materialization.metadata
    version = metadata["delta_version"].value
    uri = str(tmp_path / "lake" / "main" / "daily_events")
    assert DeltaTable(uri).version() == version
    assert stored(str(tmp_path / "lake"), "daily_events") == expected(events(ALL_DAYS[0]))
