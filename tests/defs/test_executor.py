"""The location runs every job's steps in the run worker's process unless run config says not."""

import pytest
from dagster._core.system_config.objects import ResolvedRunConfig

from idem_assets.definitions import defs


@pytest.mark.parametrize("job_name", ["__ASSET_JOB", "taxi_daily"])
@pytest.mark.parametrize(
    ("run_config", "executor"),
    [
        ({}, {"in_process": {"retries": {"enabled": {}}}}),
        (
            {"execution": {"config": {"in_process": {}}}},
            {"in_process": {"retries": {"enabled": {}}}},
        ),
        (
            {"execution": {"config": {"multiprocess": {"max_concurrent": 2}}}},
            {"multiprocess": {"max_concurrent": 2, "retries": {"enabled": {}}}},
        ),
    ],
)
def test_jobs_run_in_process_by_default_and_multiprocess_on_request(
    job_name: str, run_config: dict, executor: dict
) -> None:
    job = defs().get_repository_def().get_job(job_name)
    # The executor config a run resolves to, defaults filled in, as the run worker sees it.
    resolved = ResolvedRunConfig.build(job, run_config).execution.execution_engine_config
    assert job.executor_def.name == "in_process_by_default"
    assert resolved == executor
