"""Files under a table's location that no metadata reaches: what killed or lost commits leave.

A publish writes its data files, manifests and metadata file before the catalog's
compare-and-swap; killed before it (or losing it), they stay on disk, referenced by nothing.
Readers never see them. pyiceberg 0.12 has no remove-orphan-files (its maintenance has only
snapshot expiry), so :func:`sweep_orphans` is this library's: every file under the table's
location that the current metadata, its metadata log, any snapshot's manifest list, manifests
or data files, or statistics do not name, older than a grace period (a publish in flight has
written its files but not committed them yet: never sweep younger than the longest publish).
"""

from datetime import UTC, datetime, timedelta

from pyarrow.fs import FileSelector, FileType
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table

#: Files younger than this are never orphans: a publish may be about to commit them.
GRACE = timedelta(hours=1)


def referenced(table: Table) -> set[str]:
    """Every file the table's metadata reaches, as the paths its file system lists them."""
    io = table.io
    paths = {table.metadata_location}
    paths |= {entry.metadata_file for entry in table.metadata.metadata_log}
    paths |= {s.statistics_path for s in table.metadata.statistics}
    paths |= {s.statistics_path for s in table.metadata.partition_statistics}
    for snapshot in table.snapshots():
        paths.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(io):
            paths.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=False):
                paths.add(entry.data_file.file_path)
    return {_path(p) for p in paths}


def _path(location: str) -> str:
    return PyArrowFileIO.parse_location(location)[2]


def orphans(table: Table, grace: timedelta = GRACE, now: datetime | None = None) -> list[str]:
    """Files under the table's location that nothing references, last written before ``grace``."""
    io = table.io
    if not isinstance(io, PyArrowFileIO):
        raise TypeError("listing a table's files needs pyiceberg's PyArrowFileIO")
    scheme, netloc, root = PyArrowFileIO.parse_location(table.location())
    fs = io.fs_by_scheme(scheme, netloc)
    keep = referenced(table)
    cutoff = (now or datetime.now(UTC)) - grace
    found = []
    for info in fs.get_file_info(FileSelector(root, recursive=True, allow_not_found=True)):
        if info.type != FileType.File or info.path in keep:
            continue
        written = info.mtime
        if written is not None and written.replace(tzinfo=written.tzinfo or UTC) > cutoff:
            continue
        found.append(info.path)
    return sorted(found)


def sweep_orphans(
    table: Table, grace: timedelta = GRACE, dry_run: bool = False, now: datetime | None = None
) -> list[str]:
    """Delete (or, with ``dry_run``, only list) the table's orphan files; returns their paths."""
    found = orphans(table, grace, now)
    if not dry_run:
        scheme, netloc, _ = PyArrowFileIO.parse_location(table.location())
        fs = table.io.fs_by_scheme(scheme, netloc)  # type: ignore[attr-defined]
        for path in found:
            fs.delete_file(path)
    return found
