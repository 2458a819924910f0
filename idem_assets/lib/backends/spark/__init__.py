"""Apache Spark: Parquet tables in Spark's catalog, each window swapped in by one catalog call."""

#: What this engine adds to ``idem_assets``: public name -> the module here that defines it.
EXPORTS = {
    "SparkOverwriteIOManager": "io_managers",
    "SparkMergeIOManager": "io_managers",
    "SparkResource": "session",
}
#: ``pip install 'idem_assets[spark]'`` installs its driver (and Java 17+ must be on the PATH).
EXTRA = "spark"
