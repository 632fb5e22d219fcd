"""Stages of DESIGN.md section 2 on real plans and fabricated items, against python references.

One small PPO plan on CartPole-v1 is built per module (compiling plans dominates the runtime).
References are plain Python/float64 and call no jaxplan code. Tolerances are float32 ones.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import TINY_PPO

import jaxplan
from jaxplan.batch import DEFAULT_POLICY_ID, MultiAgentBatch
from jaxplan.models import ActorCritic
from jaxplan.policy import PolicyState
from jaxplan.stages import ConcatBatches, ParallelRollouts, SelectExperiences, StandardizeFields
from jaxplan.stages.metrics import episode_stats
from jaxplan.stages.train_one_step import minibatch_indices, sgd_epochs
from jaxplan.stages.update_kl import UpdateKL
from jaxplan.workers import EpisodeWindow

PID = DEFAULT_POLICY_ID

# Compiled once per module (one compilation instead of one per eager op).
_record = jax.jit(EpisodeWindow.record)
_episode_stats = jax.jit(episode_stats)
_epoch_indices = jax.jit(
    lambda keys, rows, mb: jax.vmap(lambda k: minibatch_indices(k, rows, mb, shuffle=True))(keys),
    static_argnums=(1, 2),
)

# num_workers x num_envs_per_worker x rollout_fragment_length = 1 x 2 x 8 = 16 = round size R;
# train_batch_size B = 40 -> ceil(40 / 16) = 3 rounds = 48 rows.
SMALL = {
    "num_workers": 1,
    "num_envs_per_worker": 2,
    "rollout_fragment_length": 8,
    "train_batch_size": 40,
    "sgd_minibatch_size": 8,
    "num_sgd_iter": 2,
    "kl_coeff": 0.2,
    "model": {"fcnet_hiddens": [8]},
    # short time limit: the 24 steps per env include truncated episodes (and, with a random
    # policy, usually a terminated one)
    "env_config": {"max_steps_in_episode": 12},
}
ROUND = 1 * 2 * 8


def train_batch_reference(min_batch_size, round_size):
    """RLlib's ConcatBatches: buffer whole rounds until the count reaches the minimum."""
    total = 0
    while total < min_batch_size:
        total += round_size
    return total


def kl_rule_reference(coeff, kl, target):
    if kl > 2.0 * target:
        return coeff * 1.5
    if kl < 0.5 * target:
        return coeff * 0.5
    return coeff  # the band, and NaN


@pytest.fixture(scope="module")
def plan():
    return jaxplan.ppo_plan(SMALL, env="CartPole-v1")


@pytest.fixture(scope="module")
def state0(plan):
    return jax.jit(plan.init)(jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def stepped(plan, state0):
    state, result = jax.jit(plan.step)(state0)
    return state, plan.report(result)


# ---------------------------------------------------------------------------------------------
# ConcatBatches end to end
# ---------------------------------------------------------------------------------------------


def test_plan_train_batch_is_smallest_multiple_of_round(plan, stepped):
    _, report = stepped
    assert plan.workers.round_env_steps == ROUND
    expected = train_batch_reference(SMALL["train_batch_size"], ROUND)
    assert expected == 48
    info = report["info"]
    assert info["num_steps_trained"] == expected
    assert info["num_agent_steps_trained"] == expected
    assert info["num_steps_sampled"] == expected
    assert report["timesteps_total"] == expected
    assert report["training_iteration"] == 1


def test_plan_sgd_ran_on_the_whole_train_batch(stepped):
    """The optimizer took num_sgd_iter * (48 // 8) = 12 steps: the batch SGD saw had 48 rows
    (40 rows would give 10)."""
    state, _ = stepped
    adam = [
        x
        for x in jax.tree.leaves(
            state.policies[PID].opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState)
        )
        if isinstance(x, optax.ScaleByAdamState)
    ]
    counts = [int(x.count) for x in adam]
    rows = train_batch_reference(SMALL["train_batch_size"], ROUND)
    assert counts == [SMALL["num_sgd_iter"] * (rows // SMALL["sgd_minibatch_size"])]


@pytest.fixture(scope="module")
def concat_batch(plan, state0):
    """The PPO plan's flow up to ConcatBatches: three postprocessed rounds, 48 rows."""
    workers = plan.workers
    flow = ParallelRollouts(workers, mode="bulk_sync")
    flow = flow.for_each(SelectExperiences(workers.trainable_policies()))
    flow = flow.combine(ConcatBatches(min_batch_size=SMALL["train_batch_size"]))
    state, batch = jax.jit(flow.pull)(state0)
    return state, batch


def test_concat_batches_rows_and_counters(concat_batch):
    state, batch = concat_batch
    expected = train_batch_reference(SMALL["train_batch_size"], ROUND)
    assert batch.env_steps == expected
    assert list(batch.policy_batches) == [PID]
    for name, field in batch.policy_batches[PID].items():
        assert field.shape[0] == expected, name
    assert jaxplan.counters.counter_value(state.counters.num_steps_sampled) == expected


def _rounds(x):
    """[rounds * T * groups * envs, ...] -> [rounds, T, groups * envs, ...] (time-major rows)."""
    x = np.asarray(x)
    return x.reshape(3, SMALL["rollout_fragment_length"], 2, *x.shape[1:])


def test_concat_batches_rounds_are_consecutive_fragments(concat_batch):
    """Each round continues where the previous one stopped: the last step's reached
    observation (the fragment-cut bootstrap) is the next round's first observation."""
    _, batch = concat_batch
    pb = batch.policy_batches[PID]
    obs, new_obs = _rounds(pb["obs"]), _rounds(pb["new_obs"])
    done = _rounds(pb["terminateds"]) | _rounds(pb["truncateds"])
    num_rounds, num_steps, num_envs = done.shape
    checked = 0
    for r in range(num_rounds):
        for t in range(num_steps):
            nxt = (r, t + 1) if t + 1 < num_steps else (r + 1, 0)
            if nxt[0] == num_rounds:
                continue
            for e in range(num_envs):
                if not done[r, t, e]:
                    # equal up to float32 rounding (gymnax computes final_observation
                    # separately; ~1 ulp differences occur): rtol 1e-5, atol 1e-6
                    np.testing.assert_allclose(
                        new_obs[r, t, e], obs[nxt[0], nxt[1], e], rtol=1e-5, atol=1e-6
                    )
                    checked += 1
    assert checked > 30
    # rounds are distinct samples, not one round repeated
    assert not np.array_equal(obs[0], obs[1])


def test_concat_batch_contains_truncations(concat_batch):
    """The 12-step time limit truncates (not terminates) episodes; after a truncated step the
    env was reset, so new_obs (the final observation) differs from the next row's obs."""
    _, batch = concat_batch
    pb = batch.policy_batches[PID]
    term, trunc = _rounds(pb["terminateds"]), _rounds(pb["truncateds"])
    assert trunc.any()
    assert not (term & trunc).any()
    obs, new_obs = _rounds(pb["obs"]), _rounds(pb["new_obs"])
    for r, t, e in zip(*np.nonzero(trunc), strict=True):
        nxt = (r, t + 1) if t + 1 < trunc.shape[1] else (r + 1, 0)
        if nxt[0] < trunc.shape[0]:
            assert np.max(np.abs(new_obs[r, t, e] - obs[nxt[0], nxt[1], e])) > 1e-3


def test_concat_batch_gae_matches_reference(plan, concat_batch):
    """Advantages of every round equal a float64 GAE over that round's fragment, with
    next_values = V(new_obs) (V(final_obs) after truncation, V(next obs) at the fragment cut)."""
    state, batch = concat_batch
    pb = batch.policy_batches[PID]
    ps = state.policies[PID]
    model = plan.workers.policies[PID].model
    # values under the params that acted (SGD has not run in this flow)
    next_values = _rounds(model.apply(ps.params, pb["new_obs"], method=ActorCritic.value))
    vf_preds = _rounds(pb["vf_preds"])
    np.testing.assert_allclose(
        vf_preds,
        _rounds(model.apply(ps.params, pb["obs"], method=ActorCritic.value)),
        rtol=1e-5,
        atol=1e-5,
    )
    rewards = _rounds(pb["rewards"]).astype(np.float64)
    term, trunc = _rounds(pb["terminateds"]), _rounds(pb["truncateds"])
    gamma, lam = float(ps.hparams.gamma), float(ps.hparams.lambda_)
    ref = np.zeros(rewards.shape)
    for r in range(rewards.shape[0]):
        for e in range(rewards.shape[2]):
            following = 0.0
            for t in reversed(range(rewards.shape[1])):
                boot = 0.0 if term[r, t, e] else gamma * float(next_values[r, t, e])
                delta = rewards[r, t, e] + boot - float(vf_preds[r, t, e])
                ended = term[r, t, e] or trunc[r, t, e]
                ref[r, t, e] = delta if ended else delta + gamma * lam * following
                following = ref[r, t, e]
    # float32 network outputs summed over <= 8 steps: rtol 1e-5, atol 1e-4
    np.testing.assert_allclose(_rounds(pb["advantages"]), ref, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(_rounds(pb["value_targets"]), ref + vf_preds, rtol=1e-5, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# StandardizeFields
# ---------------------------------------------------------------------------------------------


def standardize_reference(x):
    x = np.asarray(x, np.float64).ravel()
    mean = x.sum() / x.size
    std = np.sqrt(((x - mean) ** 2).sum() / x.size)  # population std
    return (x - mean) / max(1e-4, std)


def test_standardize_fields_stage():
    rng = np.random.default_rng(0)
    a = rng.normal(5.0, 3.0, 48).astype(np.float32)
    b = rng.normal(-2.0, 0.5, 20).astype(np.float32)
    other = rng.normal(size=48).astype(np.float32)
    batch = MultiAgentBatch(
        {
            "p0": {"advantages": jnp.asarray(a), "other": jnp.asarray(other)},
            "p1": {"advantages": jnp.asarray(b)},
        },
        env_steps=48,
    )
    out = jax.jit(StandardizeFields(["advantages"]))(batch)
    assert out.env_steps == 48
    # statistics are per policy, over that policy's whole batch
    np.testing.assert_allclose(
        np.asarray(out.policy_batches["p0"]["advantages"]),
        standardize_reference(a),
        rtol=1e-5,
        atol=1e-5,
    )
    np.testing.assert_allclose(
        np.asarray(out.policy_batches["p1"]["advantages"]),
        standardize_reference(b),
        rtol=1e-5,
        atol=1e-5,
    )
    # other fields are untouched
    np.testing.assert_array_equal(np.asarray(out.policy_batches["p0"]["other"]), other)


def test_standardize_fields_constant_and_tiny_std():
    batch = MultiAgentBatch(
        {
            "p0": {"advantages": jnp.full((16,), 0.5, jnp.float32)},
            "p1": {"advantages": jnp.asarray([0.0, 2e-6] * 8, jnp.float32)},
        },
        env_steps=16,
    )
    out = jax.jit(StandardizeFields(["advantages"]))(batch)
    np.testing.assert_array_equal(np.asarray(out.policy_batches["p0"]["advantages"]), 0.0)
    # std = 1e-6 < 1e-4 floor: (x - 1e-6) / 1e-4 = +-0.01 (not +-1)
    np.testing.assert_allclose(
        np.asarray(out.policy_batches["p1"]["advantages"]),
        [-0.01, 0.01] * 8,
        rtol=1e-3,
    )


def test_standardize_fields_missing_field_is_key_error():
    batch = MultiAgentBatch({PID: {"rewards": jnp.zeros(4)}}, env_steps=4)
    with pytest.raises(KeyError, match="advantages"):
        StandardizeFields(["advantages"])(batch)
    with pytest.raises(TypeError):
        StandardizeFields("advantages")


def test_standardize_fields_over_the_concatenated_batch(concat_batch):
    """On a real train batch, advantages are standardized once over all 48 rows (not per
    rollout round)."""
    _, batch = concat_batch
    raw = np.asarray(batch.policy_batches[PID]["advantages"])
    out = jax.jit(StandardizeFields(["advantages"]))(batch)
    np.testing.assert_allclose(
        np.asarray(out.policy_batches[PID]["advantages"]),
        standardize_reference(raw),
        rtol=1e-5,
        atol=1e-5,
    )


# ---------------------------------------------------------------------------------------------
# UpdateKL
# ---------------------------------------------------------------------------------------------


def test_update_kl_stage_sequence(plan, state0):
    stage = UpdateKL()
    ps0 = state0.policies[PID]
    assert float(ps0.kl_coeff) == pytest.approx(0.2)
    target = float(ps0.hparams.kl_target)
    assert target == pytest.approx(0.01)
    # 0.2 -> 0.3 -> 0.45 -> 0.225 -> (band) -> (NaN) -> 0.1125 -> 0.16875 -> (edge 2*target)
    kls = [0.05, 0.05, 0.001, 0.01, float("nan"), 0.0, 1.0, 0.02, 0.005]
    state = state0
    coeff = float(np.float32(0.2))
    seen = []
    for kl in kls:
        info = {PID: {"learner_stats": {"kl": jnp.float32(kl)}}}
        state, own, out = stage.apply(state, None, info)
        assert out is info and own is None
        coeff = kl_rule_reference(coeff, float(np.float32(kl)), target)
        seen.append(float(state.policies[PID].kl_coeff))
        np.testing.assert_allclose(seen[-1], coeff, rtol=1e-6)
    np.testing.assert_allclose(
        seen, [0.3, 0.45, 0.225, 0.225, 0.225, 0.1125, 0.16875, 0.16875, 0.16875], rtol=1e-6
    )
    # nothing else in the state moved
    for a, b in zip(
        jax.tree.leaves(state0.policies[PID].params),
        jax.tree.leaves(state.policies[PID].params),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(state.key), np.asarray(state0.key))


def test_update_kl_uses_the_states_kl_target(plan, state0):
    ps = state0.policies[PID]
    ps = ps.replace(hparams=ps.hparams.replace(kl_target=jnp.float32(0.1)))
    state = state0.replace(policies={**state0.policies, PID: ps})
    stage = jax.jit(lambda s, info: UpdateKL().apply(s, None, info)[0])
    info = {PID: {"learner_stats": {"kl": jnp.float32(0.05)}}}
    # 0.05 is in [0.05, 0.2] for target 0.1 (it would be x1.5 for the default 0.01)
    state = stage(state, info)
    assert float(state.policies[PID].kl_coeff) == pytest.approx(0.2)
    info = {PID: {"learner_stats": {"kl": jnp.float32(0.3)}}}
    state = stage(state, info)
    assert float(state.policies[PID].kl_coeff) == pytest.approx(0.3)


def test_plan_step_applies_kl_rule_to_reported_kl(state0, stepped):
    state, report = stepped
    stats = report["info"]["learner"][PID]["learner_stats"]
    assert stats["cur_kl_coeff"] == pytest.approx(0.2)  # the value used during SGD
    expected = kl_rule_reference(
        float(np.float32(0.2)), stats["kl"], float(state0.policies[PID].hparams.kl_target)
    )
    np.testing.assert_allclose(float(state.policies[PID].kl_coeff), expected, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# Minibatches
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_rows,mb", [(43, 8), (48, 48), (10, 3)])
def test_minibatch_indices_distinct_per_epoch(num_rows, mb):
    keys = jax.random.split(jax.random.PRNGKey(1), 4)
    epochs = list(np.asarray(_epoch_indices(keys, num_rows, mb)))
    num_mb = num_rows // mb
    for idx in epochs:
        assert idx.shape == (num_mb, mb)
        flat = idx.ravel().tolist()
        assert len(set(flat)) == num_mb * mb  # every row at most once per epoch
        assert all(0 <= i < num_rows for i in flat)
    if num_mb * mb > 1:
        # different epoch keys give different permutations
        orders = {tuple(idx.ravel().tolist()) for idx in epochs}
        assert len(orders) == len(epochs)
        assert any(idx.ravel().tolist() != list(range(num_mb * mb)) for idx in epochs)


def test_minibatch_indices_without_shuffle_is_identity():
    idx = np.asarray(minibatch_indices(jax.random.PRNGKey(0), 43, 8, shuffle=False))
    np.testing.assert_array_equal(idx, np.arange(40).reshape(5, 8))


class _RecordingPolicy:
    """A fake policy whose 'gradient step' records which rows each minibatch held.

    params["w"][e, row] accumulates (j + 1) when minibatch j of epoch e holds `row`;
    params["t"] counts minibatch steps.
    """

    def __init__(self, num_minibatches):
        self.num_minibatches = num_minibatches

    def loss(self, params, hparams, kl_coeff, batch):
        t = jax.lax.stop_gradient(params["t"]).astype(jnp.int32)
        epoch, j = t // self.num_minibatches, t % self.num_minibatches
        value = jnp.sum(params["w"][epoch, batch["row"]]) * (j + 1).astype(jnp.float32)
        return value, {"step": t.astype(jnp.float32), "rows": jnp.float32(batch["row"].shape[0])}

    def apply_gradients(self, state, grads):
        params = {"w": state.params["w"] + grads["w"], "t": state.params["t"] + 1.0}
        return state.replace(params=params)


@pytest.mark.parametrize("num_rows,mb,shuffle", [(43, 8, True), (43, 8, False)])
def test_sgd_epochs_cover_distinct_rows(num_rows, mb, shuffle):
    epochs = 3
    num_mb = num_rows // mb
    policy = _RecordingPolicy(num_mb)
    pstate = PolicyState(
        params={"w": jnp.zeros((epochs, num_rows)), "t": jnp.float32(0)},
        opt_state=None,
        hparams=None,
        kl_coeff=jnp.float32(0),
        version=jnp.int32(0),
    )
    batch = {"row": jnp.arange(num_rows, dtype=jnp.int32)}
    run = jax.jit(
        sgd_epochs,
        static_argnums=0,
        static_argnames=("num_sgd_iter", "minibatch_size", "shuffle"),
    )
    pstate, stats = run(
        policy,
        pstate,
        batch,
        jax.random.PRNGKey(3),
        num_sgd_iter=epochs,
        minibatch_size=mb,
        shuffle=shuffle,
    )
    w = np.asarray(pstate.params["w"])
    assert float(pstate.params["t"]) == epochs * num_mb
    for e in range(epochs):
        counts = {v: int(np.sum(w[e] == v)) for v in range(num_mb + 1)}
        # each minibatch j holds mb distinct rows; the skipped remainder is never used
        for j in range(num_mb):
            assert counts[j + 1] == mb, (e, j, counts)
        assert counts[0] == num_rows - num_mb * mb
        assert sum(counts.values()) == num_rows  # no other values: no row twice in an epoch
        if not shuffle:
            np.testing.assert_array_equal(
                w[e, : num_mb * mb], np.repeat(np.arange(1, num_mb + 1), mb)
            )
    if shuffle:
        # each epoch reshuffles
        assert not np.array_equal(w[0], w[1]) and not np.array_equal(w[1], w[2])
    # statistics are means over all minibatches of all epochs
    np.testing.assert_allclose(float(stats["step"]), (epochs * num_mb - 1) / 2, rtol=1e-6)
    assert float(stats["rows"]) == mb


# ---------------------------------------------------------------------------------------------
# EpisodeWindow and episode_stats
# ---------------------------------------------------------------------------------------------


def _check_window(win, reference, window):
    n = len(reference)
    assert int(win.num_episodes) == n
    returns, lengths = np.asarray(win.returns), np.asarray(win.lengths)
    if n < window:
        np.testing.assert_array_equal(returns[:n], [r for r, _ in reference])
        np.testing.assert_array_equal(lengths[:n], [ln for _, ln in reference])
        assert np.all(np.isnan(returns[n:])) and np.all(np.isnan(lengths[n:]))
    else:
        # ring buffer: the slot after the newest holds the oldest kept episode
        order = [(n + i) % window for i in range(window)]
        newest = reference[-window:]
        np.testing.assert_array_equal(returns[order], [r for r, _ in newest])
        np.testing.assert_array_equal(lengths[order], [ln for _, ln in newest])


def _stats_reference(reference, window):
    kept = reference[-window:]
    if not kept:
        return dict.fromkeys(
            ["episode_reward_mean", "episode_reward_min", "episode_reward_max", "episode_len_mean"],
            float("nan"),
        )
    rets = [float(r) for r, _ in kept]
    return {
        "episode_reward_mean": sum(rets) / len(rets),
        "episode_reward_min": min(rets),
        "episode_reward_max": max(rets),
        "episode_len_mean": sum(float(ln) for _, ln in kept) / len(kept),
    }


def test_episode_window_against_list_reference():
    window = 5
    rng = np.random.default_rng(4)
    shape = (4, 2, 3)  # [T, groups, envs], flattened row-major = chronological
    record, stats = _record, _episode_stats
    win = EpisodeWindow.empty(window)
    reference: list[tuple[float, int]] = []
    this_iter = 0

    def check():
        _check_window(win, reference, window)
        assert int(win.episodes_this_iter) == this_iter
        got, ref = stats(win), _stats_reference(reference, window)
        for k, v in ref.items():
            np.testing.assert_allclose(float(got[k]), v, rtol=1e-6, equal_nan=True, err_msg=k)

    check()  # NaN before any episode
    masks = [
        rng.uniform(size=shape) < 0.1,  # a few episodes
        np.zeros(shape, bool),  # none
        rng.uniform(size=shape) < 0.15,
        np.ones(shape, bool),  # 24 episodes at once: more than the window
        rng.uniform(size=shape) < 0.3,
        rng.uniform(size=shape) < 0.5,  # likely > window again
        np.eye(6, dtype=bool)[:4].reshape(shape),
    ]
    for done in masks:
        returns = rng.normal(10.0, 5.0, size=shape).astype(np.float32)
        lengths = rng.integers(1, 500, size=shape).astype(np.int32)
        win = record(win, jnp.asarray(done), jnp.asarray(returns), jnp.asarray(lengths))
        for idx in zip(*np.nonzero(done), strict=True):  # row-major order
            reference.append((returns[idx], int(lengths[idx])))
        this_iter += int(done.sum())
        check()
    assert len(reference) > 3 * window


def test_episode_window_first_episodes_in_order():
    win = EpisodeWindow.empty(4)
    done = jnp.asarray([[False, True], [True, True]])  # row-major: episodes at 1, 2, 3
    returns = jnp.asarray([[1.0, 2.0], [3.0, 4.0]])
    lengths = jnp.asarray([[10, 20], [30, 40]], jnp.int32)
    win = _record(win, done, returns, lengths)
    np.testing.assert_array_equal(np.asarray(win.returns)[:3], [2.0, 3.0, 4.0])
    np.testing.assert_array_equal(np.asarray(win.lengths)[:3], [20.0, 30.0, 40.0])
    assert np.isnan(np.asarray(win.returns)[3])
    stats = _episode_stats(win)
    assert float(stats["episode_reward_mean"]) == pytest.approx(3.0)
    assert float(stats["episode_reward_min"]) == 2.0
    assert float(stats["episode_reward_max"]) == 4.0
    assert float(stats["episode_len_mean"]) == pytest.approx(30.0)


def test_episode_stats_nan_before_any_episode():
    stats = _episode_stats(EpisodeWindow.empty(100))
    assert set(stats) == {
        "episode_reward_mean",
        "episode_reward_min",
        "episode_reward_max",
        "episode_len_mean",
    }
    for name, value in stats.items():
        assert np.isnan(float(value)), name


def test_sgd_carries_actor_critic_params_as_one_vector_and_gives_them_back():
    """`flat_params`: PPO's params travel through the epochs as one raveled vector (the loss
    sees the tree; tests/test_faults.py checks the update bitwise against the tree loop);
    APPO, whose `apply_gradients` reads the params' parts, and params of mixed dtypes keep
    the tree."""
    from jaxplan.stages.train_one_step import flat_params

    plan = jaxplan.ppo_plan(TINY_PPO, env="CartPole-v1")
    policy = plan.workers.policies[PID]
    ps = jax.jit(plan.init)(jax.random.PRNGKey(0)).policies[PID]
    flat, loss, unflatten = flat_params(policy, ps)
    leaves = jax.tree.leaves(ps.params)
    assert flat.params.shape == (sum(x.size for x in leaves),)
    back = unflatten(flat)
    assert jax.tree.structure(back.params) == jax.tree.structure(ps.params)
    for a, b in zip(jax.tree.leaves(back.params), leaves, strict=True):
        np.testing.assert_array_equal(a, b)
    assert loss is not policy.loss

    appo = jaxplan.algorithms.get_algorithm("appo")
    aplan = appo.plan({"model": {"fcnet_hiddens": [8]}}, env="CartPole-v1")
    apolicy = aplan.workers.policies[PID]
    aps = jax.jit(aplan.init)(jax.random.PRNGKey(0)).policies[PID]
    assert not apolicy.flat_params_sgd
    same, aloss, _ = flat_params(apolicy, aps)
    assert same is aps and aloss == apolicy.loss

    mixed = ps.replace(params={**ps.params, "count": jnp.zeros((), jnp.int32)})
    same, mloss, _ = flat_params(policy, mixed)
    assert same is mixed and mloss == policy.loss
