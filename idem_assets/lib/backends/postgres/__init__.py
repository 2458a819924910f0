"""PostgreSQL: binary COPY of Arrow through ADBC, one transaction per publish."""

#: What this engine adds to ``idem_assets``: public name -> the module here that defines it.
EXPORTS = {
    "PostgresOverwriteIOManager": "io_managers",
    "PostgresMergeIOManager": "io_managers",
}
#: ``pip install 'idem_assets[postgres]'`` installs its driver.
EXTRA = "postgres"
