"""Ready-made plans that are not one algorithm's."""

from __future__ import annotations

from jaxplan.flow import Plan
from jaxplan.stages import ParallelRollouts, SelectExperiences, StandardMetricsReporting
from jaxplan.workers import WorkerSet


def sample_only_plan(workers: WorkerSet, config=None) -> Plan:
    """Sample and report, no learning: the acting-throughput ceiling and a fixed-policy
    evaluator (RLlib's random-agent plan, bulk-synchronous)."""
    rollouts = ParallelRollouts(workers, mode="bulk_sync")
    rollouts = rollouts.for_each(SelectExperiences(workers.trainable_policies()))
    return StandardMetricsReporting(rollouts, workers, config)
