"""The Spark session every Spark IO manager and asset of a process shares, from one config."""

import os
import sys
from collections.abc import Mapping

import dagster as dg
from pydantic import Field
from pyspark.sql import SparkSession


def spark_session(spark_conf: Mapping[str, str]) -> SparkSession:
    """The process's Spark session, created with ``spark_conf`` if none runs yet.

    Spark takes static settings (the master, the warehouse, the metastore) only from the first
    session of a process: a later call returns the running session whatever it asks for.
    """
    builder = SparkSession.builder
    conf = dict(spark_conf)
    if str(conf.get("spark.master", "local")).startswith("local"):
        # Local Python workers run this interpreter and its packages (pyarrow, the asset's
        # own), not the first python3 on PATH: PySpark reads only the environment for it.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    for key, value in conf.items():
        builder = builder.config(key, value)
    if conf.get("spark.sql.catalogImplementation", "hive") == "hive":
        # Tables live in a Hive metastore: embedded (Derby) by default, or the cluster's one
        # (spark.hadoop.hive.metastore.uris).
        builder = builder.enableHiveSupport()
    return builder.getOrCreate()


SPARK_CONF_FIELD = Field(
    default_factory=dict,
    description=(
        "Spark settings for the session, as spark-submit's --conf takes them (e.g."
        " {'spark.master': 'spark://host:7077', 'spark.hadoop.hive.metastore.uris':"
        " 'thrift://metastore:9083', 'spark.sql.warehouse.dir': 's3a://bucket/warehouse'})."
        " Spark applies static settings only to the first session of a process, so every"
        " Spark resource and IO manager of a deployment should name the same ones."
    ),
)


class SparkResource(dg.ConfigurableResource):
    """The Spark session for assets that build DataFrames, configured like the IO managers."""

    spark_conf: dict[str, str] = SPARK_CONF_FIELD

    def session(self) -> SparkSession:
        """The process's Spark session (created with ``spark_conf`` on first use)."""
        return spark_session(self.spark_conf)
