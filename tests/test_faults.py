"""Faults and bad input: non-finite training, Ctrl-C while compiling, one-line errors.

Issue 11, point 5 (numeric and input parts). CLI behaviour is tested through subprocesses
where the process itself matters (exit status on a signal, the end-to-end stop), else through
`cli.main` in-process (the same code, cheaper); every subprocess is bounded in time.
"""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY_PPO
from flax import serialization

from jaxplan import cli
from jaxplan.envs import Env
from jaxplan.policy import PolicyState
from jaxplan.ppo.config import PPOConfig
from jaxplan.shuffle import random_permutation
from jaxplan.stages.train_one_step import NONFINITE_STATS, all_finite, sgd_epochs

TINY = [
    "--config",
    "num_workers=1",
    "--config",
    "num_envs_per_worker=2",
    "--config",
    "rollout_fragment_length=16",
    "--config",
    "train_batch_size=32",
    "--config",
    "sgd_minibatch_size=16",
    "--config",
    "num_sgd_iter=1",
    "--config",
    "model.fcnet_hiddens=[8]",
    "--quiet",
]
# Pendulum with a torque bound of 1e30: the reward's u^2 overflows to -inf (a finite config)
INF_REWARDS = ["--env", "Pendulum-v1", "--config", "env_config.max_torque=1e30"]


def _cli(args, tmp_path, timeout=240, **kw):
    env = {**os.environ, "JAXPLAN_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run(
        [sys.executable, "-m", "jaxplan.cli", "train", "ppo", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        **kw,
    )


def _one_line_error(capsys, argv, code=2) -> str:
    assert cli.main(["train", "ppo", *argv]) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("jaxplan: error: "), err
    return err[0]


# ---- 1. non-finite config values, rejected up front -----------------------------------------
@pytest.mark.parametrize(
    "overrides,key",
    [
        ({"lr": float("inf")}, "'lr'"),
        ({"entropy_coeff": float("inf")}, "'entropy_coeff'"),
        ({"gamma": float("nan")}, "'gamma'"),
        ({"env_config": {"g": float("nan")}}, "'env_config.g'"),
        ({"lr_schedule": [[0, 1e-3], [100, float("inf")]]}, "'lr_schedule[1][1]'"),
        ({"multiagent": {"policies": {"p": {"lr": float("-inf")}}}}, "'multiagent.policies.p.lr'"),
        ({"train_batch_size": 10**12}, "'train_batch_size'"),
        ({"model": {"fcnet_hiddens": [2**31]}}, "'model.fcnet_hiddens[0]'"),
    ],
)
def test_config_refuses_non_finite_and_out_of_range_numbers(overrides, key):
    with pytest.raises(ValueError, match=r"config\[" + key.replace("[", r"\[").replace("]", r"\]")):
        PPOConfig.from_dict(overrides)


def test_json_infinity_and_nan_parse_to_floats_the_config_refuses():
    assert cli._parse_value("Infinity") == float("inf")
    assert np.isnan(cli._parse_value("NaN"))
    with pytest.raises(ValueError, match=r"config\['lr'\] = inf: must be finite"):
        PPOConfig.from_dict(cli.parse_overrides(["lr=Infinity"]))


def test_env_config_values_are_checked_against_the_env_params():
    with pytest.raises(ValueError, match=r"env_config\['max_steps_in_episode'\] = 'abc'.*integer"):
        Env("CartPole-v1", max_steps_in_episode="abc")
    with pytest.raises(ValueError, match=r"env_config\['gravity'\] = True.*a number"):
        Env("CartPole-v1", gravity=True)
    with pytest.raises(ValueError, match=r"available_torque.*shape \[3\]"):
        Env("Acrobot-v1", available_torque=[1.0, 2.0])
    env = Env("CartPole-v1", max_steps_in_episode=100.0, gravity=5)  # JSON's ways of writing
    assert env.params.max_steps_in_episode == 100 and isinstance(
        env.params.max_steps_in_episode, int
    )
    assert env.params.gravity == 5.0 and isinstance(env.params.gravity, float)


# ---- 1. non-finite updates are not applied ---------------------------------------------------
class _SquarePolicy:
    """loss = mean over rows of `w * x` (x may be NaN/inf), plain SGD `w -= lr * g`."""

    def __init__(self, lr, named_stat=None):
        self.lr, self.named_stat = lr, named_stat

    def loss(self, params, hparams, kl_coeff, batch):
        loss = jnp.mean(params["w"] * batch["x"])
        stats = {"mean_x": jnp.mean(batch["x"])}
        if self.named_stat:
            stats[self.named_stat] = loss
        return loss, stats

    def apply_gradients(self, state, grads):
        return state.replace(params={"w": state.params["w"] - self.lr * grads["w"]})


def _reference_sgd(x, w, lr, minibatch):
    """float64 numpy: minibatches in order; an update with a non-finite loss or step is
    skipped; returns (w, skipped count)."""
    skipped = 0
    for mb in x.reshape(-1, minibatch):
        loss, g = np.mean(w * mb), np.mean(mb)
        if not (np.isfinite(loss) and np.isfinite(g) and np.isfinite(w - lr * g)):
            skipped += 1
            continue
        w = w - lr * g
    return w, skipped


@pytest.mark.parametrize(
    "named_stat,bad,code_name",
    [
        (None, np.nan, "total_loss"),
        ("vf_loss", np.inf, "vf_loss"),  # a non-finite loss term is named before the total
    ],
)
def test_sgd_skips_non_finite_minibatch_updates(named_stat, bad, code_name):
    x = np.linspace(0.5, 2.0, 24).astype(np.float32)
    x[9] = bad  # minibatch 2 of 4 (size 6, no shuffle): its update must not be applied
    policy = _SquarePolicy(lr=0.1, named_stat=named_stat)
    state = PolicyState(
        params={"w": jnp.float32(1.0)},
        opt_state=None,
        hparams=None,
        kl_coeff=jnp.float32(0),
        version=jnp.int32(0),
    )
    run = jax.jit(
        sgd_epochs, static_argnums=0, static_argnames=("num_sgd_iter", "minibatch_size", "shuffle")
    )
    out, stats = run(
        policy,
        state,
        {"x": jnp.asarray(x)},
        jax.random.PRNGKey(0),
        num_sgd_iter=1,
        minibatch_size=6,
        shuffle=False,
    )
    want, skipped = _reference_sgd(x.astype(np.float64), 1.0, 0.1, 6)
    assert skipped == 1
    np.testing.assert_allclose(float(out.params["w"]), want, rtol=1e-6)
    assert int(stats["num_nonfinite_updates"]) == 1
    assert NONFINITE_STATS[int(stats["first_nonfinite_stat"]) - 1] == code_name
    assert not np.isfinite(float(stats["mean_x"]))  # the means still show the NaN minibatch


def test_sgd_skips_an_update_that_makes_params_non_finite():
    x = np.full((8,), 1e30, np.float32)  # finite loss and gradient, w - 1e10 * 1e30 = -inf
    policy = _SquarePolicy(lr=1e10)
    state = PolicyState({"w": jnp.float32(0.0)}, None, None, jnp.float32(0), jnp.int32(0))
    out, stats = sgd_epochs(
        policy,
        state,
        {"x": jnp.asarray(x)},
        jax.random.PRNGKey(0),
        num_sgd_iter=2,
        minibatch_size=4,
    )
    assert float(out.params["w"]) == 0.0
    assert int(stats["num_nonfinite_updates"]) == 4
    assert NONFINITE_STATS[int(stats["first_nonfinite_stat"]) - 1] == "params"


def test_guarded_sgd_is_bitwise_the_plain_update_when_finite():
    """The select must not change a finite run: PPO's sgd_epochs against the previous,
    unguarded minibatch loop (grad, apply, scan), bitwise."""
    import jaxplan

    plan = jaxplan.ppo_plan({**TINY_PPO, "grad_clip": 0.5}, env="CartPole-v1")
    policy = plan.workers.policies["default_policy"]
    state = jax.jit(plan.init)(jax.random.PRNGKey(0))
    key = jax.random.PRNGKey(1)
    ks = jax.random.split(key, 4)
    batch = {  # PPO's fields with plausible values
        "obs": jax.random.normal(ks[0], (64, 4)),
        "actions": jax.random.randint(ks[1], (64,), 0, 2),
        "action_logp": jnp.full((64,), -0.69),
        "action_dist_inputs": jnp.zeros((64, 2)),
        "advantages": jax.random.normal(ks[2], (64,)),
        "vf_preds": jnp.zeros((64,)),
        "value_targets": jax.random.normal(ks[3], (64,)),
    }
    ps = state.policies["default_policy"]

    def plain(ps, batch, key):
        def mb_step(ps, mb):
            grads, stats = jax.grad(policy.loss, has_aux=True)(
                ps.params, ps.hparams, ps.kl_coeff, mb
            )
            return policy.apply_gradients(ps, grads), stats

        def epoch(ps, k):
            idx = random_permutation(k, 64).reshape(4, 16)
            return jax.lax.scan(mb_step, ps, jax.tree.map(lambda x: x[idx], batch))

        ps, stats = jax.lax.scan(epoch, ps, jax.random.split(key, 3))
        return ps, jax.tree.map(jnp.mean, stats)

    guarded = jax.jit(
        lambda ps, b, k: sgd_epochs(policy, ps, b, k, num_sgd_iter=3, minibatch_size=16)
    )
    new, stats = guarded(ps, batch, key)
    ref, ref_stats = jax.jit(plain)(ps, batch, key)
    for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(ref), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for name, value in ref_stats.items():
        np.testing.assert_array_equal(np.asarray(stats[name]), np.asarray(value))
    assert int(stats["num_nonfinite_updates"]) == 0 and int(stats["first_nonfinite_stat"]) == 0


# ---- 1. the CLI stops, names the iteration and the stat, keeps a finite checkpoint ----------
def test_cli_stops_after_non_finite_iterations_in_a_row(tmp_path):
    out = tmp_path / "run"
    args = [*TINY, *INF_REWARDS, "--stop-iters", "6", "--report-every", "1"]
    proc = _cli([*args, "--max-nonfinite-iters", "2", "--output", str(out)], tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    err = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr
    assert any(
        ln.startswith("jaxplan: warning: seed 0, iteration 1: the env's rewards are not finite")
        for ln in err
    ), err
    assert err[-1].startswith("jaxplan: error: training is not finite: seed 0, iteration 2: 2")
    assert "first non-finite: policy_loss" in err[-1]
    rows = [json.loads(ln) for ln in (out / "result.jsonl").read_text().splitlines()]
    assert [r["training_iteration"] for r in rows] == [1, 2]
    info = rows[-1]["info"]["learner"]["default_policy"]
    assert info["learner_stats"]["num_nonfinite_updates"] == 2  # 2 minibatches, both skipped
    assert info["first_nonfinite_stat"] == "policy_loss"
    assert info["num_nonfinite_rewards"] == 32  # every sampled reward is -inf
    from jaxplan.ppo.config import PPOConfig
    from jaxplan.ppo.plan import build_workers, execution_plan
    from jaxplan.results import read_checkpoint

    saved = read_checkpoint(out)
    params = saved["state"]["policies"]["default_policy"]["params"]
    leaves = jax.tree.leaves(params)
    assert leaves and all(np.all(np.isfinite(np.asarray(x))) for x in leaves)
    # no update was applied: the checkpointed params are the initial ones, bitwise
    config = PPOConfig.from_dict(json.loads((out / "params.json").read_text())["config"])
    plan = execution_plan(build_workers(config), config)
    fresh = jax.jit(plan.init)(jax.random.PRNGKey(0)).policies["default_policy"].params
    fresh = jax.tree.leaves(serialization.to_state_dict(jax.device_get(fresh)))
    assert len(fresh) == len(leaves)
    for a, b in zip(leaves, fresh, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ---- 2. Ctrl-C while XLA compiles: exit 130 with the message, every time ---------------------
def test_sigint_during_compile_exits_130_every_time(tmp_path):
    args = [*TINY, "--stop-iters", "50", "--no-compile-cache"]
    for delays in ([0.3], [1.2], [0.2, 0.3]):  # the last: a second Ctrl-C exits at once
        proc = subprocess.Popen(
            [sys.executable, "-m", "jaxplan.cli", "train", "ppo", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
        )
        try:
            line = proc.stdout.readline()  # printed just before compiling
            assert line.startswith("jaxplan: PPO on"), line
            for delay in delays:
                time.sleep(delay)
                proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=180)
        finally:
            proc.kill()
        assert proc.returncode == 130, (delays, proc.returncode, stderr[-2000:])
        assert stderr.strip().splitlines()[-1] == "jaxplan: interrupted", stderr[-2000:]
        assert "Traceback" not in stderr and "iter " not in stdout


# ---- 3. one-line errors (exit 2) -------------------------------------------------------------
def test_seed_out_of_uint32_range_is_a_one_line_error(tmp_path):
    proc = _cli(["--seed", "4294967296", "--stop-iters", "1"], tmp_path, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "jaxplan: error: --seed 4294967296 --num-seeds 1: seeds must be < 2**32 "
        "(4,294,967,296; PRNG keys are uint32), the last would be 4294967296"
    ]


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--config", "train_batch_size=1000000000000"], "config['train_batch_size']"),
        (["--config", 'env_config.max_steps_in_episode="abc"'], "max_steps_in_episode"),
        (["--seed", "4294967295", "--num-seeds", "2"], "seeds must be < 2**32"),
        (["--config", "lr=Infinity"], "config['lr'] = inf: must be finite"),
        (["--config", "entropy_coeff=Infinity"], "config['entropy_coeff'] = inf"),
        (["--env", "Pendulum-v1", "--config", "env_config.g=NaN"], "config['env_config.g']"),
    ],
)
def test_bad_values_are_one_line_errors(capsys, argv, needle):
    assert needle in _one_line_error(capsys, [*TINY, *argv, "--stop-iters", "1"])


def test_yaml_syntax_error_is_one_line_with_file_and_line(capsys, tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("lr: 0.001\nmodel:\n  fcnet_hiddens: [64, 64\nnum_workers: 1\n")
    msg = _one_line_error(capsys, ["--config", str(path)])
    assert msg.startswith(f"jaxplan: error: --config {path}:4:")
    assert "flow sequence at line 3" in msg


def test_yaml_exponent_without_dot_is_refused_with_a_hint(capsys, tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("lr: 1e-3\n")
    msg = _one_line_error(capsys, ["--config", str(path)])
    assert "YAML 1.1 reads 1e-3 as a string; write 0.001 or 1.0e-3" in msg
    path.write_text("lr: 1.0e-3\nmodel:\n  fcnet_hiddens: [8]\n")  # YAML's float form works
    assert cli._load_file(str(path)) == {"lr": 0.001, "model": {"fcnet_hiddens": [8]}}


def test_buffers_that_cannot_fit_in_memory_are_refused_before_compiling(capsys):
    t0 = time.perf_counter()
    msg = _one_line_error(capsys, [*TINY, "--config", "num_envs_per_worker=100000000"])
    assert "the run needs about" in msg and "GiB available" in msg, msg
    assert "num_envs_per_worker" in msg
    assert time.perf_counter() - t0 < 60


def test_all_finite_checks_every_float_leaf_whatever_its_dtype_or_shape():
    """The one-vector check (`all_finite` concatenates the float leaves) agrees with a
    per-leaf numpy check: a bad value in any leaf, of any float dtype, is found; integer and
    bool leaves are ignored; a tree without float leaves is finite."""
    tree = {
        "w": jnp.ones((3, 4)),
        "b": jnp.zeros((4,), jnp.bfloat16),
        "count": jnp.int32(7),
        "flag": jnp.array([True, False]),
        "s": jnp.float32(2.0),
    }
    assert bool(jax.jit(all_finite)(tree))
    for leaf, index, bad in [
        ("w", (2, 3), np.nan),
        ("b", (0,), np.inf),
        ("s", (), -np.inf),
    ]:
        broken = dict(tree)
        broken[leaf] = tree[leaf].at[index].set(bad)
        expected = all(
            np.all(np.isfinite(np.asarray(x, np.float64)))
            for x in jax.tree.leaves(broken)
            if jnp.issubdtype(x.dtype, jnp.inexact)
        )
        assert expected is False
        assert not bool(jax.jit(all_finite)(broken)), leaf
    assert bool(all_finite({"n": jnp.int32(1), "m": jnp.array([True])}))
    assert bool(all_finite({}))
