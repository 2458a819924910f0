"""Data versions from content, and the automation condition that runs only on a real change.

Dagster's default data version of a materialization is new on every run (a hash of the run id
when an asset has no code version), so an identical rerun makes everything downstream stale. A
publish already computes an order-independent fingerprint of the window it wrote; recorded as the
data version, a rerun that reproduces the same rows keeps the version, downstream stays fresh,
and :func:`content_changed` requests nothing.

What Dagster can express: a step's output carries one data version, stamped on every partition it
materializes. A one-day run's version is that day's fingerprint. A range run (a chunk of a
backfill) stamps the fingerprint of its whole window on each of its days: an identical rerun of
the same range keeps it; a change to any day of the range changes it for every day of the range.
An asset that reads its own earlier days keeps Dagster's run-based version (see
:func:`record_data_version`).
"""

import dagster as dg


def record_data_version(context: dg.OutputContext, fingerprint: str) -> None:
    """Make ``fingerprint`` (of the window just published) the data version of its materialization.

    ``Output(data_version=...)`` is fixed before the IO manager writes; the content is known only
    after. Dagster builds the materialization events right after ``handle_output`` returns, from
    the step's cached data version when one is set, and marks it user-provided.
    """
    step, key = context.step_context, context.asset_key
    if key in step.job_def.asset_layer.get(key).parent_keys:
        # An asset that reads its own earlier days is its own input. After the output, Dagster
        # reads that input's latest version for provenance and warns on every run whose cached
        # version differs from it ("Data version mismatch"), i.e. on every change. Such an asset
        # keeps Dagster's run-based version: a rerun marks its downstream stale.
        return
    step.set_data_version(key, dg.DataVersion(fingerprint))


def content_changed() -> dg.AutomationCondition:
    """Request a partition when a dependency's data version changed for it since the last tick.

    For downstream assets of audited (or ``idem_assets`` IO-managed) assets: an identical rerun
    upstream keeps the data version, so nothing is requested; a correction changes it, so the
    affected partitions run once. Dependencies that this tick requests too (a chain) run in the
    same run. Partitions already requested with the upstream run, with a missing or running
    dependency, or running themselves, wait.
    """
    changed = (
        dg.AutomationCondition.data_version_changed()
        & ~dg.AutomationCondition.executed_with_root_target()
    ).with_label("data_version_changed_without_root")
    return (
        dg.AutomationCondition.any_deps_match(changed | dg.AutomationCondition.will_be_requested())
        .with_label("any_deps_content_changed")
        .since_last_handled()
        & ~dg.AutomationCondition.any_deps_missing()
        & ~dg.AutomationCondition.any_deps_in_progress()
        & ~dg.AutomationCondition.in_progress()
    ).with_label("content_changed")
