"""Delta Lake through delta-rs: one optimistic commit per publish, no JVM."""

#: What this engine adds to ``idem_assets``: public name -> the module here that defines it.
EXPORTS = {
    "DeltaOverwriteIOManager": "io_managers",
    "DeltaMergeIOManager": "io_managers",
}
#: ``pip install 'idem_assets[delta]'`` installs its driver.
EXTRA = "delta"
