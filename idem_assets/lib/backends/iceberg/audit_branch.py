"""Write-audit-publish on an Iceberg branch: main moves only to a snapshot whose checks passed.

The publish's one snapshot is committed to a branch of its own (``idem-audit-<id>``) created at
main's head, the blocking checks read the window from that branch, and publishing fast-forwards
main to it and drops the branch in one commit. Readers of main never see an unaudited snapshot,
and main's history gains only the published one.

pyiceberg 0.12 has no fast-forward (``fast_forward_branch``, ``replace_branch`` and
``cherry_pick_snapshot`` are not in the release), and ``set_current_snapshot`` checks no
ancestry. The fast-forward is built from what it has: the staged snapshot's parent must be main's
head as loaded, and ``set_current_snapshot`` asserts main still points there, so a writer that
moved main in between makes the publish lose (the branch is dropped and the publish starts over).
A table with no snapshot gets an empty one first, because a branch needs a snapshot to start at.
"""

from collections.abc import Callable, Sequence

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table as IcebergTable

from idem_assets.lib.backends.iceberg import files
from idem_assets.lib.backends.iceberg.commit import (
    Change,
    create,
    stage,
    without_retry,
)
from idem_assets.lib.dagster_layer.audit import audit_table, refusal
from idem_assets.lib.dagster_layer.checks import Check
from idem_assets.lib.model.errors import BlockingCheckError
from idem_assets.lib.write.seam import Scope

#: Branches an audited publish stages on; one of this prefix left behind was never published.
BRANCH_PREFIX = "idem-audit-"


def publish_audited(
    catalog: Catalog,
    identifier: tuple[str, str],
    table: IcebergTable | None,
    change: Change,
    scope: Scope,
    checks: Sequence[Check],
    time_column: str | None,
    categories: Sequence[str],
    on_stage: Callable[[str], None] = lambda stage: None,
) -> IcebergTable:
    """Stage ``change`` on an audit branch, run ``checks`` on it, then fast-forward main.

    ``on_stage`` (a test hook) is called with ``branched`` once the branch exists and with
    ``audited`` between the audit and the fast-forward.
    """
    if table is None:
        empty = Change(
            batch=change.columns.empty_table(),
            scope=change.scope,
            region=change.region,
            properties=change.properties,
        )
        table = create(catalog, identifier, empty, time_column, categories)
    if table.current_snapshot() is None:
        tx = without_retry(table).transaction()
        tx.update_snapshot().fast_append().commit()
        table = tx.commit_transaction()
    base = table.current_snapshot()
    assert base is not None
    branch = BRANCH_PREFIX + change.snapshot_properties.get("idem_assets.run", _new_id())
    without_retry(table).manage_snapshots().create_branch(base.snapshot_id, branch).commit()
    try:
        on_stage("branched")
        table = without_retry(catalog.load_table(identifier))
        tx = table.transaction()
        stage(tx, table, change, branch=branch)
        table = without_retry(tx.commit_transaction())
        head = table.metadata.refs[branch].snapshot_id
        _audit(table, head, scope, checks)
        on_stage("audited")
        staged = table.snapshot_by_id(head)
        main = table.current_snapshot()
        # A fast-forward: main is still where the branch started (another writer may have
        # moved it since), and set_current_snapshot asserts that in the commit itself.
        if staged is None or main is None or staged.parent_snapshot_id != main.snapshot_id:
            raise CommitFailedException(f"main moved since branch {branch} started at its head")
        with table.manage_snapshots() as snapshots:
            snapshots.set_current_snapshot(snapshot_id=head)
            snapshots.remove_branch(branch)
        return catalog.load_table(identifier)
    except BaseException:
        _drop_branch(catalog, identifier, branch)
        raise


def _audit(table: IcebergTable, head: int, scope: Scope, checks: Sequence[Check]) -> None:
    """Run the blocking checks on the window as the branch holds it; refuse on a failure."""
    rows, _ = files.region_rows(table, scope.region, head)
    report = audit_table(rows, checks, scope.time_column, scope.window)
    failures = report.blocking_failures
    if failures:
        failed = sorted({k for v in failures for k in v.per_partition if k})
        message = refusal(scope.settings.asset, scope.window, failures, failed)
        raise BlockingCheckError(
            f"{message} The batch was staged on an audit branch only: main was not moved."
            " Nothing was changed."
        )


def _drop_branch(catalog: Catalog, identifier: tuple[str, str], branch: str) -> None:
    """Remove the audit branch if it is still there (its snapshot was never published)."""
    try:
        table = without_retry(catalog.load_table(identifier))
        if branch in table.metadata.refs:
            table.manage_snapshots().remove_branch(branch).commit()
    except Exception:
        pass


def _new_id() -> str:
    import uuid

    return uuid.uuid4().hex[:12]
