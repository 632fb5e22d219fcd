"""IMPALA: async actor groups + V-trace + RLlib's summed loss. The lag each batch carries,
config errors before compiling, the CLI, and learning."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

import jaxplan
from jaxplan import cli
from jaxplan.batch import DEFAULT_POLICY_ID as PID
from jaxplan.impala.config import IMPALAConfig
from jaxplan.impala.plan import impala_plan

SMALL = {
    "num_envs_per_worker": 2,
    "rollout_fragment_length": 8,
    "train_batch_size": 32,
    "model": {"fcnet_hiddens": [16, 16]},
}


@pytest.mark.parametrize(
    "groups,in_flight,batch,lag",
    [(1, 1, 16, 0.0), (1, 2, 16, 1.0), (2, 1, 16, 1.0), (1, 2, 32, 0.5)],
)
def test_batches_carry_the_designed_lag(groups, in_flight, batch, lag):
    """Rows carry the version of the params that acted (a round emits 16 steps here). With
    one round per update: 1 group with 1 request is on-policy, 2 requests in flight deliver
    params a round (= an update) late, 2 staggered groups emit a fragment begun a round
    earlier. With 2 rounds per update the late delivery costs an update for half the rows."""
    plan = impala_plan(
        {
            **SMALL,
            "num_workers": groups,
            "train_batch_size": batch,
            "max_sample_requests_in_flight_per_worker": in_flight,
        },
        env="CartPole-v1",
    )
    state = plan.init(jax.random.PRNGKey(0))
    step = jax.jit(plan.step)
    for _ in range(6):
        state, result = step(state)
    info = plan.report(result)["info"]["learner"][PID]
    assert info["policy_lag_mean"] == lag
    stats = info["learner_stats"]
    assert {"policy_loss", "vf_loss", "policy_entropy", "vf_explained_var"} <= set(stats)


def _broadcasts(groups, in_flight, interval, cycles, returns=1):
    """RLlib 1.x's `BroadcastUpdateLearnerWeights` on jaxplan's staggered groups, one round
    (one returned fragment) and one learner update per cycle. RLlib keeps the weights it
    last broadcast, counts the returned batches (one counter for all workers) and, once
    `interval` were returned since the last broadcast and the learner has updated since,
    broadcasts the current weights; every returning worker is sent the kept weights, which
    it takes after its other `in_flight - 1` requests. `returns`: fragments returned per
    round (one per device; the devices' groups run the same schedule). Returns per cycle the
    version each group acts with, the broadcasts so far and the emitted fragment's lag."""
    version, kept, since, broadcasts = 0, 0, 0, 0
    in_transit = [0] * (in_flight - 1)
    segments = list(range(groups))  # group j starts j segments into its fragment
    acting, out = [0] * groups, []
    for _ in range(cycles):
        if since >= interval and version != kept:  # the returned groups start again
            kept, since, broadcasts = version, 0, broadcasts + 1
        in_transit.append(kept)
        acting[segments.index(0)] = in_transit.pop(0)
        segments = [s + 1 for s in segments]
        done = segments.index(groups)
        lag = version - acting[done]
        segments[done], since = 0, since + returns
        version += 1  # the learner trains on that fragment
        out.append((list(acting), broadcasts, lag))
    return out


@pytest.mark.parametrize(
    "groups,in_flight,interval", [(1, 1, 3), (2, 2, 2), (3, 1, 4), (2, 1, 1), (1, 2, 1)]
)
def test_broadcast_interval_follows_rllib(groups, in_flight, interval):
    """Cycle by cycle against the model above: which params version every group acts with,
    RLlib's `num_weight_broadcasts` and the lag of the fragment each update trains on. With
    `broadcast_interval` 1 every update is broadcast (the newest params, as without the
    rule); with `n > 1` a set of weights reaches about `n` groups and the lag grows by up
    to `n - 1`."""
    plan = impala_plan(
        {
            **SMALL,
            "num_workers": groups,
            "rollout_fragment_length": 12,
            "train_batch_size": 24 // groups,  # one round (one fragment) per update
            "max_sample_requests_in_flight_per_worker": in_flight,
            "broadcast_interval": interval,
        },
        env="CartPole-v1",
    )
    state = plan.init(jax.random.PRNGKey(0))
    step = jax.jit(plan.step)
    expected = _broadcasts(groups, in_flight, interval, 10)
    for versions, broadcasts, lag in expected:
        state, result = step(state)
        info = plan.report(result)["info"]
        assert info["actor_group_versions"][PID] == versions
        assert info["num_weight_broadcasts"] == broadcasts
        assert info["learner"][PID]["policy_lag_max"] == lag
    lags = [lag for _, _, lag in expected[4:]]
    base = groups - 1 + in_flight - 1  # the lag without the rule
    assert max(lags) == base + interval - 1 and min(lags) >= base


def test_config_defaults_and_errors():
    c = IMPALAConfig()
    assert (c.lr, c.train_batch_size, c.rollout_fragment_length, c.grad_clip) == (
        5e-4,
        500,
        50,
        40.0,
    )
    assert (c.vtrace, c.num_sgd_iter, c.max_sample_requests_in_flight_per_worker) == (True, 1, 2)
    assert (c.broadcast_interval, c.minibatch_buffer_size) == (1, 1)
    for bad, fragment in (
        ({"replay_proportion": 0.5}, "must be > 0 when replay_proportion > 0"),
        ({"minibatch_buffer_size": 0}, "minibatch_buffer_size.*must be >= 1"),
        ({"broadcast_interval": 0}, "broadcast_interval.*must be >= 1"),
        ({"vtrace": False}, "IMPALA needs V-trace"),
        ({"opt_type": "sgd"}, "opt_type"),
        ({"learner_queue_sise": 4}, "did you mean 'learner_queue_size'"),
    ):
        with pytest.raises(ValueError, match=fragment):
            IMPALAConfig.from_dict(bad)


def test_rmsprop_is_rllibs_torch_rmsprop():
    """`opt_type="rmsprop"`: two steps against `torch.optim.RMSprop(lr, alpha=decay,
    eps=epsilon, momentum)` written out in float64 numpy (mean square from 0, epsilon outside
    the root, momentum buffer)."""
    lr, decay, eps, momentum = 0.01, 0.9, 0.1, 0.5
    config = {**SMALL, "opt_type": "rmsprop", "decay": decay, "epsilon": eps}
    plan = impala_plan({**config, "momentum": momentum, "lr": lr, "grad_clip": None})
    policy = plan.workers.policies[PID]
    state = policy.init(jax.random.PRNGKey(0))
    leaves, treedef = jax.tree.flatten(state.params)
    rng = np.random.default_rng(0)
    p = [np.asarray(x, np.float64) for x in leaves]
    ms, buf = [np.zeros_like(x) for x in p], [np.zeros_like(x) for x in p]
    for _ in range(2):
        g = [rng.normal(size=x.shape) * 3.0 for x in p]
        state = policy.apply_gradients(
            state, jax.tree.unflatten(treedef, [x.astype(np.float32) for x in g])
        )
        for i in range(len(p)):
            ms[i] = decay * ms[i] + (1 - decay) * g[i] ** 2
            buf[i] = momentum * buf[i] + g[i] / (np.sqrt(ms[i]) + eps)
            p[i] = p[i] - lr * buf[i]
    for got, want in zip(jax.tree.leaves(state.params), p, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for bad, key in (({"decay": 1.0}, "decay"), ({"epsilon": 0.0}, "epsilon")):
        with pytest.raises(ValueError, match=key):
            IMPALAConfig.from_dict({"opt_type": "rmsprop", **bad})


def test_cli_trains_impala(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "impala", "--config", "model.fcnet_hiddens=[8]", "--stop-iters", "2"]
    assert cli.main([*argv, "--quiet", "--output", str(out)]) == 0
    assert "IMPALA on CartPole-v1" in capsys.readouterr().out
    rows = [json.loads(ln) for ln in (out / "result.jsonl").read_text().splitlines()]
    assert rows[-1]["timesteps_total"] == 2 * 256
    assert json.loads((out / "params.json").read_text())["algorithm"] == "IMPALA"


@pytest.mark.slow
def test_impala_solves_cartpole_and_holds():
    """The CartPole preset (1 group x 16 envs x 16 steps, 2 requests in flight: lag 1;
    RLlib's RMSProp with the global-norm clip of 40, lr annealed from 2e-3 to 1e-4 and the
    entropy bonus from 0.01 to 0 over 500k / 300k steps), seeds 0-2 vmapped to 500k env
    steps, no stop: all three reach 475 by 300k (measured on the 2-core CPU machine: at
    224k, 250k and 277k; ~17 s) and end at 475 or more (495-500)."""
    plan = impala_plan(env="CartPole-v1")
    iters = 500_000 // 256
    _, results = jaxplan.train_seeds(plan, [0, 1, 2], iters)
    reward = np.asarray(results["episode_reward_mean"])
    first = np.argmax(reward >= 475, axis=1)
    assert (reward >= 475).any(axis=1).all(), np.nanmax(reward, axis=1)
    assert (first * 256 <= 300_000).all(), first * 256
    assert (reward[:, -1] >= 475).all(), reward[:, -1]


MESH = """
import jax, json, sys, jaxplan
plan = jaxplan.impala_plan({"num_workers": 2, "num_envs_per_worker": 2,
    "rollout_fragment_length": 8, "train_batch_size": 32, "num_devices": 2,
    "_fake_gpus": True, "model": {"fcnet_hiddens": [8]}, **json.loads(sys.argv[1])},
    env="CartPole-v1")
state = plan.init(jax.random.PRNGKey(0))
step = jax.jit(plan.step)
rows = []
for _ in range(6):
    state, result = step(state)
    r = plan.report(result)
    info = r["info"]
    rows.append({"steps": r["timesteps_total"], "trained": info["num_steps_trained"],
                 "lag": info["learner"]["default_policy"]["policy_lag_max"],
                 "versions": info["actor_group_versions"]["default_policy"],
                 "broadcasts": info.get("num_weight_broadcasts"),
                 "loss": info["learner"]["default_policy"]["learner_stats"]["total_loss"]})
print(json.dumps(rows))
"""


def _on_two_devices(overrides: dict) -> list[dict]:
    import os
    import subprocess
    import sys

    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    proc = subprocess.run(
        [sys.executable, "-c", MESH, json.dumps(overrides)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_runs_on_two_fake_devices():
    """On a mesh each device staggers its own groups (one fragment per device per round) and
    the learner is data-parallel: 2 devices x 1 group emit 2 x 16 steps, one round per batch;
    with RLlib's 2 requests in flight every group acts with params one update old."""
    rows = _on_two_devices({})
    assert [r["steps"] for r in rows] == [32 * i for i in range(1, 7)]
    assert rows[2]["lag"] == 1 and rows[2]["versions"] == [1, 1]  # delivered a round late
    assert [r["lag"] for r in rows] == [0, 1, 1, 1, 1, 1]
    assert [r["broadcasts"] for r in rows] == [0, 1, 2, 3, 4, 5]  # every update


def test_broadcast_interval_and_minibatch_buffer_on_two_fake_devices():
    """`broadcast_interval` 4 on 2 devices: each round returns 2 fragments (the round's
    returns handled together), so the weights are broadcast every other round: the model's
    schedule with 2 returns a round (versions 0, 0, 0, 2, 2, 4, lag alternating 1 and 2).
    The minibatch buffer (2 batches x 2 passes) runs data-parallel: 2 learner steps per
    iteration after the first, each on the ring's batch, its rows split over the devices."""
    rows = _on_two_devices({"broadcast_interval": 4})
    expected = _broadcasts(1, 2, 4, 6, returns=2)
    assert [r["versions"] for r in rows] == [v * 2 for v, _, _ in expected]
    assert [r["broadcasts"] for r in rows] == [b for _, b, _ in expected] == [0, 0, 1, 1, 2, 2]
    assert [r["lag"] for r in rows] == [lag for _, _, lag in expected] == [0, 1, 2, 1, 2, 1]
    rows = _on_two_devices({"minibatch_buffer_size": 2, "num_sgd_iter": 2})
    assert [r["trained"] for r in rows] == [32, 96, 160, 224, 288, 352]  # 1 step, then 2
    assert [r["steps"] for r in rows] == [32 * i for i in range(1, 7)]
    assert all(np.isfinite(r["loss"]) for r in rows)
