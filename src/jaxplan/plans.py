"""Ready-made plans that are not one algorithm's."""

from __future__ import annotations

from jaxplan.flow import Plan
from jaxplan.stages import ParallelRollouts, SelectExperiences, StandardMetricsReporting
from jaxplan.workers import WorkerSet


def sample_only_plan(workers: WorkerSet, *, mode: str = "async", num_async: int = 1) -> Plan:
    """`ParallelRollouts(mode) -> SelectExperiences -> StandardMetricsReporting`: sample and
    report, no learning (RLlib's random-agent plan; async by default, as RLlib's first
    example of an execution plan). It is the acting-throughput ceiling, and an evaluator of
    fixed policies: set the params in `PlanState.policies` (or use `RandomPolicy`)."""
    rollouts = ParallelRollouts(workers, mode=mode, num_async=num_async)
    rollouts = rollouts.for_each(SelectExperiences(workers.trainable_policies()))
    return StandardMetricsReporting(rollouts, workers)
