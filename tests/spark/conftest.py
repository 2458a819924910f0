"""The Spark tests' fixtures: the worker's one session (tests/conftest.py) and a fresh schema."""

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idem_assets.lib.backends.spark.backend import SparkBackend
from tests.defs.conftest import make_pipeline  # noqa: F401  (the taxi location's pipelines)
from tests.spark_session import drop_schema


@pytest.fixture
def schema(spark: Any, tmp_path: Path) -> Iterator[str]:
    """A schema of its own under ``tmp_path``, dropped with its tables after the test."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    spark.sql(f"CREATE DATABASE {name} LOCATION '{tmp_path / (name + '.db')}'")
    yield name
    drop_schema(spark, name)


@pytest.fixture
def backend(spark: Any, tmp_path: Path) -> SparkBackend:
    """The Spark backend on the worker's session."""
    return SparkBackend(spark, str(tmp_path / "warehouse"))
