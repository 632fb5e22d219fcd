"""ConcatBatches: collect rollout rounds until the train batch holds `min_batch_size` steps."""

from __future__ import annotations

import math

import jax

from jaxplan.flow import Pull

COUNT_STEPS_BY = ("env_steps", "agent_steps")


def num_rounds(min_batch_size: int, round_size: int) -> int:
    """RLlib emits once the buffered count reaches the minimum: the train batch is the smallest
    multiple of the round size that is >= `min_batch_size`."""
    if round_size < 1:
        raise ValueError(f"a rollout round must hold at least one step, got {round_size}")
    return max(1, math.ceil(min_batch_size / round_size))


class ConcatBatches:
    """For `Flow.combine`: runs the upstream flow `ceil(min_batch_size / round_size)` times
    (a `lax.scan`, the count fixed at trace time) and concatenates the batches row-wise per
    policy.

    `count_steps_by="env_steps"` counts each round's `env_steps`; `"agent_steps"` counts the
    (selected) policies' rows.
    """

    def __init__(self, min_batch_size: int, count_steps_by: str = "env_steps"):
        if count_steps_by not in COUNT_STEPS_BY:
            raise ValueError(
                f"count_steps_by must be one of {COUNT_STEPS_BY}, got {count_steps_by!r}"
            )
        if min_batch_size < 1:
            raise ValueError(f"min_batch_size must be >= 1, got {min_batch_size}")
        self.min_batch_size = min_batch_size
        self.count_steps_by = count_steps_by

    def combine(self, upstream: Pull) -> Pull:
        def pull(state):
            _, shape = jax.eval_shape(upstream, state)
            size = shape.env_steps if self.count_steps_by == "env_steps" else shape.agent_steps()
            rounds = num_rounds(self.min_batch_size, size)
            if rounds == 1:
                return upstream(state)
            state, stacked = jax.lax.scan(lambda s, _: upstream(s), state, None, length=rounds)
            merged = jax.tree.map(
                lambda x: x.reshape(x.shape[0] * x.shape[1], *x.shape[2:]), stacked.policy_batches
            )
            return state, shape.replace(
                policy_batches=merged,
                env_steps=rounds * shape.env_steps,
                time_steps=rounds * shape.time_steps,  # each shard's rows: [rounds, T, ...]
            )

        return pull
