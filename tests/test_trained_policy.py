"""`jaxplan.load_policy` and `jaxplan rollout` on a tiny trained CartPole run."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxplan
from jaxplan import cli
from jaxplan.models import ActorCritic
from jaxplan.trained import load_run

TINY = ["--config", "train_batch_size=128", "--config", "model.fcnet_hiddens=[8]"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("policy") / "run"
    flags = [*TINY, "--quiet", "--no-compile-cache", "--stop-iters", "2", "--num-seeds", "2"]
    assert cli.main(["train", "ppo", *flags, "--output", str(out)]) == 0
    return out


def _logits(policy, obs):
    """The actor's logits, applying the flax module to the params independently."""
    cfg = policy.config.model
    model = ActorCritic(tuple(cfg.fcnet_hiddens), cfg.fcnet_activation, 2, 1)
    return np.asarray(model.apply(policy.params, jnp.asarray(obs), method=ActorCritic.policy))


def test_act_single_and_batched(run_dir):
    policy = jaxplan.load_policy(run_dir, seed=1)
    assert policy.observation_shape == (4,) and policy.action_space == jaxplan.envs.Discrete(2)
    run = load_run(run_dir)
    expected = jax.tree.map(lambda x: x[1], run.policy_params()["default_policy"])
    assert jax.tree.all(jax.tree.map(np.array_equal, policy.params, expected))
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    want = np.argmax(_logits(policy, obs), axis=-1)
    batched = np.asarray(policy.act(obs))
    assert batched.shape == (64,) and np.array_equal(batched, want)
    single = [int(policy.act(o)) for o in obs[:5]]
    assert single == want[:5].tolist() and np.shape(policy.act(obs[0])) == ()
    assert np.asarray(policy.value(obs)).shape == (64,)


def test_explore_samples_the_softmax(run_dir):
    policy = jaxplan.load_policy(run_dir)
    obs = np.array([0.1, 0.5, -0.2, 1.5], np.float32)
    p = jax.nn.softmax(_logits(policy, obs))
    draws = np.asarray(policy.act(np.broadcast_to(obs, (4000, 4)), jax.random.PRNGKey(3), True))
    freq = np.bincount(draws, minlength=2) / draws.size
    assert np.allclose(freq, p, atol=0.04), (freq, p)
    assert len(set(draws.tolist())) == 2 or p.max() > 0.999


def test_errors(run_dir):
    policy = jaxplan.load_policy(run_dir)
    with pytest.raises(ValueError, match=r"shape \[4\] or batches \[B, 4\]; got \[3\]"):
        policy.act(np.zeros(3))
    with pytest.raises(ValueError, match="pass a PRNG key"):
        policy.act(np.zeros(4), explore=True)
    with pytest.raises(ValueError, match=r"seed 7 is not one of the run's seeds \[0, 1\]"):
        jaxplan.load_policy(run_dir, seed=7)
    with pytest.raises(ValueError, match="no policy 'pi' in the run; its policies: default"):
        jaxplan.load_policy(run_dir, "pi")
    with pytest.raises(
        ValueError, match=r"env Acrobot-v1 does not fit .*observations \[6\].*CartPole-v1"
    ):
        jaxplan.load_policy(run_dir, env="Acrobot-v1")


def test_checkpoint_that_does_not_fit_the_config(run_dir, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in ("checkpoint.msgpack",):
        (bad / f).write_bytes((run_dir / f).read_bytes())
    params = json.loads((run_dir / "params.json").read_text())
    params["config"]["model"]["fcnet_hiddens"] = [6]
    (bad / "params.json").write_text(json.dumps(params))
    msg = r"checkpoint's state.policies.*Dense_0.*has shape \[2, (4, )?8\], the run's plan \[2, "
    with pytest.raises(ValueError, match=msg):
        jaxplan.load_policy(bad)


def test_cli_rollout_and_gif(run_dir, tmp_path, capsys):
    from PIL import Image  # the render extra (in dev)

    gif = tmp_path / "ep.gif"
    cap = ["--env-config", "max_steps_in_episode=12"]
    argv = ["rollout", str(run_dir), "--episodes", "3", "--run-seed", "1", *cap]
    assert cli.main([*argv, "--seed", "5", "--gif", str(gif)]) == 0
    lines = capsys.readouterr().out.splitlines()
    episodes = [line.split() for line in lines if line.startswith("episode")]
    (r,) = load_run(run_dir).evaluate(
        num_episodes=3, seed=5, seeds=[1], env_config={"max_steps_in_episode": 12}
    )
    assert [float(e[3]) for e in episodes] == r["hist_stats"]["episode_reward"]
    assert [int(e[5]) for e in episodes] == r["hist_stats"]["episode_lengths"]
    assert all(int(e[5]) <= 12 for e in episodes)
    with Image.open(gif) as im:  # one frame per step of episode 1
        assert im.format == "GIF" and im.n_frames == int(episodes[0][5])
    assert [p.name for p in tmp_path.iterdir()] == ["ep.gif"]  # no temporary file left


def test_cli_rollout_refusals(run_dir, tmp_path, capsys):
    argv = ["rollout", str(run_dir)]
    assert cli.main([*argv, "--gif", str(tmp_path / "x.png")]) == 2
    assert "must end in .gif" in capsys.readouterr().err
    assert cli.main([*argv, "--run-seed", "4"]) == 2
    assert "seed 4 is not one of the run's seeds [0, 1]" in capsys.readouterr().err
    from jaxplan.multi_agent import MultiAgentCartPole
    from jaxplan.render import check_renderable

    with pytest.raises(ValueError, match="MultiAgentCartPole cannot be rendered"):
        check_renderable(MultiAgentCartPole())
    with pytest.raises(ValueError, match="DeepSea-bsuite cannot be rendered"):
        check_renderable(jaxplan.Env("DeepSea-bsuite"))
