"""SAC: its formulas and whole loss against float64 numpy references (squashed Gaussian,
twin-Q soft targets with terminated vs truncated rows, actor and alpha losses and the alpha
step), RLlib's soft target update semantics (`tau`, `target_network_update_freq` 0: after
every train step), config errors, the CLI, vmap over seeds and learning Pendulum-v1."""

from __future__ import annotations

import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxplan import batch as sb
from jaxplan import cli
from jaxplan.dqn.policy import N_STEPS
from jaxplan.envs import Box
from jaxplan.sac import loss as sac_loss
from jaxplan.sac.config import SACConfig, calculate_rr_weights
from jaxplan.sac.plan import sac_plan
from jaxplan.sac.policy import SACPolicy
from jaxplan.stages.replay import LocalReplayBuffer
from jaxplan.stages.update_target_network import UpdateTargetNetwork
from jaxplan.workers import Counters, PlanState

SMALL = {"fcnet_hiddens": [8, 8]}
TINY = {
    "num_envs_per_worker": 2,
    "rollout_fragment_length": 4,
    "train_batch_size": 16,
    "timesteps_per_iteration": 32,
    "learning_starts": 32,
    "buffer_size": 256,
    "Q_model": SMALL,
    "policy_model": SMALL,
}


# ---- float64 references ----------------------------------------------------------------------
def mlp64(params, x):
    """A DenseStack (relu hidden layers, linear output) in float64 numpy."""
    layers = params["params"]
    n = len(layers)
    for i in range(n):
        x = x @ np.asarray(layers[f"Dense_{i}"]["kernel"], np.float64) + np.asarray(
            layers[f"Dense_{i}"]["bias"], np.float64
        )
        if i < n - 1:
            x = np.maximum(x, 0.0)
    return x


def squashed64(inputs, noise):
    """tanh-squashed Gaussian: action and log-density, the textbook way (float64)."""
    d = noise.shape[-1]
    mean, log_std = inputs[..., :d], np.clip(inputs[..., d:], -5.0, 2.0)
    u = mean + np.exp(log_std) * noise
    std = np.exp(log_std)
    normal = -0.5 * ((u - mean) / std) ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi)
    # log(1 - tanh(u)^2) = -2 log cosh(u), in a form float64 keeps exact for large |u|
    log_sech2 = -2.0 * (np.abs(u) + np.log1p(np.exp(-2.0 * np.abs(u))) - np.log(2.0))
    return np.tanh(u), np.sum(normal - log_sech2, axis=-1)


def huber64(x):
    return np.where(np.abs(x) < 1.0, 0.5 * x**2, np.abs(x) - 0.5)


def test_squashed_gaussian_sample_matches_numpy():
    rng = np.random.default_rng(0)
    inputs = rng.normal(size=(64, 4)) * 1.5
    inputs[:4, 2:] = [[-9.0, 3.5], [4.0, -6.0], [-5.5, 2.5], [0.3, -0.2]]  # log_std clipped
    noise = rng.normal(size=(64, 2))
    a, logp = sac_loss.squashed_gaussian_sample(
        jnp.asarray(inputs, jnp.float32), jnp.asarray(noise, jnp.float32)
    )
    ref_a, ref_logp = squashed64(inputs, noise)
    np.testing.assert_allclose(a, ref_a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logp, ref_logp, rtol=1e-4, atol=1e-4)
    # RLlib's TorchSquashedGaussian.logp re-derives u = atanh(a) and adds 1e-6 in the log: the
    # same where tanh is not saturated
    u = np.arctanh(np.clip(ref_a, -1 + 1e-6, 1 - 1e-6))
    mean, log_std = inputs[:, :2], np.clip(inputs[:, 2:], -5, 2)
    rllib = np.sum(
        -0.5 * ((u - mean) / np.exp(log_std)) ** 2 - log_std - 0.5 * np.log(2 * np.pi), -1
    ) - np.sum(np.log(1 - np.tanh(u) ** 2 + 1e-6), -1)
    ok = np.all(np.abs(ref_a) < 0.99, axis=-1)
    assert ok.sum() > 10
    np.testing.assert_allclose(np.asarray(logp)[ok], rllib[ok], rtol=1e-3, atol=1e-3)
    # a large |u| stays finite (the stable log(1 - tanh^2))
    _, far = sac_loss.squashed_gaussian_sample(jnp.array([[30.0, 0.0]]), jnp.array([[0.0]]))
    assert np.isfinite(float(far[0]))


def fragment_batch(policy, ps, rng):
    """A time-major fragment [T=6, envs=2] through the policy's postprocessing: env 0
    terminates at t=2, env 1 is truncated (time limit) at t=3 with a final observation."""
    length, envs = 6, 2
    obs = rng.normal(size=(length, envs, 3))
    next_obs = np.concatenate([obs[1:], rng.normal(size=(1, envs, 3))])
    next_obs[3, 1] = rng.normal(size=3) * 3  # the final observation of the truncated episode
    terminated = np.zeros((length, envs), bool)
    truncated = np.zeros((length, envs), bool)
    terminated[2, 0] = True
    truncated[3, 1] = True
    traj = {
        sb.OBS: jnp.asarray(obs, jnp.float32),
        sb.NEXT_OBS: jnp.asarray(next_obs, jnp.float32),
        sb.ACTIONS: jnp.asarray(rng.uniform(-1, 1, size=(length, envs, 1)), jnp.float32),
        sb.REWARDS: jnp.asarray(rng.normal(size=(length, envs)), jnp.float32),
        sb.TERMINATEDS: jnp.asarray(terminated),
        sb.TRUNCATEDS: jnp.asarray(truncated),
    }
    out = policy.postprocess_trajectory(ps.params, ps.hparams, traj)
    return {k: v.reshape(length * envs, *v.shape[2:]) for k, v in out.items()}


def sac_policy(**overrides):
    config = SACConfig().updated({"Q_model": SMALL, "policy_model": SMALL, **overrides})
    box = Box((1,), np.array([-2.0], np.float32), np.array([2.0], np.float32))
    return SACPolicy((3,), box, config)


def loss_reference(policy, params, batch, noise_t, noise_tp1, gamma):
    """SAC's losses (RLlib's actor_critic_loss, continuous actions, twin Q) in float64."""
    f64 = lambda x: np.asarray(x, np.float64)
    obs, next_obs, actions = f64(batch[sb.OBS]), f64(batch[sb.NEXT_OBS]), f64(batch[sb.ACTIONS])
    rewards, term = f64(batch[sb.REWARDS]), f64(batch[sb.TERMINATEDS])
    steps = f64(batch[N_STEPS])
    log_alpha = float(params["log_alpha"])
    alpha = np.exp(log_alpha)

    def q(net, o, a):
        return mlp64(params[net] if net in params else net, np.concatenate([o, a], -1))[:, 0]

    def q_target(name, o, a):
        return mlp64(params["target"][name], np.concatenate([o, a], -1))[:, 0]

    a_t, logp_t = squashed64(mlp64(params["policy"], obs), noise_t)
    a_tp1, logp_tp1 = squashed64(mlp64(params["policy"], next_obs), noise_tp1)
    q_tp1 = np.minimum(q_target("q", next_obs, a_tp1), q_target("twin_q", next_obs, a_tp1))
    targets = rewards + gamma**steps * (1 - term) * (q_tp1 - alpha * logp_tp1)
    td1 = q("q", obs, actions) - targets
    td2 = q("twin_q", obs, actions) - targets
    critic = np.mean(huber64(td1)) + np.mean(huber64(td2))
    q_pi = np.minimum(q("q", obs, a_t), q("twin_q", obs, a_t))
    actor = np.mean(alpha * logp_t - q_pi)
    alpha_loss = -np.mean(log_alpha * (logp_t + policy.target_entropy))
    return {
        "targets": targets,
        "critic": critic,
        "actor": actor,
        "alpha": alpha_loss,
        "td_error": 0.5 * (np.abs(td1) + np.abs(td2)),
        "alpha_grad": -np.mean(logp_t + policy.target_entropy),
    }


def test_sac_loss_and_alpha_step_match_numpy_reference():
    policy = sac_policy(initial_alpha=0.5, prioritized_replay=True)
    assert policy.target_entropy == -1.0  # "auto": -action_dim
    ps = policy.init(jax.random.PRNGKey(0))
    # targets that differ from the online nets (as after some soft updates)
    target = jax.tree.map(lambda x: x + 0.1, ps.params["target"])
    ps = ps.replace(params={**ps.params, "target": target})
    rng = np.random.default_rng(3)
    batch = fragment_batch(policy, ps, rng)
    key = jax.random.PRNGKey(7)
    loss_fn = jax.jit(lambda p, b: policy.loss(p, ps.hparams, 0.0, b, key=key))
    loss, stats = loss_fn(ps.params, batch)
    k_t, k_tp1 = jax.random.split(key)  # the loss's noise, as it draws it
    noise_t = np.asarray(jax.random.normal(k_t, (12, 1)), np.float64)
    noise_tp1 = np.asarray(jax.random.normal(k_tp1, (12, 1)), np.float64)
    ref = loss_reference(policy, ps.params, batch, noise_t, noise_tp1, 0.99)
    np.testing.assert_allclose(stats["critic_loss"], ref["critic"] / 2, rtol=1e-4)
    np.testing.assert_allclose(stats["actor_loss"], ref["actor"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(stats["alpha_loss"], ref["alpha"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(loss, ref["critic"] + ref["actor"] + ref["alpha"], rtol=1e-4)
    np.testing.assert_allclose(stats["per_row"]["td_error"], ref["td_error"], rtol=1e-4, atol=1e-5)
    # terminated (t=2, env 0: row 4) vs truncated (t=3, env 1: row 7): the terminal row's
    # target is its reward alone; the truncated one bootstraps from its final observation
    targets = ref["targets"]
    term, trunc = np.asarray(batch[sb.TERMINATEDS]), np.asarray(batch[sb.TRUNCATEDS])
    assert term[4] and not term[7] and trunc[7]
    np.testing.assert_allclose(targets[4], float(batch[sb.REWARDS][4]), rtol=1e-6)
    assert abs(targets[7] - float(batch[sb.REWARDS][7])) > 0.1

    # each loss term reaches only its part: the rewards move the critics' gradients only
    grad = jax.jit(jax.grad(lambda p, b: loss_fn(p, b)[0]))
    g = grad(ps.params, batch)
    g2 = grad(ps.params, {**batch, sb.REWARDS: batch[sb.REWARDS] + 5.0})
    same = lambda a, b: all(jax.tree.leaves(jax.tree.map(np.allclose, a, b)))
    assert same(g["policy"], g2["policy"]) and same(g["log_alpha"], g2["log_alpha"])
    assert not same(g["q"], g2["q"]) and not same(g["twin_q"], g2["twin_q"])
    assert all(float(jnp.abs(x).max()) == 0 for x in jax.tree.leaves(g["target"]))
    np.testing.assert_allclose(g["log_alpha"], ref["alpha_grad"], rtol=1e-4, atol=1e-6)

    # the alpha step: Adam's first step (eps 1e-7) at entropy_learning_rate 3e-4
    new = jax.jit(policy.apply_gradients)(ps, g)
    step = 3e-4 * ref["alpha_grad"] / (abs(ref["alpha_grad"]) + 1e-7)
    np.testing.assert_allclose(new.params["log_alpha"], np.log(0.5) - step, rtol=1e-6)
    assert same(new.params["target"], ps.params["target"])  # the optimizers leave the targets


def test_no_done_at_end_bootstraps_terminal_rows_and_n_step_discounts():
    rng = np.random.default_rng(4)
    policy = sac_policy(no_done_at_end=True, n_step=3)
    ps = policy.init(jax.random.PRNGKey(0))
    batch = fragment_batch(policy, ps, rng)
    assert not np.asarray(batch[sb.TERMINATEDS]).any()
    # n-step: env 0 row 0 (t=0) sums 3 steps, env 0 t=4 sums 2 (fragment end: t=4, 5)
    np.testing.assert_array_equal(np.asarray(batch[N_STEPS])[[0, 8, 10]], [3, 2, 1])


# ---- the soft target update ----------------------------------------------------------------
def bare_state(policies) -> PlanState:
    return PlanState(
        policies=policies,
        actors=None,
        obs_filters={},
        episodes=None,
        policy_episodes={},
        counters=Counters.zero(),
        key=jax.random.PRNGKey(0),
        stages={},
    )


def test_update_target_is_polyak_every_item_with_freq_0():
    policy = sac_policy(tau=0.1)
    ps = policy.init(jax.random.PRNGKey(1))
    online = jax.tree.map(lambda x: x + 1.0, {"q": ps.params["q"], "twin_q": ps.params["twin_q"]})
    start = ps.params["target"]
    ps = ps.replace(params={**ps.params, **online})
    workers = types.SimpleNamespace(trainable_policies=lambda: ("p",), policies={"p": policy})
    stage = UpdateTargetNetwork(workers, 0)
    state, own = stage.init(bare_state({"p": ps}))
    for _ in range(3):  # no env steps sampled in between: RLlib still updates (0 >= 0)
        state, own, _ = stage.apply(state, own, None)
    assert int(own.num_target_updates) == 3
    got = state.policies["p"].params["target"]
    # three Polyak steps towards a fixed online net: online + 0.9^3 (start - online)
    for name in ("q", "twin_q"):
        ref = jax.tree.map(
            lambda o, s: np.asarray(o, np.float64) + 0.9**3 * (np.asarray(s) - np.asarray(o)),
            online[name],
            start[name],
        )
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got[name], ref
        )
    after = state.policies["p"].params  # the online nets and the policy are left as they were
    for name in ("policy", "q", "twin_q", "log_alpha"):
        assert all(jax.tree.leaves(jax.tree.map(np.array_equal, after[name], ps.params[name])))
    # with a period, sampled steps gate it (RLlib's cur_ts - last_update >= freq)
    stage = UpdateTargetNetwork(workers, 5)
    state, own = stage.init(bare_state({"p": ps}))
    state, own, _ = stage.apply(state, own, None)
    assert int(own.num_target_updates) == 0
    counters = state.counters
    state = state.replace(
        counters=counters.replace(num_steps_sampled=counters.num_steps_sampled.add(5))
    )
    state, own, _ = stage.apply(state, own, None)
    assert int(own.num_target_updates) == 1
    with pytest.raises(ValueError, match=">= 0"):
        UpdateTargetNetwork(workers, -1)


def test_plan_updates_targets_after_every_train_step_and_priorities():
    # native ratio 16/8 = 2: 8 train steps per rollout round of 8 env steps
    config = {**TINY, "training_intensity": 16, "prioritized_replay": True}
    assert calculate_rr_weights(SACConfig().updated(config)) == [1, 8]
    plan = sac_plan(config)
    state = plan.init(jax.random.PRNGKey(0))
    step = jax.jit(plan.step)
    for _ in range(3):
        state, res = step(state)
    r = plan.report(res)
    trained = r["info"]["num_steps_trained"]
    assert r["timesteps_total"] == 96 and trained == 16 * 8 * 9  # replay ready after 4 rounds
    # one soft update per train step, though 8 train steps share one sampled-step count
    assert r["info"]["num_target_updates"] == trained // 16
    ps = state.policies["default_policy"]
    gaps = jax.tree.map(
        lambda a, b: float(jnp.abs(a - b).max()), ps.params["q"], ps.params["target"]["q"]
    )
    assert max(jax.tree.leaves(gaps)) > 0  # soft: the target lags the online net
    # prioritized replay: the replayed rows' priorities come from the per-row TD errors
    name = next(n for n, o in plan.flow.stages if isinstance(o, LocalReplayBuffer))
    assert float(jnp.std(state.stages[name].priorities["default_policy"][:96])) > 0


# ---- config, CLI, runs -------------------------------------------------------------------------
def test_config_defaults_and_errors_name_the_key():
    config = SACConfig()
    assert (config.tau, config.initial_alpha, config.target_entropy) == (5e-3, 1.0, "auto")
    assert (config.train_batch_size, config.target_network_update_freq) == (256, 0)
    assert config.optimization.critic_learning_rate == 3e-4 and config.env == "Pendulum-v1"
    with pytest.raises(ValueError, match="did you mean 'target_entropy'"):
        SACConfig().updated({"target_entrpy": -1})
    with pytest.raises(ValueError, match="config\\['target_entropy'\\]"):
        SACConfig().updated({"target_entropy": "max"})
    with pytest.raises(ValueError, match="config\\['lr'\\].*optimization.actor_learning_rate"):
        SACConfig().updated({"lr": 1e-3})
    with pytest.raises(ValueError, match="config\\['tau'\\]"):
        SACConfig().updated({"tau": 0.0})
    with pytest.raises(ValueError, match="config\\['optimization.entropy_learning_rate'\\]"):
        SACConfig().updated({"optimization": {"entropy_learning_rate": 0}})
    with pytest.raises(ValueError, match="config\\['model'\\].*Q_model"):
        SACConfig().updated({"model": {"fcnet_hiddens": [8]}})
    with pytest.raises(ValueError, match="config\\['normalize_actions'\\]"):
        SACConfig().updated({"normalize_actions": False})
    with pytest.raises(ValueError, match="config\\['Q_model.post_fcnet_activation'\\]"):
        SACConfig().updated({"Q_model": {"post_fcnet_activation": "sigmoidish"}})
    with pytest.raises(ValueError, match="discrete actions are not supported"):
        sac_plan({**TINY, "env": "CartPole-v1"})
    assert SACConfig().updated({"target_entropy": -3}).target_entropy == -3


def test_vmap_over_seeds_equals_sequential_runs():
    from jaxplan.run import make_train, train_seeds

    plan = sac_plan(TINY)
    states, results = train_seeds(plan, [0, 1], 3)
    train = jax.jit(make_train(plan, 3))
    for i, seed in enumerate([0, 1]):
        state, res = train(jax.random.PRNGKey(seed))
        mine = jax.tree.map(lambda x, i=i: x[i], (states.policies, results["episode_reward_mean"]))
        for a, b in zip(
            jax.tree.leaves(mine),
            jax.tree.leaves((state.policies, res["episode_reward_mean"])),
            strict=True,
        ):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert float(jnp.abs(states.policies["default_policy"].params["log_alpha"][0])) > 0


def test_cli_trains_sac_on_pendulum_by_default_and_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    tiny = [
        "--config",
        "timesteps_per_iteration=64",
        "--config",
        "learning_starts=32",
        "--config",
        "Q_model.fcnet_hiddens=[8]",
        "--config",
        "policy_model.fcnet_hiddens=[8]",
        "--no-compile-cache",
    ]
    argv = ["train", "sac", *tiny, "--stop-timesteps", "128", "--output", str(out)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "SAC on Pendulum-v1" in printed and "replayed train step" in printed
    argv = ["train", "sac", "--resume", str(out), "--stop-timesteps", "256", "--no-compile-cache"]
    assert cli.main(argv) == 0
    rows = [json.loads(line) for line in (out / "result.jsonl").read_text().splitlines()]
    assert [r["timesteps_total"] for r in rows] == [64, 128, 192, 256]
    stats = rows[-1]["info"]["learner"]["default_policy"]["learner_stats"]
    assert {"actor_loss", "critic_loss", "alpha_loss", "alpha_value", "mean_q"} <= set(stats)
    params = json.loads((out / "params.json").read_text())
    assert params["algorithm"] == "SAC" and params["config"]["env"] == "Pendulum-v1"
    import jaxplan

    run = jaxplan.load_run(out)
    (metrics,) = run.evaluate(num_episodes=2)
    assert -2000 < metrics["episode_reward_mean"] <= 0


@pytest.mark.slow
def test_sac_learns_pendulum():
    """Budget: up to 30 iterations (30k env steps, one train batch of 256 per env step, ~45 s
    on 2 idle cores) of the Pendulum-v1 preset, seed 0. Measured: episode_reward_mean (window
    100) passes -200 at 26k env steps (seeds 1, 2: 26k, 24k; random play: ~-1200; RLlib's
    tuned example stops at -250 over 5 episodes); the stop here is the first -200."""
    plan = sac_plan()
    state = plan.init(jax.random.PRNGKey(0))
    step = jax.jit(plan.step)
    best = -np.inf
    for _ in range(30):
        state, res = step(state)
        best = max(best, float(res["episode_reward_mean"]))
        if best >= -200:
            break
    assert best >= -200, best
