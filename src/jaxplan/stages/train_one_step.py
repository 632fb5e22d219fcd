"""TrainOneStep: `num_sgd_iter` epochs of minibatch SGD per trainable policy."""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from jaxplan import batch as sb
from jaxplan import devices
from jaxplan.batch import LearnerInfo, MultiAgentBatch, SampleBatch, TrainOutput, batch_rows
from jaxplan.flow import Stage
from jaxplan.policy import Policy, PolicyState
from jaxplan.recurrent import sequences_per_minibatch, to_sequences
from jaxplan.shuffle import random_permutation
from jaxplan.workers import PlanState, WorkerSet


def minibatch_indices(
    key: jax.Array, num_rows: int, minibatch_size: int, *, shuffle: bool = True
) -> jax.Array:
    """`[num_rows // minibatch_size, minibatch_size]` distinct row indices for one epoch: a fresh
    permutation (`jaxplan.shuffle.random_permutation`; the identity without `shuffle`) cut
    into minibatches; the remainder rows of that permutation are skipped."""
    num_minibatches = num_rows // minibatch_size
    rows = random_permutation(key, num_rows) if shuffle else jnp.arange(num_rows)
    return rows[: num_minibatches * minibatch_size].reshape(num_minibatches, minibatch_size)


NONFINITE_STATS = (
    "policy_loss",
    "vf_loss",
    "entropy",
    "kl",
    "total_loss",
    "gradients",
    "params",
    "optimizer_state",
)
"""What a skipped update's `first_nonfinite_stat` code names (code `i + 1` names entry `i`):
the first non-finite loss term (when the total loss is not finite), the total loss, then the
gradients, the new params and the new optimizer state."""

PER_ROW = "per_row"
"""A loss's stats entry `{name: [minibatch rows, ...]}` of per-row values (DQN's `td_error`):
`sgd_epochs` passes it through (the last epoch's, in the batch's row order) instead of
averaging it, and `TrainOneStep` puts each entry in `learner_info[pid][name]`."""

NONFINITE_CODE = "first_nonfinite_stat"
"""The key of that code in `sgd_epochs`' stats and in `learner_info[pid]`."""


def all_finite(tree: Any) -> jax.Array:
    """bool scalar: every float leaf of `tree` is finite (True without float leaves).

    The leaves are checked as one concatenated vector: one fused loop instead of an
    `isfinite` and a reduction per leaf (a PPO minibatch step checks ~30 leaves)."""
    leaves = [
        jnp.ravel(x)
        for x in jax.tree.leaves(tree)
        if jnp.issubdtype(jnp.result_type(x), jnp.inexact)
    ]
    if not leaves:
        return jnp.bool_(True)
    dtype = jnp.result_type(*leaves)
    flat = jnp.concatenate([x.astype(dtype) for x in leaves]) if len(leaves) > 1 else leaves[0]
    return jnp.all(jnp.isfinite(flat))


def nonfinite_code(
    loss: jax.Array, stats: dict[str, jax.Array], grads: Any, new: PolicyState
) -> jax.Array:
    """int32 scalar: 0 if the minibatch update is finite (the loss, every gradient and the new
    params and optimizer state), else `1 + ` the index in `NONFINITE_STATS` of the first
    culprit. Loss terms missing from `stats` (another policy's loss) are not checked."""
    loss_bad = ~jnp.isfinite(loss)
    terms = [
        loss_bad & ~jnp.isfinite(stats[name]) if name in stats else jnp.bool_(False)
        for name in NONFINITE_STATS[:4]
    ]
    bad = jnp.stack(
        [*terms, loss_bad, ~all_finite(grads), ~all_finite(new.params), ~all_finite(new.opt_state)]
    )
    skip = loss_bad | jnp.any(bad[5:])
    return jnp.where(skip, jnp.argmax(bad).astype(jnp.int32) + 1, jnp.int32(0))


def flat_params(policy: Policy, pstate: PolicyState) -> tuple[PolicyState, Any, Any]:
    """`(pstate, loss, unflatten)` for the SGD epochs: for a policy whose `flat_params_sgd`
    is True (its optimizer state does not depend on how the params are split into arrays, e.g.
    an `optax.flatten` optimizer, and its `apply_gradients` does not look into them: the
    actor-critic policies but APPO's) and whose params share one float dtype,
    the params as one vector (`jax.flatten_util.ravel_pytree`), the loss taking that vector
    and the function that puts the tree back; otherwise all three unchanged.

    The same numbers (the optimizer already ran on the raveled vector), from fewer kernels:
    the update, the finiteness checks and the skip select of a minibatch step work on one
    array instead of one per parameter array. PPO's minibatch step at the peers' fixed work
    on the CPU: ~200 against ~230-250 us (benchmarks/README.md, "Issue 14, 6 December
    (later)")."""
    leaves = jax.tree.leaves(pstate.params)
    dtypes = {x.dtype for x in leaves}
    flat_ok = len(leaves) > 1 and len(dtypes) == 1 and jnp.issubdtype(dtypes.pop(), jnp.floating)
    if not (flat_ok and getattr(policy, "flat_params_sgd", False)):
        return pstate, policy.loss, lambda ps: ps
    flat, unravel = ravel_pytree(pstate.params)

    def loss(params, *args, **kwargs):
        return policy.loss(unravel(params), *args, **kwargs)

    return pstate.replace(params=flat), loss, lambda ps: ps.replace(params=unravel(ps.params))


def sgd_epochs(
    policy: Policy,
    pstate: PolicyState,
    batch: SampleBatch,
    key: jax.Array,
    *,
    num_sgd_iter: int,
    minibatch_size: int,
    shuffle: bool = True,
    axis_name: str | None = None,
) -> tuple[PolicyState, dict[str, jax.Array]]:
    """Runs the epochs; returns the new state and each statistic's mean over all minibatches
    of all epochs, plus `num_nonfinite_updates` (int32: minibatch updates not applied because
    the loss, the gradients or the new params / optimizer state were not finite) and
    `first_nonfinite_stat` (`NONFINITE_CODE`: int32 code of the first such minibatch's
    culprit, 0 if none; `NONFINITE_STATS[code - 1]` names it).

    A policy with `loss_takes_key = True` (a loss that samples, e.g. SAC's actions) gets
    `key=` a fresh key per minibatch (folded from the epoch's key; the same on every device).

    A loss whose stats hold a `PER_ROW` dict gets it back in `stats[PER_ROW]`: each value of
    the last epoch per row of `batch`, in `batch`'s row order (whatever the shuffling); NaN
    for rows that epoch skipped (the remainder of its permutation); with `axis_name` the
    devices' rows are gathered (not averaged), so every device gets the whole batch's.

    `batch` is the whole train batch. With `axis_name` (data-parallel inside `shard_map`, the
    same `batch`, `pstate` and `key` on every device) each device computes the loss on its
    `1/N` slice of every minibatch, and the gradients and statistics are averaged across the
    devices before the one optimizer step: the same update as one device, up to float
    rounding.
    """
    num_rows = batch_rows(batch)
    on_axis = {} if axis_name is None else {"axis_name": axis_name}
    takes_key = getattr(policy, "loss_takes_key", False)
    pstate, loss_fn, unflatten = flat_params(policy, pstate)

    def minibatch_step(ps, mb):
        kw = on_axis
        if takes_key:  # a loss that samples (SAC): its own key per minibatch
            mb, loss_key = mb
            kw = {**on_axis, "key": loss_key}
        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            devices.varying(ps.params, axis_name), ps.hparams, ps.kl_coeff, mb, **kw
        )  # this device's gradient (see `devices.varying`), averaged next
        per_row = stats.pop(PER_ROW, None)  # this device's rows: gathered, not averaged
        loss, grads, stats = devices.mean((loss, grads, stats), axis_name)
        if per_row is not None:  # the whole minibatch's rows, in its order
            stats[PER_ROW] = devices.gather(per_row, axis_name)
        new = policy.apply_gradients(ps, grads)
        code = nonfinite_code(loss, stats, grads, new)
        # a non-finite update is not applied: this minibatch keeps the old state (a select;
        # bitwise the update itself when everything is finite)
        return jax.tree.map(lambda n, o: jnp.where(code == 0, n, o), new, ps), (stats, code)

    def epoch(ps, k):
        # one gather per epoch into [num_minibatches, minibatch_size, ...], then the scan
        # slices it: cheaper than a gather per minibatch, notably under vmap over seeds
        idx = minibatch_indices(k, num_rows, minibatch_size, shuffle=shuffle)
        idx = devices.local_slice(idx, axis_name, axis=1)  # this device's part of each one
        minibatches = jax.tree.map(lambda x: x[idx], batch)
        if takes_key:
            loss_keys = jax.random.split(jax.random.fold_in(k, 1), idx.shape[0])
            minibatches = (minibatches, loss_keys)
        return jax.lax.scan(minibatch_step, ps, minibatches)

    epoch_keys = jax.random.split(key, num_sgd_iter)
    pstate, (stats, codes) = jax.lax.scan(epoch, pstate, epoch_keys)
    pstate = unflatten(pstate)
    per_row = stats.pop(PER_ROW, None)
    stats = jax.tree.map(jnp.mean, stats)
    if per_row is not None:
        # the last epoch's values, scattered back to the rows its (distinct) indices name
        idx = minibatch_indices(epoch_keys[-1], num_rows, minibatch_size, shuffle=shuffle)
        idx = idx.reshape(-1)

        def unshuffle(x):
            last = x[-1].reshape(idx.shape[0], *x.shape[3:])
            out = jnp.full((num_rows, *x.shape[3:]), jnp.nan, last.dtype)
            return out.at[idx].set(last)

        stats[PER_ROW] = jax.tree.map(unshuffle, per_row)
    skipped = codes.reshape(-1) > 0
    stats["num_nonfinite_updates"] = jnp.sum(skipped.astype(jnp.int32))
    stats[NONFINITE_CODE] = codes.reshape(-1)[jnp.argmax(skipped)]  # 0 if none
    return pstate, stats


class TrainOneStep(Stage):
    """`MultiAgentBatch -> TrainOutput(batch, learner_info)`: per policy in the batch,
    `num_sgd_iter` epochs of minibatch SGD; `learner_info[pid]["learner_stats"]` holds the
    loss statistics averaged over every minibatch of every epoch (plus the policy lag).

    `sgd_minibatch_size=0` trains on the whole batch as one minibatch (RLlib's simple path).
    On a mesh a rollout batch arrives split across the devices and is gathered first, its
    rows in the one-device order (`MultiAgentBatch.time_steps`), so each minibatch holds the
    rows it would hold on one device (a batch without `shard_axis`, e.g. a replayed one, is
    already whole on every device). Without `data_parallel` every device computes the whole update
    (RLlib's `simple_optimizer`: rollouts spread out, SGD on one learner); with it
    (`MultiGPUTrainOneStep`) every minibatch is split `N` ways, each device computes the
    gradient of its slice, and gradients and statistics are averaged across devices (and
    hosts) before one optimizer step on the replicated params: the update one device would
    compute, up to float rounding.

    A minibatch update whose loss, gradients or new params / optimizer state are not finite
    is not applied (the policy keeps its state for that minibatch); `learner_stats` count
    them (`learner_stats.num_nonfinite_updates`; `learner_info[pid]["first_nonfinite_stat"]`
    names the first culprit: see `sgd_epochs`), and `learner_info[pid]
    ["num_nonfinite_rewards"]` counts the batch's NaN/inf rewards.
    """

    def __init__(
        self,
        workers: WorkerSet,
        *,
        num_sgd_iter: int = 1,
        sgd_minibatch_size: int = 0,
        shuffle_sequences: bool = True,
        data_parallel: bool = False,
    ):
        if num_sgd_iter < 1:
            raise ValueError(f"num_sgd_iter must be >= 1, got {num_sgd_iter}")
        if sgd_minibatch_size < 0:
            raise ValueError(f"sgd_minibatch_size must be >= 0, got {sgd_minibatch_size}")
        n = workers.num_shards
        if data_parallel and sgd_minibatch_size % n:  # the whole batch (0) always splits
            raise ValueError(
                f"sgd_minibatch_size ({sgd_minibatch_size}) does not split evenly across {n} "
                f"devices; use a multiple of {n}"
            )
        self.workers = workers
        self.num_sgd_iter = num_sgd_iter
        self.sgd_minibatch_size = sgd_minibatch_size
        self.shuffle_sequences = shuffle_sequences
        self.data_parallel = data_parallel
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

    def _sequences_per_minibatch(self, num_sequences: int, seq_len: int) -> int:
        """A recurrent policy's minibatch in whole sequences (`sgd_minibatch_size` counts
        timesteps, as RLlib's); with `data_parallel` they must split evenly across devices."""
        size = sequences_per_minibatch(self.sgd_minibatch_size, seq_len, num_sequences)
        n = self.workers.num_shards
        if self.data_parallel and size % n:
            raise ValueError(
                f"sgd_minibatch_size ({self.sgd_minibatch_size}) makes minibatches of {size} "
                f"sequences of max_seq_len={seq_len}, which do not split evenly across {n} "
                f"devices; use sgd_minibatch_size={-(-size // n) * n * seq_len}"
            )
        if num_sequences % size and (num_sequences, -size) not in self._warned:
            self._warned.add((num_sequences, -size))
            warnings.warn(
                f"train batch of {num_sequences} sequences is not a multiple of {size} "
                f"sequences per minibatch: each epoch skips the last {num_sequences % size} "
                "sequences of its permutation",
                stacklevel=2,
            )
        return size

    def apply(self, state: PlanState, stage_state: None, batch: MultiAgentBatch):
        key, k_sgd = jax.random.split(state.key)
        policies = dict(state.policies)
        learner_info = {}
        axis = self.workers.axis_name if self.data_parallel else None
        for (pid, pb), k in zip(
            batch.policy_batches.items(),
            jax.random.split(k_sgd, len(batch.policy_batches)),
            strict=True,
        ):
            # the whole train batch on every device, rows in the one-device order (time-major
            # over all actor groups): minibatches cut from the same permutation hold the same
            # rows on any number of devices
            pb = devices.gather_rows(pb, batch.shard_axis, batch.time_steps)
            policy = self.workers.policies[pid]
            seq_len = getattr(policy, "max_seq_len", None)
            if seq_len:  # recurrent: whole sequences are the units shuffled into minibatches
                units = to_sequences(pb, batch.time_steps, seq_len)
                minibatch_size = self._sequences_per_minibatch(batch_rows(units), seq_len)
            else:
                units, minibatch_size = pb, self._minibatch_size(batch_rows(pb))
            policies[pid], stats = sgd_epochs(
                policy,
                policies[pid],
                units,
                k,
                num_sgd_iter=self.num_sgd_iter,
                minibatch_size=minibatch_size,
                shuffle=self.shuffle_sequences,
                axis_name=axis,
            )
            # the culprit's code stays out of learner_stats (numbers, RLlib's): named on the host
            info = {"learner_stats": stats, "first_nonfinite_stat": stats.pop(NONFINITE_CODE)}
            info.update(stats.pop(PER_ROW, {}))  # per-row outputs (DQN's td_error), RLlib's place
            if sb.REWARDS in pb:  # rows of the train batch whose sampled reward is NaN or inf
                bad_rewards = ~jnp.isfinite(pb[sb.REWARDS])
                info["num_nonfinite_rewards"] = jnp.sum(bad_rewards.astype(jnp.int32))
            if sb.POLICY_VERSION in pb:  # train steps between the acting and the trained params
                lag = policies[pid].version - pb[sb.POLICY_VERSION]
                info["policy_lag_mean"] = jnp.mean(lag.astype(jnp.float32))
                info["policy_lag_max"] = jnp.max(lag)
            learner_info[pid] = info
            policies[pid] = policies[pid].replace(version=policies[pid].version + 1)
        counters = state.counters
        state = state.replace(
            policies=policies,
            counters=counters.replace(
                num_steps_trained=counters.num_steps_trained.add(batch.env_steps),
                num_agent_steps_trained=counters.num_agent_steps_trained.add(batch.agent_steps()),
            ),
            key=key,
        )
        return state, stage_state, TrainOutput(batch, LearnerInfo(learner_info))


def MultiGPUTrainOneStep(  # noqa: N802 - RLlib's name
    workers: WorkerSet,
    *,
    sgd_minibatch_size: int = 0,
    num_sgd_iter: int = 1,
    num_gpus: int | None = None,
    shuffle_sequences: bool = True,
    _fake_gpus: bool = False,
) -> TrainOneStep:
    """RLlib's data-parallel `TrainOneStep` (`data_parallel=True`; without a mesh it is
    `TrainOneStep`). The devices are the WorkerSet's mesh (`build_workers` makes it from
    `num_devices`/`num_gpus` and `_fake_gpus`); RLlib's `num_gpus` and `_fake_gpus` are
    checked against it."""
    mesh = workers.mesh
    mesh_size = 0 if mesh is None else mesh.size
    if num_gpus not in (None, -1) and max(num_gpus, 1) != max(mesh_size, 1):
        raise ValueError(
            f"MultiGPUTrainOneStep(num_gpus={num_gpus}) but the WorkerSet's mesh has "
            f"{mesh_size or 'no'} device(s); build the workers with num_devices={num_gpus}"
        )
    if _fake_gpus and mesh is not None and mesh.devices.flat[0].platform != "cpu":
        raise ValueError(
            "MultiGPUTrainOneStep(_fake_gpus=True) but the WorkerSet's mesh is of "
            f"{mesh.devices.flat[0].platform} devices; build the workers with _fake_gpus=True"
        )
    return TrainOneStep(
        workers,
        num_sgd_iter=num_sgd_iter,
        sgd_minibatch_size=sgd_minibatch_size,
        shuffle_sequences=shuffle_sequences,
        data_parallel=True,
    )
