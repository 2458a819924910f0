"""Where the guards read a batch staged in Spark: the library's statements as Spark SQL jobs."""

import uuid
from datetime import UTC, date, datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from idem_assets.lib.sql.predicates import Statement, bind


def value(v: Any) -> Any:
    """A bound value as Spark takes it, so that no time zone moves it.

    Dates and times are bound as ISO text, which Spark casts to the type of the column they
    are compared with: a naive time as wall-clock time (``TIMESTAMP_NTZ``), an aware one as the
    instant its offset names. Spark would read a naive Python datetime in the driver's zone.
    """
    if isinstance(v, datetime):
        if v.tzinfo is not None:
            v = v.astimezone(UTC)
        return v.isoformat(sep=" ")
    if isinstance(v, date):
        return v.isoformat()
    return v


def args(params: list[Any]) -> dict[str, Any]:
    """A statement's values as ``spark.sql(args=...)`` binds them: ``:p1, :p2, ...``."""
    named = bind(params, "spark")
    assert isinstance(named, dict)
    return {k: value(v) for k, v in named.items()}


class SparkEvaluator:
    """Runs the guards' statements on the session; each is one distributed job."""

    dialect = "spark"

    def __init__(self, spark: SparkSession) -> None:
        """Query ``spark``; :meth:`release` drops the views registered through this."""
        self.spark = spark
        self._views: list[str] = []

    def register(self, frame: DataFrame, prefix: str = "idem_batch_") -> str:
        """``frame`` as a temporary view of a name of its own; returns the name."""
        name = prefix + uuid.uuid4().hex
        frame.createOrReplaceTempView(name)
        self._views.append(name)
        return name

    def frame(self, statement: Statement | str) -> DataFrame:
        """The statement as a lazy DataFrame."""
        if isinstance(statement, str):
            return self.spark.sql(statement)
        query, params = statement
        return self.spark.sql(query, args=args(list(params)) or None)

    def rows(self, statement: Statement | str) -> list[tuple[Any, ...]]:
        """Run ``statement`` and fetch every row."""
        return [tuple(r) for r in self.frame(statement).collect()]

    def one(self, statement: Statement | str) -> tuple[Any, ...]:
        """The statement's first row (an empty tuple when there is none)."""
        found = self.rows(statement)
        return found[0] if found else ()

    def arrow(self, statement: Statement | str) -> pa.Table:
        """Run ``statement`` and fetch its rows as Arrow."""
        return self.frame(statement).toArrow()

    def release(self) -> None:
        """Drop every view registered through this evaluator."""
        views, self._views = self._views, []
        for name in views:
            self.spark.catalog.dropTempView(name)


def where(frame: DataFrame, statement: Statement) -> DataFrame:
    """``frame`` filtered by a predicate statement, its values bound."""
    spark = frame.sparkSession
    view = "idem_filter_" + uuid.uuid4().hex
    frame.createOrReplaceTempView(view)
    try:
        query = f"SELECT * FROM {view} WHERE {statement.sql}"
        found = spark.sql(query, args=args(list(statement.params)) or None)
        # Resolved now: the view may go, the plan keeps its source.
        found.schema  # noqa: B018
        return found
    finally:
        spark.catalog.dropTempView(view)
