"""TrainOneStep: `num_sgd_iter` epochs of minibatch SGD per trainable policy."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp

from jaxplan.batch import MultiAgentBatch, SampleBatch, batch_rows
from jaxplan.flow import Stage
from jaxplan.policy import Policy, PolicyState
from jaxplan.workers import PlanState, WorkerSet


def minibatch_indices(
    key: jax.Array, num_rows: int, minibatch_size: int, shuffle: bool = True
) -> jax.Array:
    """`[num_rows // minibatch_size, minibatch_size]` distinct row indices for one epoch: a fresh
    permutation (or the identity without `shuffle`) cut into minibatches; the remainder rows of
    that permutation are skipped."""
    num_minibatches = num_rows // minibatch_size
    rows = jax.random.permutation(key, num_rows) if shuffle else jnp.arange(num_rows)
    return rows[: num_minibatches * minibatch_size].reshape(num_minibatches, minibatch_size)


def sgd_epochs(
    policy: Policy,
    pstate: PolicyState,
    batch: SampleBatch,
    key: jax.Array,
    num_sgd_iter: int,
    minibatch_size: int,
    shuffle: bool,
) -> tuple[PolicyState, dict[str, jax.Array]]:
    """Runs the epochs; returns the new state and each statistic's mean over all minibatches
    of all epochs."""
    num_rows = batch_rows(batch)

    def minibatch_step(ps, mb):
        grads, stats = jax.grad(policy.loss, has_aux=True)(ps.params, ps.hparams, ps.kl_coeff, mb)
        return policy.apply_gradients(ps, grads), stats

    def epoch(ps, k):
        # one gather per epoch into [num_minibatches, minibatch_size, ...], then the scan
        # slices it: cheaper than a gather per minibatch, notably under vmap over seeds
        idx = minibatch_indices(k, num_rows, minibatch_size, shuffle)
        return jax.lax.scan(minibatch_step, ps, jax.tree.map(lambda x: x[idx], batch))

    pstate, stats = jax.lax.scan(epoch, pstate, jax.random.split(key, num_sgd_iter))
    return pstate, jax.tree.map(jnp.mean, stats)


class TrainOneStep(Stage):
    """`MultiAgentBatch -> (batch, learner_info)` where `learner_info[pid]["learner_stats"]`
    holds the loss statistics averaged over every minibatch of every epoch.

    `sgd_minibatch_size=0` trains on the whole batch as one minibatch (RLlib's simple path).
    """

    def __init__(
        self,
        workers: WorkerSet,
        num_sgd_iter: int = 1,
        sgd_minibatch_size: int = 0,
        shuffle_sequences: bool = True,
    ):
        if num_sgd_iter < 1:
            raise ValueError(f"num_sgd_iter must be >= 1, got {num_sgd_iter}")
        if sgd_minibatch_size < 0:
            raise ValueError(f"sgd_minibatch_size must be >= 0, got {sgd_minibatch_size}")
        self.workers = workers
        self.num_sgd_iter = num_sgd_iter
        self.sgd_minibatch_size = sgd_minibatch_size
        self.shuffle_sequences = shuffle_sequences
        self._warned: set[tuple[int, int]] = set()

    def _minibatch_size(self, num_rows: int) -> int:
        size = self.sgd_minibatch_size or num_rows
        if size > num_rows:
            raise ValueError(
                f"sgd_minibatch_size ({size}) is larger than the train batch ({num_rows} rows)"
            )
        if num_rows % size and (num_rows, size) not in self._warned:
            self._warned.add((num_rows, size))
            warnings.warn(
                f"train batch of {num_rows} rows is not a multiple of sgd_minibatch_size {size}: "
                f"each epoch skips the last {num_rows % size} rows of its permutation",
                stacklevel=2,
            )
        return size

    def __call__(self, state: PlanState, batch: MultiAgentBatch):
        key, k_sgd = jax.random.split(state.key)
        policies = dict(state.policies)
        learner_info = {}
        for (pid, pb), k in zip(
            batch.policy_batches.items(),
            jax.random.split(k_sgd, len(batch.policy_batches)),
            strict=True,
        ):
            size = self._minibatch_size(batch_rows(pb))
            policies[pid], stats = sgd_epochs(
                self.workers.policies[pid],
                policies[pid],
                pb,
                k,
                self.num_sgd_iter,
                size,
                self.shuffle_sequences,
            )
            learner_info[pid] = {"learner_stats": stats}
        counters = state.counters
        state = state.replace(
            policies=policies,
            counters=counters.replace(
                num_steps_trained=counters.num_steps_trained.add(batch.env_steps),
                num_agent_steps_trained=counters.num_agent_steps_trained.add(batch.agent_steps()),
            ),
            key=key,
        )
        return state, (batch, learner_info)
