"""The one Spark session of a test process: local[2], a Derby metastore under its directory.

Spark takes its static settings from the first session of a process, so every Spark test of a
pytest worker shares this session (the ``spark`` fixture in tests/conftest.py), and the Spark
IO managers of the tests name the same settings: their ``getOrCreate`` returns it.
"""

from pathlib import Path

#: Small jobs on two cores: two shuffle partitions, no UI, no progress bar, UTC.
FAST_CONF: dict[str, str] = {
    "spark.master": "local[2]",
    "spark.app.name": "idem-tests",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.execution.arrow.pyspark.fallback.enabled": "false",
    "spark.sql.statistics.size.autoUpdate.enabled": "false",
    "spark.driver.memory": "1g",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    "spark.hadoop.parquet.summary.metadata.level": "NONE",
    "spark.sql.catalogImplementation": "hive",
}


def test_conf(root: Path) -> dict[str, str]:
    """FAST_CONF with the warehouse, the Derby metastore and Spark's scratch files under ``root``."""
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    java = (
        f"-Dderby.system.home={root} -Djava.io.tmpdir={root}"
        # A test JVM lives minutes: the quick compiler only, and a small serial heap.
        " -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    )
    return {
        **FAST_CONF,
        "spark.sql.warehouse.dir": str(root / "warehouse"),
        "spark.hadoop.javax.jdo.option.ConnectionURL": (
            f"jdbc:derby:;databaseName={root / 'metastore_db'};create=true"
        ),
        "spark.driver.extraJavaOptions": java,
        "spark.local.dir": str(root / "local"),
    }
