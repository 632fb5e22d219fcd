"""APPO: the loss against a float64 numpy reference, V-trace against the target network, the
target update (and KL) frequency in env steps as RLlib 1.x's `UpdateTargetAndKL`, config
errors, the CLI, 2 fake devices and learning CartPole."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxplan
from jaxplan import batch as sb
from jaxplan import cli
from jaxplan.appo.config import APPOConfig
from jaxplan.appo.plan import appo_plan
from jaxplan.appo.policy import MODEL, TARGET, APPOPolicy
from jaxplan.batch import DEFAULT_POLICY_ID as PID
from jaxplan.envs import Discrete
from jaxplan.vtrace import vtrace

SMALL = {
    "num_workers": 2,
    "num_envs_per_worker": 2,
    "rollout_fragment_length": 8,
    "train_batch_size": 32,
    "model": {"fcnet_hiddens": [16, 16]},
}


def test_config_defaults_and_errors():
    c = APPOConfig()
    assert (c.vtrace, c.use_critic, c.use_gae, c.lambda_, c.clip_param) == (
        True,
        True,
        True,
        1.0,
        0.4,
    )
    assert (c.use_kl_loss, c.kl_coeff, c.kl_target) == (False, 1.0, 0.01)
    assert (c.lr, c.train_batch_size, c.rollout_fragment_length, c.grad_clip) == (
        5e-4,
        500,
        50,
        40.0,
    )
    assert (c.num_sgd_iter, c.minibatch_buffer_size, c.replay_buffer_num_slots) == (1, 1, 100)
    assert (c.vf_loss_coeff, c.entropy_coeff, c.learner_queue_size) == (0.5, 0.01, 16)
    assert c.target_update_frequency == 1
    assert APPOConfig(num_sgd_iter=3, minibatch_buffer_size=4).target_update_frequency == 12
    assert APPOConfig.from_dict({"vtrace": False}).vtrace is False  # IMPALA refuses it
    for bad, fragment in (
        ({"clip_param": 0.0}, "clip_param"),
        ({"kl_target": 0.0}, "kl_target"),
        ({"use_critic": False}, "GAE needs a value function"),
        ({"minibatch_buffer_size": 0}, "minibatch_buffer_size"),
        ({"use_kl_los": True}, "did you mean 'use_kl_loss'"),
    ):
        with pytest.raises(ValueError, match=fragment):
            APPOConfig.from_dict(bad)


# ---- the loss against float64 numpy ---------------------------------------------------------
def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _reference_loss(logits, target_logits, behaviour_logits, values, batch, cfg, kl_coeff):
    """RLlib's `appo_surrogate_loss` in float64 numpy from the networks' outputs."""
    a = batch[sb.ACTIONS]
    rows = np.arange(len(a))
    logp_all, behaviour_all = _log_softmax(logits), _log_softmax(behaviour_logits)
    logp, behaviour_logp = logp_all[rows, a], batch[sb.ACTION_LOGP].astype(np.float64)
    adv, vs = batch[sb.ADVANTAGES].astype(np.float64), batch[sb.VALUE_TARGETS].astype(np.float64)
    if cfg["vtrace"]:
        target_all = _log_softmax(target_logits)
        is_ratio = np.clip(np.exp(behaviour_logp - target_all[rows, a]), 0.0, 2.0)
        ratio = is_ratio * np.exp(logp - behaviour_logp)
        old_all = target_all
    else:
        ratio = np.exp(logp - behaviour_logp)
        old_all = behaviour_all
    clip = cfg["clip_param"]
    surrogate = np.minimum(adv * ratio, adv * np.clip(ratio, 1 - clip, 1 + clip))
    kl = (np.exp(old_all) * (old_all - logp_all)).sum(-1).mean()
    entropy = -(np.exp(logp_all) * logp_all).sum(-1).mean()
    vf_loss = 0.5 * np.mean((values - vs) ** 2)
    total = -surrogate.mean() + cfg["vf_loss_coeff"] * vf_loss - cfg["entropy_coeff"] * entropy
    if cfg["use_kl_loss"]:
        total += kl_coeff * kl
    out = {"policy_loss": -surrogate.mean(), "vf_loss": vf_loss, "entropy": entropy, "kl": kl}
    out["total_loss"] = total
    out["clipped"] = np.mean(np.abs(ratio - 1) > clip)
    if cfg["vtrace"]:
        out["mean_IS"], out["var_IS"] = is_ratio.mean(), is_ratio.var()
    return out


@pytest.mark.parametrize("vtrace_on,use_kl_loss", [(True, False), (True, True), (False, True)])
def test_loss_matches_float64_reference(vtrace_on, use_kl_loss):
    cfg = {
        "vtrace": vtrace_on,
        "use_kl_loss": use_kl_loss,
        "clip_param": 0.2,
        "vf_loss_coeff": 0.7,
        "entropy_coeff": 0.03,
        "kl_coeff": 0.6,
        "model": {"fcnet_hiddens": [8]},
    }
    config = APPOConfig.from_dict(cfg)
    policy = APPOPolicy((4,), Discrete(3), config)
    k = jax.random.split(jax.random.PRNGKey(1), 8)
    ps = policy.init(k[0])
    model = ps.params[MODEL]

    def perturbed(key):
        leaves, tree = jax.tree.flatten(model)
        keys = jax.random.split(key, len(leaves))
        noise = [jax.random.normal(q, x.shape) for q, x in zip(keys, leaves, strict=True)]
        return jax.tree.unflatten(tree, [x + n for x, n in zip(leaves, noise, strict=True)])

    # a target network and an acting policy that both differ from the model, enough that
    # some ratios are clipped
    params = {MODEL: model, TARGET: perturbed(k[1])}
    behaviour = perturbed(k[6])
    n = 64
    obs = jax.random.normal(k[2], (n, 4))
    behaviour_logits = policy.net.policy(behaviour, obs)
    actions = jax.random.categorical(k[3], behaviour_logits).astype(jnp.int32)
    batch = {
        sb.OBS: obs,
        sb.ACTIONS: actions,
        sb.ACTION_LOGP: policy.dist.log_prob(behaviour_logits, actions),
        sb.ACTION_DIST_INPUTS: behaviour_logits,
        sb.ADVANTAGES: 2.0 * jax.random.normal(k[4], (n,)),
        sb.VALUE_TARGETS: jax.random.normal(k[5], (n,)),
    }
    total, stats = jax.jit(policy.loss)(params, ps.hparams, jnp.float32(0.6), batch)
    logits, values = policy.net(params[MODEL], obs)
    f64 = lambda x: np.asarray(x, np.float64)  # noqa: E731
    np_batch = {key: np.asarray(v) for key, v in batch.items()}
    ref = _reference_loss(
        f64(logits),
        f64(policy.net.policy(params[TARGET], obs)),
        f64(behaviour_logits),
        f64(values),
        np_batch,
        cfg,
        0.6,
    )
    assert float(total) == pytest.approx(ref["total_loss"], rel=1e-5, abs=1e-6)
    assert ref.pop("clipped") > 0.1  # the clip is active for some rows
    for name, value in ref.items():
        assert float(stats[name]) == pytest.approx(value, rel=1e-4, abs=1e-6), name
    assert ("KL_Coeff" in stats) == use_kl_loss
    # the target network gets no gradient, the model does
    grads = jax.grad(lambda p: policy.loss(p, ps.hparams, jnp.float32(0.6), batch)[0])(params)
    assert all(float(jnp.abs(g).max()) == 0 for g in jax.tree.leaves(grads[TARGET]))
    assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads[MODEL]))


def test_vtrace_postprocessing_uses_the_target_network():
    """V-trace's target policy is the target network (RLlib passes its logits as
    `target_policy_logits`); the values are the model's."""
    config = APPOConfig.from_dict({"model": {"fcnet_hiddens": [8]}, "lambda": 0.9})
    policy = APPOPolicy((4,), Discrete(2), config)
    k = jax.random.split(jax.random.PRNGKey(3), 6)
    ps = policy.init(k[0])
    params = {MODEL: ps.params[MODEL], TARGET: policy.init(k[1]).params[MODEL]}
    t, b = 6, 3
    obs = jax.random.normal(k[2], (t, b, 4))
    actions = jax.random.randint(k[3], (t, b), 0, 2)
    traj = {
        sb.OBS: obs,
        sb.NEXT_OBS: jnp.concatenate([obs[1:], jax.random.normal(k[4], (1, b, 4))]),
        sb.ACTIONS: actions,
        sb.REWARDS: jnp.ones((t, b)),
        sb.TERMINATEDS: jnp.zeros((t, b), bool).at[2, 0].set(True),
        sb.TRUNCATEDS: jnp.zeros((t, b), bool),
        sb.ACTION_LOGP: jnp.full((t, b), jnp.log(0.5)),
    }
    out = policy.postprocess_trajectory(params, ps.hparams, traj)
    values = policy.net.value(params[MODEL], obs)
    next_values = policy.net.value(params[MODEL], traj[sb.NEXT_OBS])
    for who, expect_equal in ((TARGET, True), (MODEL, False)):
        vs, adv = vtrace(
            traj[sb.ACTION_LOGP],
            policy.dist.log_prob(policy.net.policy(params[who], obs), actions),
            traj[sb.REWARDS],
            values,
            next_values,
            traj[sb.TERMINATEDS],
            traj[sb.TRUNCATEDS],
            0.99,
            0.9,
        )
        same = np.allclose(out[sb.ADVANTAGES], adv, atol=1e-6)
        assert same == expect_equal, who
        if expect_equal:
            np.testing.assert_allclose(out[sb.VALUE_TARGETS], vs, atol=1e-6)
    np.testing.assert_allclose(out[sb.VF_PREDS], values, atol=1e-6)


# ---- target network and KL updates, in env steps --------------------------------------------
def _rllib_target_updates(sampled_per_iter, freq, iters):
    """RLlib 1.x's `UpdateTargetAndKL` after each learner step: `cur_ts - last_update >
    freq` with `cur_ts` the env steps sampled."""
    last, updates = 0, []
    for i in range(1, iters + 1):
        cur = i * sampled_per_iter
        if cur - last > freq:
            last = cur
            updates.append(i)
    return updates


@pytest.mark.parametrize("num_sgd_iter,use_kl_loss", [(64, True), (1, False)])
def test_target_and_kl_update_every_num_sgd_iter_env_steps(num_sgd_iter, use_kl_loss):
    """32 env steps per iteration; the target is updated after the learner step of the
    iterations where more than `num_sgd_iter * minibatch_buffer_size` env steps were
    sampled since the last update (strictly: 64 steps apart is not enough with 64); in
    between the target stays and, with `use_kl_loss`, so does `kl_coeff`."""
    plan = appo_plan(
        {**SMALL, "num_sgd_iter": num_sgd_iter, "use_kl_loss": use_kl_loss, "kl_target": 1e-3},
        env="CartPole-v1",
    )
    state = plan.init(jax.random.PRNGKey(0))
    step = jax.jit(plan.step)
    expected = _rllib_target_updates(32, num_sgd_iter, 7)
    assert expected == ([3, 6] if num_sgd_iter == 64 else [1, 2, 3, 4, 5, 6, 7])
    for i in range(1, 8):
        before = state.policies[PID]
        state, result = step(state)
        after = state.policies[PID]
        info = plan.report(result)["info"]
        assert info["num_target_updates"] == sum(u <= i for u in expected)
        target_is_model = all(
            bool(jnp.array_equal(a, b))
            for a, b in zip(
                jax.tree.leaves(after.params[TARGET]),
                jax.tree.leaves(after.params[MODEL]),
                strict=True,
            )
        )
        target_kept = all(
            bool(jnp.array_equal(a, b))
            for a, b in zip(
                jax.tree.leaves(after.params[TARGET]),
                jax.tree.leaves(before.params[TARGET]),
                strict=True,
            )
        )
        assert target_is_model == (i in expected) and target_kept == (i not in expected)
        if i in expected:
            assert info["last_target_update_ts"] == 32 * i
        kl = info["learner"][PID]["learner_stats"]["kl"]
        coeff = float(before.kl_coeff)
        if use_kl_loss and i in expected:
            want = coeff * 1.5 if kl > 2e-3 else coeff * 0.5 if kl < 5e-4 else coeff
        else:
            want = coeff
        assert float(after.kl_coeff) == pytest.approx(want)


def test_target_update_with_the_minibatch_buffer():
    """`minibatch_buffer_size` 8 x `num_sgd_iter` 8: RLlib's frequency is their product (64
    env steps, strictly exceeded) and the rule runs after every learner step: 8 steps a
    cycle (on the ring's batches), of which only the cycle's first can see new env steps, so
    the target moves in the same cycles as with one 8-pass step ([3, 6]) and stays between."""
    plan = appo_plan({**SMALL, "num_sgd_iter": 8, "minibatch_buffer_size": 8}, env="CartPole-v1")
    state = plan.init(jax.random.PRNGKey(0))
    step = jax.jit(plan.step)
    expected = _rllib_target_updates(32, 64, 7)
    for i in range(1, 8):
        before = state.policies[PID].params[TARGET]
        state, result = step(state)
        info = plan.report(result)["info"]
        assert info["num_target_updates"] == sum(u <= i for u in expected)
        after = state.policies[PID].params[TARGET]
        kept = all(
            bool(jnp.array_equal(a, b))
            for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before), strict=True)
        )
        assert kept == (i not in expected)
    # the ring fills one batch a cycle (1 learner step each) before 8 steps a cycle
    assert info["num_steps_trained"] == 7 * 32 and int(state.policies[PID].version) == 7


# ---- the CLI, devices, learning --------------------------------------------------------------
def test_cli_trains_appo(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "appo", "--config", "model.fcnet_hiddens=[8]", "--stop-iters", "2"]
    assert cli.main([*argv, "--quiet", "--output", str(out)]) == 0
    assert "APPO on CartPole-v1" in capsys.readouterr().out
    rows = [json.loads(ln) for ln in (out / "result.jsonl").read_text().splitlines()]
    assert rows[-1]["timesteps_total"] == 2 * 256
    assert rows[-1]["info"]["num_target_updates"] == 2
    assert json.loads((out / "params.json").read_text())["algorithm"] == "APPO"
    policy = jaxplan.load_policy(out)  # acts with the model of the {"model", "target"} params
    assert policy.act(np.zeros((5, 4), np.float32)).shape == (5,)
    assert policy.value(np.zeros((5, 4), np.float32)).shape == (5,)
    argv = [*argv[:-1], "4", "--resume", str(out)]
    assert cli.main([*argv, "--quiet", "--output", str(out)]) == 0
    rows = [json.loads(ln) for ln in (out / "result.jsonl").read_text().splitlines()]
    assert rows[-1]["timesteps_total"] == 4 * 256 and rows[-1]["info"]["num_target_updates"] == 4


@pytest.mark.parametrize(
    "overrides", [{"vtrace": False}, {"vtrace": False, "use_critic": False, "use_gae": False}]
)
def test_gae_variants_run(overrides):
    """`vtrace=False`: GAE advantages (with `use_critic=False` discounted returns, zero
    baseline) and the ratio to the acting policy; the plan trains and reports finite stats
    without the V-trace ones."""
    plan = appo_plan({**SMALL, **overrides}, env="CartPole-v1")
    state = plan.init(jax.random.PRNGKey(0))
    step = jax.jit(plan.step)
    for _ in range(2):
        state, result = step(state)
    stats = plan.report(result)["info"]["learner"][PID]["learner_stats"]
    assert "mean_IS" not in stats and all(np.isfinite(v) for v in stats.values())


MESH = """
import jax, json, sys, jaxplan
plan = jaxplan.appo_plan({"num_workers": 2, "num_envs_per_worker": 2,
    "rollout_fragment_length": 8, "train_batch_size": 32, "num_devices": 2, "num_sgd_iter": 2,
    "_fake_gpus": True, "model": {"fcnet_hiddens": [8]}, **json.loads(sys.argv[1])},
    env="CartPole-v1")
state = plan.init(jax.random.PRNGKey(0))
step = jax.jit(plan.step)
for _ in range(3):
    state, result = step(state)
r = plan.report(result)
ps = state.policies["default_policy"]
same = all(bool((a == b).all()) for a, b in zip(jax.tree.leaves(ps.params["model"]),
                                               jax.tree.leaves(ps.params["target"])))
print(json.dumps({"steps": r["timesteps_total"], "updates": r["info"]["num_target_updates"],
                  "trained": r["info"]["num_steps_trained"],
                  "lag": r["info"]["learner"]["default_policy"]["policy_lag_mean"],
                  "stats": r["info"]["learner"]["default_policy"]["learner_stats"],
                  "target_is_model": same}))
"""


@pytest.mark.parametrize("replay", [False, True])
def test_runs_on_two_fake_devices(replay):
    """On a mesh each device staggers its own groups and the learner is data-parallel (as
    IMPALA): 2 devices x 1 group emit 2 x 16 steps a round; the target follows the model.
    With MixInReplay (one replay per batch) and a learner queue of 2 each device keeps its
    shard of the queued and replayed batches; the producer is held back every other
    iteration, the learner is not."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    extra = {"replay_proportion": 1.0, "replay_buffer_num_slots": 4, "learner_queue_size": 2}
    proc = subprocess.run(
        [sys.executable, "-c", MESH, json.dumps(extra if replay else {})],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["steps"] == (2 if replay else 3) * 32 and out["trained"] == 3 * 32
    # RLlib's rule counts env steps sampled: none in the held-back iteration, no update
    assert out["updates"] == (2 if replay else 3)
    assert out["lag"] == (2.0 if replay else 1.0)
    assert out["target_is_model"]
    stats = out["stats"]
    assert all(np.isfinite(v) for v in stats.values() if isinstance(v, float))
    assert 0.0 < stats["mean_IS"] <= 2.0 and stats["var_IS"] >= 0.0


@pytest.mark.slow
def test_appo_solves_cartpole():
    """The CartPole preset (1 group x 16 envs x 16 steps, 2 requests in flight: lag 1; 4
    clipped-surrogate passes per batch, lr 1e-3), seeds 0-2 vmapped to 300k env steps: all
    three reach 475 (measured on the 2-core CPU machine: at 224k, 201k and 156k, ~36 s)."""
    plan = appo_plan(env="CartPole-v1")
    iters = 300_000 // 256
    stop = jaxplan.Stop(episode_reward_mean=475)
    _, results = jaxplan.train_seeds(plan, [0, 1, 2], iters, stop=stop)
    solved = np.asarray(results["done"]).any(axis=1)
    assert solved.all(), np.nanmax(np.asarray(results["episode_reward_mean"]), axis=1)
