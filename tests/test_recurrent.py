"""Recurrent policies (`model.use_lstm`): the sequence layout and the in-chunk state resets
against hand-computed cases and a float64 numpy LSTM, the learner's replay of the acting
log-probs (ratio 1) in bulk_sync and async rollouts, whole sequences in shuffled minibatches,
config errors, 2 fake devices == 1, checkpoint/resume and the CLI, and the memory task
(bsuite's MemoryChain) that the LSTM solves and a feed-forward policy cannot."""

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
from jaxplan import batch as sb
from jaxplan import cli
from jaxplan.config import ModelConfig
from jaxplan.envs import Discrete
from jaxplan.models import RecurrentNet, build_model
from jaxplan.ppo.config import preset_config
from jaxplan.ppo.plan import build_workers
from jaxplan.recurrent import episode_starts, replay_fragment, replay_sequences, to_sequences
from jaxplan.stages.rollouts import Rollouts

MEMORY = "MemoryChain-bsuite"  # 6-step episodes: a +-1 cue at step 0, +-1 reward at step 5
TINY_LSTM = {
    "num_workers": 2,
    "num_envs_per_worker": 2,
    "rollout_fragment_length": 24,
    "train_batch_size": 96,
    "sgd_minibatch_size": 16,
    "num_sgd_iter": 1,
    "model": {
        "fcnet_hiddens": [8],
        "use_lstm": True,
        "lstm_cell_size": 8,
        "max_seq_len": 8,  # chunks [0, 8), [8, 16), [16, 24): episode ends inside them
        "lstm_use_prev_action": True,
        "lstm_use_prev_reward": True,
    },
}


# ---- sequence layout and resets, hand-computed -----------------------------------------------
def test_to_sequences_hand_computed():
    # rows of 4 time steps x 2 envs (time-major), value 10 t + n; max_seq_len 2
    t, n = np.meshgrid(np.arange(4), np.arange(2), indexing="ij")
    rows = {
        sb.OBS: jnp.asarray((10 * t + n).reshape(-1), jnp.float32),
        sb.state_in(0): jnp.asarray((100 + 10 * t + n).reshape(-1, 1), jnp.float32),
    }
    seqs = to_sequences(rows, time_steps=4, max_seq_len=2)
    # sequence c x N + n: steps 2c, 2c + 1 of env n
    np.testing.assert_array_equal(seqs[sb.OBS], [[0, 10], [1, 11], [20, 30], [21, 31]])
    # the state only at each sequence's first step
    np.testing.assert_array_equal(seqs[sb.state_in(0)][:, 0], [100, 101, 120, 121])
    with pytest.raises(ValueError, match="max_seq_len=3"):
        to_sequences(rows, time_steps=4, max_seq_len=3)


def test_episode_starts_hand_computed():
    done = jnp.asarray([[False, True], [True, False], [False, False], [True, True]])
    np.testing.assert_array_equal(
        episode_starts(done), [[False, False], [False, True], [True, False], [False, False]]
    )


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _np_lstm_net(params, obs, h, c, prev_action, prev_reward):
    """float64 numpy reference of the default recurrent net (one fcnet layer of tanh, then
    one-hot previous action and previous reward, flax's LSTM cell, linear heads)."""
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), params["params"])

    def dense(layer, x):
        return x @ layer["kernel"] + layer.get("bias", 0.0)

    x = np.tanh(dense(p["torso"]["Dense_0"], obs))
    x = np.concatenate([x, np.eye(2)[prev_action], [prev_reward]])
    cell = p["cell"]
    gate = {g: dense(cell["i" + g], x) + dense(cell["h" + g], h) for g in "ifgo"}
    c = _sigmoid(gate["f"]) * c + _sigmoid(gate["i"]) * np.tanh(gate["g"])
    h = _sigmoid(gate["o"]) * np.tanh(c)
    return dense(p["pi_head"], h), dense(p["v_head"], h)[0], h, c


def test_replay_resets_the_state_after_episode_ends_hand_computed():
    """One env, a fragment of 6 steps cut into chunks of 3, episodes ending at steps 1 and 4
    (inside the chunks). The state each step must see: step 0 the stored chunk start, 1 the
    state after 0, 2 zeros (a new episode), 3 the stored start of chunk 1 (an arbitrary
    vector here: the replay must take it, not the state after step 2), 4 the state after 3,
    5 zeros. Checked against a float64 numpy LSTM, for the fragment replay (postprocessing)
    and the learner's sequence replay."""
    config = ModelConfig(
        fcnet_hiddens=(4,),
        use_lstm=True,
        lstm_cell_size=3,
        lstm_use_prev_action=True,
        lstm_use_prev_reward=True,
    )
    net = build_model((2,), 2, config, Discrete(2))
    assert isinstance(net, RecurrentNet)
    params = net.init(jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    steps = 6
    obs, next_obs = rng.normal(size=(steps, 2)), rng.normal(size=(steps, 2))
    actions, rewards = rng.integers(0, 2, steps), rng.normal(size=steps)
    done = np.array([False, True, False, False, True, False])
    chunk1_start = rng.normal(size=(2, 3))  # (h, c) stored at step 3

    # the reference: what each step sees, by the rule above
    h, c = np.zeros(3), np.zeros(3)
    state_in, logits, values, next_values = [], [], [], []
    for t in range(steps):
        if t == 3:
            h, c = chunk1_start
        elif t > 0 and done[t - 1]:
            h, c = np.zeros(3), np.zeros(3)
        pa = 0 if t == 0 or done[t - 1] else actions[t - 1]
        pr = 0.0 if t == 0 or done[t - 1] else rewards[t - 1]
        state_in.append((h, c, pa, pr))
        lg, v, h, c = _np_lstm_net(params, obs[t], h, c, pa, pr)
        logits.append(lg)
        values.append(v)
        next_values.append(_np_lstm_net(params, next_obs[t], h, c, actions[t], rewards[t])[1])
    seen = np.array([s[0] for s in state_in])
    assert not seen[[2, 5]].any() and np.array_equal(seen[3], chunk1_start[0])

    traj = {  # [T, B=1]
        sb.OBS: jnp.asarray(obs[:, None], jnp.float32),
        sb.NEXT_OBS: jnp.asarray(next_obs[:, None], jnp.float32),
        sb.ACTIONS: jnp.asarray(actions[:, None], jnp.int32),
        sb.REWARDS: jnp.asarray(rewards[:, None], jnp.float32),
        sb.TERMINATEDS: jnp.asarray(done[:, None]),
        sb.TRUNCATEDS: jnp.zeros((steps, 1), bool),
        sb.state_in(0): jnp.asarray([s[0] for s in state_in], jnp.float32)[:, None],
        sb.state_in(1): jnp.asarray([s[1] for s in state_in], jnp.float32)[:, None],
        sb.PREV_ACTIONS: jnp.asarray([s[2] for s in state_in], jnp.int32)[:, None],
        sb.PREV_REWARDS: jnp.asarray([s[3] for s in state_in], jnp.float32)[:, None],
    }
    # the stored states inside the chunks (steps 1, 2, 4, 5) must not be read: poison them
    poison = jnp.asarray([0, 1, 1, 0, 1, 1], bool)[:, None, None]
    for i in (0, 1):
        traj[sb.state_in(i)] = jnp.where(poison, 1e3, traj[sb.state_in(i)])
    inputs, vf, nv = replay_fragment(net, params, traj, max_seq_len=3)
    np.testing.assert_allclose(inputs[:, 0], np.array(logits), atol=1e-5)
    np.testing.assert_allclose(vf[:, 0], values, atol=1e-5)
    np.testing.assert_allclose(nv[:, 0], next_values, atol=1e-5)

    rows = {k: v.reshape(steps, *v.shape[2:]) for k, v in traj.items()}
    seqs = to_sequences(rows, time_steps=steps, max_seq_len=3)
    inputs, vf, flat = replay_sequences(net, params, seqs)
    np.testing.assert_allclose(inputs, np.array(logits), atol=1e-5)
    np.testing.assert_allclose(vf, values, atol=1e-5)
    np.testing.assert_array_equal(flat[sb.ACTIONS], actions)


# ---- acting and the learner's replay ---------------------------------------------------------
@pytest.mark.parametrize("mode", ["bulk_sync", "async"])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_learner_replays_the_acting_log_probs(mode, cell):
    """One rollout round, then the learner's pass over its sequences with the same params:
    the log-probs (ratio 1) and values the actors had, every stored state obeying the reset
    rule (zero, and no previous action or reward, after an episode end; else the previous
    step's action and reward). Async: the fragment spans two segments (T / 2 groups = 12
    steps), so the state carried across the segment boundary is replayed too."""
    config = {**TINY_LSTM, "rollout_mode": mode}
    config["model"] = {**TINY_LSTM["model"], "lstm_cell_type": cell}
    workers = build_workers(preset_config(MEMORY, config))
    state = workers.init(jax.random.PRNGKey(1))
    rollouts = Rollouts(workers, mode=mode)
    state, rs = rollouts.init(state)
    for _ in range(2 if mode == "async" else 1):
        state, rs, batch = jax.jit(rollouts.apply)(state, rs)
    pb = batch.policy_batches["default_policy"]
    policy = workers.policies["default_policy"]
    params = state.policies["default_policy"].params

    steps = batch.time_steps
    traj = jax.tree.map(lambda x: np.asarray(x).reshape(steps, -1, *x.shape[1:]), pb)
    done = traj[sb.TERMINATEDS] | traj[sb.TRUNCATEDS]
    assert done[:-1].any()
    starts = np.concatenate([np.zeros_like(done[:1]), done[:-1]])
    assert not traj[sb.state_in(0)][starts].any()
    assert not traj[sb.PREV_ACTIONS][starts].any() and not traj[sb.PREV_REWARDS][starts].any()
    cont = ~starts[1:]
    np.testing.assert_array_equal(traj[sb.PREV_ACTIONS][1:][cont], traj[sb.ACTIONS][:-1][cont])
    np.testing.assert_array_equal(traj[sb.PREV_REWARDS][1:][cont], traj[sb.REWARDS][:-1][cont])
    assert np.abs(traj[sb.state_in(0)][1:][cont]).min(axis=-1).max() > 0

    seqs = to_sequences(pb, steps, policy.max_seq_len)
    inputs, values, rows = policy.forward(params, seqs)
    logp = policy.dist.log_prob(inputs, rows[sb.ACTIONS])
    np.testing.assert_allclose(logp, rows[sb.ACTION_LOGP], atol=2e-6)
    np.testing.assert_allclose(values, rows[sb.VF_PREDS], atol=2e-6)
    # the feed-forward reading of the same rows (no state) would differ
    zero = {k: jnp.zeros_like(v) if k.startswith("state_in") else v for k, v in seqs.items()}
    logp0 = policy.dist.log_prob(policy.forward(params, zero)[0], rows[sb.ACTIONS])
    assert np.abs(logp0 - rows[sb.ACTION_LOGP]).max() > 1e-4


def test_shuffled_minibatches_hold_whole_sequences(monkeypatch):
    """Epochs of shuffled minibatches (6 sequences of 8 steps per minibatch of 48 steps) with
    a vanishing learning rate: each minibatch's replay from its stored states gives the
    acting log-probs, so the KL is ~0. Control: the same with every sequence given another
    sequence's start state (a layout bug) has a KL far from 0."""
    config = {**TINY_LSTM, "lr": 0.01, "sgd_minibatch_size": 48, "num_sgd_iter": 2}

    def kl():
        plan = jaxplan.ppo_plan(config, env=MEMORY)
        state = plan.init(jax.random.PRNGKey(0))
        step = jax.jit(plan.step)
        for _ in range(6):  # away from the near-uniform initial policy
            state, _ = step(state)
        ps = state.policies["default_policy"]
        ps = ps.replace(hparams=ps.hparams.replace(lr=jnp.float32(1e-12)))
        _, result = step(state.replace(policies={"default_policy": ps}))
        stats = result["info"]["learner"]["default_policy"]["learner_stats"]
        assert np.isfinite(float(stats["total_loss"]))
        return float(stats["kl"])

    assert kl() < 1e-9
    from jaxplan.stages import train_one_step

    def misaligned(rows, time_steps, max_seq_len):
        seqs = to_sequences(rows, time_steps, max_seq_len)
        return {k: jnp.roll(v, 1, 0) if k.startswith("state_in") else v for k, v in seqs.items()}

    monkeypatch.setattr(train_one_step, "to_sequences", misaligned)
    assert kl() > 1e-6


# ---- configuration ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("algo", "overrides", "message"),
    [
        ("ppo", {"model": {"lstm_cell_sise": 8}}, "did you mean 'model.lstm_cell_size'"),
        ("ppo", {"model": {"use_lstm": True, "max_seq_len": 0}}, "model.max_seq_len"),
        ("ppo", {"model": {"use_lstm": True, "lstm_cell_size": 0}}, "model.lstm_cell_size"),
        (
            "ppo",
            {"rollout_fragment_length": 30, "model": {"use_lstm": True, "max_seq_len": 20}},
            "must divide rollout_fragment_length (30).*max_seq_len=15",
        ),
        ("ppo", {"model": {"use_lstm": True, "lstm_cell_type": "rnn"}}, "'lstm', 'gru'"),
        (
            "ppo",
            {"model": {"use_lstm": True, "custom_model": "jaxplan.models:ActorCritic"}},
            "not model.custom_model",
        ),
        (
            "a2c",
            {"microbatch_size": 100, "model": {"use_lstm": True}},
            "microbatch_size.*not the sequences",
        ),
        ("a3c", {"model": {"use_lstm": True}}, "not supported by A3C"),
        ("impala", {"model": {"use_lstm": True}}, "not supported by IMPALA"),
        ("appo", {"model": {"use_lstm": True}}, "not supported by APPO"),
        ("dqn", {"model": {"use_lstm": True}}, "not supported by DQN"),
        ("sac", {"model": {"use_lstm": True}}, "not supported by SAC"),
    ],
)
def test_config_errors(algo, overrides, message):
    from jaxplan.algorithms import get_algorithm

    config_class = get_algorithm(algo).config_class
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config_class.from_dict(overrides)


def test_defaults_are_rllibs():
    model = ModelConfig()
    assert (model.use_lstm, model.lstm_cell_size, model.max_seq_len) == (False, 256, 20)
    assert not model.lstm_use_prev_action and not model.lstm_use_prev_reward
    assert model.lstm_cell_type == "lstm"


def test_minibatch_of_sequences_must_split_across_devices():
    from jaxplan.stages.train_one_step import TrainOneStep

    workers = build_workers(preset_config(MEMORY, TINY_LSTM))
    stage = TrainOneStep(workers, sgd_minibatch_size=20)
    assert stage._sequences_per_minibatch(12, 8) == 3  # ceil(20 / 8), RLlib's count
    with pytest.raises(ValueError, match="needs 3 sequences"):
        stage._sequences_per_minibatch(2, 8)


# ---- devices, checkpoints, CLI ---------------------------------------------------------------
DEVICES_SCRIPT = r"""
import json, sys
import jax, numpy as np
import jaxplan
config = json.loads(sys.argv[1])
out = {}
for mode in ("bulk_sync", "async"):
    states = []
    for n in ((0, 2) if mode == "bulk_sync" else (2,)):
        c = {**config, "rollout_mode": mode}
        if n:
            c.update(num_devices=n, _fake_gpus=True)
        plan = jaxplan.ppo_plan(c, env="MemoryChain-bsuite")
        state = plan.init(jax.random.PRNGKey(0))
        step = jax.jit(plan.step)
        for _ in range(2):
            state, result = step(state)
        stats = result["info"]["learner"]["default_policy"]["learner_stats"]
        assert np.isfinite(float(stats["total_loss"]))
        states.append(state)
    if len(states) == 1:
        continue
    one, two = (jax.tree.leaves(s.policies) for s in states)
    out[mode] = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
                    for a, b in zip(one, two, strict=True))
print(json.dumps(out))
"""


def test_two_fake_devices_match_one():
    """bulk_sync: the same data on 2 devices (each steps its own actor groups and replays
    half of every minibatch's sequences) gives the 1-device update up to rounding. Async
    emits one fragment per device (its data depend on the device count): it runs on 2."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    config = {**TINY_LSTM, "grad_clip": None, "num_sgd_iter": 2}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(DEVICES_SCRIPT), json.dumps(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    diffs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert diffs["bulk_sync"] < 1e-5, diffs


def _rows(directory):
    out = []
    for line in (directory / "result.jsonl").read_text().splitlines():
        row = json.loads(line)
        for key in ("time_this_iter_s", "time_total_s", "num_env_steps_sampled_throughput_per_sec"):
            row.pop(key)
        out.append(row)
    return out


def test_cli_resume_and_evaluation(tmp_path, capsys):
    """`jaxplan train ppo --config model.use_lstm=true ...` with evaluation: 2 iterations, then
    resumed to 3 == 3 at once (the actors' recurrent states are in the checkpoint; the
    evaluation envs carry theirs); a loaded recurrent policy refuses stateless `act`. (The
    recurrent MemoryChain preset is trained in the learning test.)"""
    tiny = ["--config", "model.use_lstm=true", "--config", "model.lstm_cell_size=16"]
    tiny += ["--config", "model.max_seq_len=16", "--config", "train_batch_size=256"]
    tiny += ["--config", "num_sgd_iter=1", "--config", "evaluation_interval=1"]
    tiny += ["--config", "evaluation_duration=4", "--quiet", "--no-compile-cache"]
    a, b = tmp_path / "a", tmp_path / "b"
    argv = ["train", "ppo", "--env", "CartPole-v1", *tiny]
    assert cli.main([*argv, "--stop-iters", "2", "--output", str(a)]) == 0
    assert cli.main(["train", "ppo", "--resume", str(a), "--stop-iters", "3", *tiny[-2:]]) == 0
    assert cli.main([*argv, "--stop-iters", "3", "--output", str(b)]) == 0
    resumed, whole = _rows(a), _rows(b)
    assert len(whole) == 3 and resumed == whole
    assert all(r["evaluation"]["episodes_this_iter"] >= 4 for r in whole)
    model = json.loads((a / "params.json").read_text())["config"]["model"]
    assert model["use_lstm"] is True and model["max_seq_len"] == 16
    policy = jaxplan.load_policy(a)
    for method in (policy.act, policy.value):
        with pytest.raises(ValueError, match="is recurrent"):
            method(np.zeros(4, np.float32))
    # RLlib's max_seq_len (20) does not cut the CartPole preset's 32-step fragments
    capsys.readouterr()
    assert cli.main(["train", "ppo", "--config", "model.use_lstm=true", "--stop-iters", "1"]) == 2
    assert "must divide rollout_fragment_length (32)" in capsys.readouterr().err


# ---- learning --------------------------------------------------------------------------------
@pytest.mark.slow
def test_lstm_solves_the_memory_task_a_feed_forward_policy_cannot():
    """MemoryChain (bsuite, memory length 5): the reward at step 6 is +1 for repeating the cue
    shown at step 1 only, -1 else; the last observation holds no cue, so a feed-forward policy
    is at chance (return 0). The preset's LSTM (32 cells, chunks of 12 steps, the cue and
    episode ends mid-chunk), seeds 0-1 vmapped: >= 0.9 from iteration ~12 (seeds 0-2 measured
    to 40 iterations on the 2-core CPU machine); budget 30 iterations (23k env steps), the
    mean of the last 5 >= 0.9. The same budget with an MLP of [32, 32]: within +-0.3 of 0
    from iteration 5 (the mean of ~128 +-1 episodes per iteration: sd 0.09). ~55 s for both,
    compiles included."""
    iters = 30
    plan = jaxplan.ppo_plan(env=MEMORY)
    assert plan.workers.policies["default_policy"].recurrent
    _, results = jaxplan.train_seeds(plan, [0, 1], iters)
    returns = np.asarray(results["episode_reward_mean"])
    assert (returns[:, -5:].mean(axis=1) >= 0.9).all(), returns

    mlp = jaxplan.ppo_plan({"model": {"use_lstm": False, "fcnet_hiddens": [32, 32]}}, env=MEMORY)
    _, results = jaxplan.train_seeds(mlp, [0, 1], iters)
    returns = np.asarray(results["episode_reward_mean"])
    assert (np.abs(returns[:, 5:]) < 0.3).all(), returns


@pytest.mark.slow
def test_a2c_lstm_solves_the_memory_task():
    """A2C's recurrent preset (PPO's network, one gradient step on the whole batch of
    sequences per iteration), seeds 0-1 vmapped: >= 0.9 by iteration ~40-50 (seeds 0-2
    measured); budget 60 iterations (46k env steps, ~25 s with the compile), the mean of the
    last 5 >= 0.85."""
    from jaxplan.algorithms import get_algorithm

    plan = get_algorithm("a2c").plan(env=MEMORY)
    assert plan.workers.policies["default_policy"].recurrent
    _, results = jaxplan.train_seeds(plan, [0, 1], 60)
    returns = np.asarray(results["episode_reward_mean"])
    assert (returns[:, -5:].mean(axis=1) >= 0.85).all(), returns
