"""SelectExperiences: keep only the given policies' batches."""

from __future__ import annotations

from collections.abc import Sequence

from jaxplan.batch import MultiAgentBatch


class SelectExperiences:
    """`MultiAgentBatch -> MultiAgentBatch` with only `policy_ids` kept; `env_steps` unchanged.

    A plain function of the item (it touches no state), used with `Flow.for_each`.
    """

    def __init__(self, policy_ids: Sequence[str]):
        if isinstance(policy_ids, str):
            raise TypeError("SelectExperiences takes a sequence of policy ids, not one string")
        self.policy_ids = tuple(policy_ids)

    def __call__(self, batch: MultiAgentBatch) -> MultiAgentBatch:
        kept = {p: b for p, b in batch.policy_batches.items() if p in self.policy_ids}
        return batch.replace(policy_batches=kept)
