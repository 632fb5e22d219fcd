"""A2C: RLlib's summed actor-critic loss against float64 numpy, the microbatch plan
(ComputeGradients -> Flow.batch -> AverageGradients -> ApplyGradients) against one step on the
whole batch, N fake devices against one, the CLI (train, resume, refusals), and learning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxplan
from jaxplan import cli
from jaxplan.a2c.config import A2CConfig, A2CHParams
from jaxplan.a2c.loss import a2c_loss
from jaxplan.a2c.plan import a2c_plan
from jaxplan.algorithms import get_algorithm
from jaxplan.batch import DEFAULT_POLICY_ID as PID

SMALL = {
    "num_workers": 2,
    "num_envs_per_worker": 2,
    "rollout_fragment_length": 8,
    "train_batch_size": 128,
    "model": {"fcnet_hiddens": [16, 16]},
}


def max_diff(a, b) -> float:
    diffs = jax.tree.map(
        lambda x, y: float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))),
        a,
        b,
    )
    return max(jax.tree.leaves(diffs))


def test_loss_matches_float64_reference():
    rng = np.random.default_rng(0)
    n = 37
    logp, adv, ent, v, r = (rng.normal(size=n) for _ in range(5))
    hp = A2CHParams.from_config(A2CConfig(vf_loss_coeff=0.25, entropy_coeff=0.03, lr=3e-4))
    total, stats = a2c_loss(
        logp=jnp.float32(logp),
        advantages=jnp.float32(adv),
        entropy=jnp.float32(ent),
        values=jnp.float32(v),
        value_targets=jnp.float32(r),
        hparams=hp,
    )
    pi = -np.sum(logp * adv)  # RLlib sums over rows (A3C's loss), it does not average
    vf = 0.5 * np.sum((v - r) ** 2)
    h = np.sum(ent)
    np.testing.assert_allclose(stats["policy_loss"], pi, rtol=1e-5)
    np.testing.assert_allclose(stats["vf_loss"], vf, rtol=1e-5)
    np.testing.assert_allclose(stats["policy_entropy"], h, rtol=1e-5)
    np.testing.assert_allclose(total, pi + 0.25 * vf - 0.03 * h, rtol=1e-5)
    np.testing.assert_allclose(
        stats["vf_explained_var"], max(-1.0, 1 - np.var(r - v) / np.var(r)), rtol=1e-5
    )
    np.testing.assert_allclose(stats["cur_lr"], 3e-4)


def first_update(overrides) -> tuple:
    plan = a2c_plan({**SMALL, **overrides}, env="CartPole-v1")
    state, result = jax.jit(plan.step)(plan.init(jax.random.PRNGKey(1)))
    return state, plan.report(result)


def test_microbatches_sum_to_one_step_on_the_whole_batch():
    """RLlib's AverageGradients sums the microbatch gradients, so with A2C's summed loss 4
    microbatches of 32 steps apply the gradient of the whole 128-step batch: same rollouts,
    same update (up to float rounding), same counters."""
    whole, r_whole = first_update({})
    micro, r_micro = first_update({"microbatch_size": 32})
    assert max_diff(whole.policies[PID].params, micro.policies[PID].params) < 1e-6
    assert max_diff(whole.actors, micro.actors) == 0.0  # the same 4 rounds were sampled
    for r in (r_whole, r_micro):
        assert r["timesteps_total"] == r["info"]["num_steps_trained"] == 128
        assert r["info"]["policy_versions"][PID] == 1
    stats = r_micro["info"]["learner"][PID]["learner_stats"]
    # learner stats are the microbatches' mean: a quarter of the whole batch's sums
    np.testing.assert_allclose(
        stats["vf_loss"] * 4,
        r_whole["info"]["learner"][PID]["learner_stats"]["vf_loss"],
        rtol=1e-4,
    )
    assert stats["num_nonfinite_updates"] == 0


def test_config_defaults_and_errors():
    c = A2CConfig()
    assert (c.lr, c.train_batch_size, c.rollout_fragment_length, c.grad_clip) == (
        1e-4,
        500,
        20,
        40.0,
    )
    assert (c.vf_loss_coeff, c.entropy_coeff, c.lambda_, c.microbatch_size) == (
        0.5,
        0.01,
        1.0,
        None,
    )
    assert A2CConfig(train_batch_size=500, microbatch_size=64).num_microbatches == 8
    with pytest.raises(ValueError, match="did you mean 'microbatch_size'"):
        A2CConfig.from_dict({"microbatch_sise": 32})
    with pytest.raises(ValueError, match="microbatch_size"):
        A2CConfig.from_dict({"microbatch_size": 1000})
    with pytest.raises(ValueError, match="cannot differ per policy"):
        A2CConfig.from_dict({"multiagent": {"policies": {"a": {"num_sgd_iter": 3}}}})
    assert get_algorithm("A2C").config_class is A2CConfig


def test_use_gae_false_is_lambda_one():
    a, _ = first_update({"lambda": 1.0})
    b, _ = first_update({"lambda": 0.5, "use_gae": False})
    assert max_diff(a.policies[PID].params, b.policies[PID].params) == 0.0


DEVICES = """
import json, sys, jax, numpy as np
from jaxplan.a2c.plan import a2c_plan
small = json.loads(sys.argv[1])
out = {}
for micro in (None, 32):
    params = []
    for n in (0, 2):
        plan = a2c_plan({**small, "microbatch_size": micro, "num_devices": n, "_fake_gpus": True})
        state, step = plan.init(jax.random.PRNGKey(1)), jax.jit(plan.step)
        for _ in range(2):
            state, _ = step(state)
        params.append(jax.device_get(state.policies["default_policy"].params))
    d = jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), *params)
    out[str(micro)] = max(jax.tree.leaves(d))
print(json.dumps(out))
"""


def test_two_fake_devices_match_one_device():
    """Each device differentiates its shard; the summed loss is scaled by the device count so
    the all-reduced mean is the whole batch's gradient: 2 iterations, both plans."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(DEVICES), json.dumps(SMALL)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    diffs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert diffs["None"] < 1e-5 and diffs["32"] < 1e-5, diffs


def test_cli_trains_resumes_and_refuses_another_algorithm(tmp_path, capsys):
    a = tmp_path / "a"
    tiny = ["--config", "train_batch_size=64", "--config", "model.fcnet_hiddens=[8]", "--quiet"]
    assert cli.main(["train", "a2c", *tiny, "--stop-iters", "2", "--output", str(a)]) == 0
    header = capsys.readouterr().out
    assert "A2C on CartPole-v1" in header and "1 gradient step on the whole batch" in header
    params = json.loads((a / "params.json").read_text())
    assert params["algorithm"] == "A2C" and params["config"]["microbatch_size"] is None
    assert cli.main(["train", "a2c", "--resume", str(a), "--stop-iters", "3", "--quiet"]) == 0
    rows = [json.loads(ln) for ln in (a / "result.jsonl").read_text().splitlines()]
    assert [r["training_iteration"] for r in rows] == [1, 2, 3]
    assert set(rows[-1]["info"]["learner"][PID]["learner_stats"]) >= {
        "cur_lr",
        "entropy_coeff",
        "policy_entropy",
        "policy_loss",
        "vf_loss",
        "vf_explained_var",
    }
    capsys.readouterr()
    assert cli.main(["train", "ppo", "--resume", str(a), "--stop-iters", "4"]) == 2
    err = capsys.readouterr().err
    assert "trained A2C, not PPO" in err and len(err.strip().splitlines()) == 1
    run = jaxplan.load_run(a)
    assert run.config.microbatch_size is None and run.iteration == 3
    assert run.evaluate(num_episodes=2)[0]["episodes_this_iter"] >= 2


@pytest.mark.slow
def test_a2c_solves_cartpole():
    """The CartPole preset (16 envs x 16 steps, lr 1e-3, no grad clip), seeds 0-2 vmapped:
    475 at 162k-173k env steps (measured on the 2-core CPU machine, ~10 s); budget 250k."""
    plan = a2c_plan(env="CartPole-v1")
    iters = 250_000 // plan.workers.round_env_steps
    stop = jaxplan.Stop(episode_reward_mean=475)
    _, results = jaxplan.train_seeds(plan, [0, 1, 2], iters, stop=stop)
    solved = np.asarray(results["done"]).any(axis=1)
    assert solved.all(), np.nanmax(np.asarray(results["episode_reward_mean"]), axis=1)
