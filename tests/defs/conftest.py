"""Fixtures: every test gets its own landing folder, warehouse file, Definitions and instance."""

from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from .support import MakePipeline, Pipeline, build_defs


@pytest.fixture
def make_pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MakePipeline]:
    """Build a pipeline under ``tmp_path/<name>``; the environment is set before defs load."""
    instances: list[dg.DagsterInstance] = []

    def make(name: str = "main", root: Path | None = None) -> Pipeline:
        base = tmp_path / name
        root = root or base / "landing"
        database = base / "warehouse.duckdb"
        monkeypatch.setenv("IDEM_LANDING_DIR", str(root))
        monkeypatch.setenv("IDEM_DUCKDB_PATH", str(database))
        instance = dg.DagsterInstance.ephemeral()
        instances.append(instance)
        return Pipeline(root=root, database=database, defs=build_defs(), instance=instance)

    yield make
    for instance in instances:
        instance.dispose()


@pytest.fixture
def pipeline(make_pipeline: MakePipeline) -> Pipeline:
    """A fresh pipeline under ``tmp_path``."""
    return make_pipeline()
