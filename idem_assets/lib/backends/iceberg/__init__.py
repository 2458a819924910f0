"""Apache Iceberg through pyiceberg: one snapshot per publish on a SQL or REST catalog."""

#: What this engine adds to ``idem_assets``: public name -> the module here that defines it.
EXPORTS = {
    "IcebergOverwriteIOManager": "io_managers",
    "IcebergMergeIOManager": "io_managers",
}
#: ``pip install 'idem_assets[iceberg]'`` installs its driver.
EXTRA = "iceberg"
