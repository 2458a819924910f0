"""The location's default executor: every step of a run in the run worker's own process."""

import dagster as dg

_STOCK = dg.multi_or_in_process_executor

#: Dagster's default executor with in-process as its default instead of multiprocess. The
#: warehouse takes one writer at a time (the pool), so a process per step buys no parallelism; it
#: costs a process start and a code load per step, and a step process outlives a killed run
#: worker and goes on writing. In one process, killing the run worker ends every step with it.
#: Run config can still choose: {"execution": {"config": {"multiprocess": {}}}}.
in_process_by_default = dg.ExecutorDefinition(
    name="in_process_by_default",
    config_schema=dg.Field(_STOCK.config_schema.config_type, default_value={"in_process": {}}),
    requirements=_STOCK.get_requirements,
    executor_creation_fn=_STOCK.executor_creation_fn,
    description="Steps run one after another in the run's own process unless run config says"
    " multiprocess.",
)

defs = dg.Definitions(executor=in_process_by_default)
