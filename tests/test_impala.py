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


def test_config_defaults_and_errors():
    c = IMPALAConfig()
    assert (c.lr, c.train_batch_size, c.rollout_fragment_length, c.grad_clip) == (
        5e-4,
        500,
        50,
        40.0,
    )
    assert (c.vtrace, c.num_sgd_iter, c.max_sample_requests_in_flight_per_worker) == (True, 1, 2)
    for bad, fragment in (
        ({"replay_proportion": 0.5}, "must be > 0 when replay_proportion > 0"),
        ({"minibatch_buffer_size": 2}, "only 1 is supported"),
        ({"broadcast_interval": 2}, "only 1 is supported"),
        ({"vtrace": False}, "IMPALA needs V-trace"),
        ({"opt_type": "rmsprop"}, "opt_type"),
        ({"learner_queue_sise": 4}, "did you mean 'learner_queue_size'"),
    ):
        with pytest.raises(ValueError, match=fragment):
            IMPALAConfig.from_dict(bad)


def test_cli_trains_impala(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "impala", "--config", "model.fcnet_hiddens=[8]", "--stop-iters", "2"]
    assert cli.main([*argv, "--quiet", "--output", str(out)]) == 0
    assert "IMPALA on CartPole-v1" in capsys.readouterr().out
    rows = [json.loads(ln) for ln in (out / "result.jsonl").read_text().splitlines()]
    assert rows[-1]["timesteps_total"] == 2 * 256
    assert json.loads((out / "params.json").read_text())["algorithm"] == "IMPALA"


@pytest.mark.slow
def test_impala_solves_cartpole():
    """The CartPole preset (1 group x 16 envs x 16 steps, 2 requests in flight: lag 1, lr
    1e-3), seeds 0-2 vmapped to 400k env steps: seeds 0 and 2 reach 475 (at 258k and 208k),
    seed 1 peaks at 472 (measured on the 2-core CPU machine, ~20 s). Vanilla V-trace policy
    gradient is less steady than PPO here; asserted: 2 of 3."""
    plan = impala_plan(env="CartPole-v1")
    iters = 400_000 // 256
    stop = jaxplan.Stop(episode_reward_mean=475)
    _, results = jaxplan.train_seeds(plan, [0, 1, 2], iters, stop=stop)
    solved = np.asarray(results["done"]).any(axis=1)
    assert solved.sum() >= 2, np.nanmax(np.asarray(results["episode_reward_mean"]), axis=1)


MESH = """
import jax, json, jaxplan
plan = jaxplan.impala_plan({"num_workers": 2, "num_envs_per_worker": 2,
    "rollout_fragment_length": 8, "train_batch_size": 32, "num_devices": 2,
    "_fake_gpus": True, "model": {"fcnet_hiddens": [8]}}, env="CartPole-v1")
state = plan.init(jax.random.PRNGKey(0))
step = jax.jit(plan.step)
for _ in range(3):
    state, result = step(state)
r = plan.report(result)
print(json.dumps({"steps": r["timesteps_total"],
                  "lag": r["info"]["learner"]["default_policy"]["policy_lag_mean"],
                  "versions": r["info"]["actor_group_versions"]["default_policy"]}))
"""


def test_runs_on_two_fake_devices():
    """On a mesh each device staggers its own groups (one fragment per device per round) and
    the learner is data-parallel: 2 devices x 1 group emit 2 x 16 steps, one round per batch;
    with RLlib's 2 requests in flight every group acts with params one update old."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    proc = subprocess.run(
        [sys.executable, "-c", MESH], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["steps"] == 3 * 32 and out["lag"] == 1.0
    assert out["versions"] == [1, 1]  # after 3 updates: the params delivered a round late
