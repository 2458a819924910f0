"""DuckDB: a database file, one transaction per publish (the core's own engine)."""

#: What this engine adds to ``idem_assets``: public name -> the module here that defines it.
EXPORTS = {
    "DuckDBOverwriteIOManager": "io_managers",
    "DuckDBMergeIOManager": "io_managers",
    "duckdb_connection": "connections",
}
#: DuckDB is a core dependency: no extra installs it.
EXTRA = None
#: Connections this engine wraps when one is passed to ``ia.publish``: a DuckDB connection, a
#: cursor, or anything else no engine claims (a proxy of a DuckDB connection).
WRAPS = {"_duckdb": "backend:DuckDBBackend", "*": "backend:DuckDBBackend"}
