"""DuckDB: a database file, one transaction per publish (the core's own engine)."""

#: What this engine adds to ``idem_assets``: public name -> the module here that defines it.
EXPORTS = {
    "DuckDBOverwriteIOManager": "io_managers",
    "DuckDBMergeIOManager": "io_managers",
    "duckdb_connection": "connections",
}
#: DuckDB is a core dependency: no extra installs it.
EXTRA = None
