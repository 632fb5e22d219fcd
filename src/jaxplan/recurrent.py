"""Recurrent policies' sequences (RLlib's `rnn_sequencing`, with static shapes).

Acting, every env carries its recurrent state in `ActorState.policy_states` (fields
`state_in_i`, and `prev_actions` / `prev_rewards` if the model reads them), zeroed after every
episode end; each step's row stores the state it started from. A fragment of `T` steps is cut
into `T / max_seq_len` chunks of `L = max_seq_len` consecutive steps of one env (the config
makes `L` divide `T`, so there is no padding and no mask: every row is a real step). A chunk
is replayed from the state stored at its first step (RLlib's `state_in` of a sequence), and
inside the chunk the state is reset to zeros before the first step of a new episode (the step
after a `terminated | truncated` row). RLlib instead cuts sequences at episode boundaries (and
zero-pads them to `max_seq_len`); both replay exactly the states the actor had. They differ only
where backpropagation through time is truncated: here a chunk may hold the end of one episode
and the start of the next (the reset stops the state, hence the gradient, from crossing), and
a sequence may start mid-episode at a chunk boundary, where RLlib's would too.

Rows flow through the plan as rows (time-major, `MultiAgentBatch.time_steps` blocks of
`N` rows); `to_sequences` regroups them for the learner, which shuffles whole sequences.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxplan import batch as sb


def is_state_in(field: str) -> bool:
    return field.startswith("state_in_")


def episode_starts(done: jax.Array) -> jax.Array:
    """`done [L, *B]` (a step ended its episode) -> `[L, *B]` bool: the step starts a new
    episode inside the sequence (the previous step was done); False at `t = 0`, whose state
    is the stored one."""
    return jnp.concatenate([jnp.zeros_like(done[:1]), done[:-1]], axis=0)


def _done(batch: sb.SampleBatch) -> jax.Array:
    return batch[sb.TERMINATEDS] | batch[sb.TRUNCATEDS]


def to_sequences(rows: sb.SampleBatch, time_steps: int, max_seq_len: int) -> sb.SampleBatch:
    """Rows `[time_steps x N, ...]` (time-major blocks of `N` rows: a train batch in the
    one-device order) -> sequences `[(time_steps / L) x N, L, ...]`, sequence `c x N + n` being
    steps `c L .. c L + L - 1` of row-block column `n`; the `state_in_i` fields keep only
    each sequence's first step (`[S, ...]`, RLlib's `state_in`)."""
    length = max_seq_len
    if time_steps % length:
        raise ValueError(
            f"a batch of {time_steps} time steps cannot be cut into sequences of "
            f"max_seq_len={length}"
        )
    chunks = time_steps // length

    def cut(field, x):
        x = x.reshape(chunks, length, -1, *x.shape[1:])  # [C, L, N, ...]
        if is_state_in(field):
            return x[:, 0].reshape(-1, *x.shape[3:])
        return jnp.swapaxes(x, 1, 2).reshape(-1, length, *x.shape[3:])

    return {k: cut(k, v) for k, v in rows.items()}


def replay_sequences(net: Any, params: Any, seqs: sb.SampleBatch) -> tuple:
    """The learner's replay of sequences (`to_sequences`' layout) with `net` (a
    `RecurrentNet`): `(action_dist_inputs [S x L, D], values [S x L], rows)`, `rows` every
    field but `state_in_i` flattened to `[S x L, ...]` in the same order."""
    time_major = {
        k: (v[None] if is_state_in(k) else jnp.swapaxes(v, 0, 1)) for k, v in seqs.items()
    }
    inputs, values, _ = net.unroll(
        params, time_major[sb.OBS], time_major, episode_starts(_done(time_major))
    )

    def rows(x):  # [L, S, ...] -> [S x L, ...]
        x = jnp.swapaxes(x, 0, 1)
        return x.reshape(-1, *x.shape[2:])

    flat = {k: v.reshape(-1, *v.shape[2:]) for k, v in seqs.items() if not is_state_in(k)}
    return rows(inputs), rows(values), flat


def replay_fragment(net: Any, params: Any, traj: sb.SampleBatch, max_seq_len: int) -> tuple:
    """A time-major fragment `[T, *B]` replayed chunk by chunk as the learner will (each
    `max_seq_len` chunk from its stored start state): `(action_dist_inputs [T, *B, D],
    values [T, *B], next_values [T, *B])`, `next_values[t]` the value of `new_obs[t]` from
    the state after step `t` with `actions[t]` / `rewards[t]` as the previous action and
    reward (the bootstrap of a fragment cut or a truncated episode; unused after a terminal
    step)."""
    length = max_seq_len
    steps = traj[sb.OBS].shape[0]
    chunks = steps // length

    def chunked(x):  # [T, *B, ...] -> [L, C, *B, ...]
        return jnp.swapaxes(x.reshape(chunks, length, *x.shape[1:]), 0, 1)

    def unchunked(x):  # [L, C, *B, ...] -> [T, *B, ...]
        return jnp.swapaxes(x, 0, 1).reshape(steps, *x.shape[2:])

    state = {k: chunked(v) for k, v in traj.items() if k in _state_fields(traj)}
    inputs, values, carries = net.unroll(
        params, chunked(traj[sb.OBS]), state, episode_starts(chunked(_done(traj)))
    )
    after = {k.replace("state_out_", "state_in_"): unchunked(v) for k, v in carries.items()}
    if sb.PREV_ACTIONS in traj:
        after[sb.PREV_ACTIONS] = traj[sb.ACTIONS]
    if sb.PREV_REWARDS in traj:
        after[sb.PREV_REWARDS] = traj[sb.REWARDS]
    next_values = net.step(params, traj[sb.NEXT_OBS], after)[1]
    return unchunked(inputs), unchunked(values), next_values


def _state_fields(traj: sb.SampleBatch) -> tuple[str, ...]:
    return tuple(k for k in traj if is_state_in(k) or k in (sb.PREV_ACTIONS, sb.PREV_REWARDS))


def sequences_per_minibatch(sgd_minibatch_size: int, max_seq_len: int, num_sequences: int) -> int:
    """Whole sequences per minibatch: `ceil(sgd_minibatch_size / max_seq_len)` (RLlib adds
    sequences until the minibatch holds `sgd_minibatch_size` timesteps); all of them for
    `sgd_minibatch_size = 0`; `ValueError` if more than the batch holds."""
    if not sgd_minibatch_size:
        return num_sequences
    size = -(-sgd_minibatch_size // max_seq_len)
    if size > num_sequences:
        raise ValueError(
            f"sgd_minibatch_size ({sgd_minibatch_size}) needs {size} sequences of max_seq_len="
            f"{max_seq_len}; the train batch holds {num_sequences}"
        )
    return size
