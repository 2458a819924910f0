"""docs/delta.md's Delta Lake configuration, executed exactly as printed."""

from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from deltalake import DeltaTable

import idem_assets as ia
from tests.conformance.test_replace_contract import ALL_DAYS, events
from tests.delta.test_delta_backend import daily_events, expected, stored
from tests.helpers import REPO_ROOT, doc_python


def test_the_documented_delta_configuration_runs_as_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    code = doc_python("## The IO managers", doc="docs/delta.md")
    exec(compile(code, "docs/delta.md", "exec"), namespace)
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


def test_the_storage_options_field_recommends_nothing_the_docs_rule_out() -> None:
    """The UI shows this description: docs/delta.md says the locking provider is gone."""
    section = (REPO_ROOT / "docs" / "delta.md").read_text()
    section = section.split("\n## On object storage: S3\n", 1)[1].split("\n## ", 1)[0]
    assert "locking provider (`AWS_S3_LOCKING_PROVIDER`) of delta-rs 0.x is gone" in section
    assert "Never set\n`AWS_S3_ALLOW_UNSAFE_RENAME`" in section
    for manager in (ia.DeltaOverwriteIOManager, ia.DeltaMergeIOManager):
        description = manager.model_fields["storage_options"].description or ""
        assert "AWS_S3_LOCKING_PROVIDER" not in description
        assert "never AWS_S3_ALLOW_UNSAFE_RENAME" in description
