"""The command line: end-to-end training to 475, result files, one-line errors."""

import json
import os
import subprocess
import sys

import pytest

from jaxplan import cli


def test_cli_trains_cartpole_to_475_end_to_end(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "JAXPLAN_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "jaxplan.cli",
            "train",
            "ppo",
            "--env",
            "CartPole-v1",
            "--stop-reward",
            "475",
            "--stop-timesteps",
            "150000",
            "--output",
            str(out),
            "--print-every",
            "0",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("iter")]
    assert lines and "episode_reward_mean" in lines[0] and "env_steps/s" in lines[0]
    results = [json.loads(ln) for ln in (out / "result.jsonl").read_text().splitlines()]
    assert len(results) == len(lines)  # one line printed and one object written per iteration
    last = results[-1]
    assert last["episode_reward_mean"] >= 475
    assert last["timesteps_total"] <= 150_000
    assert [r["training_iteration"] for r in results] == list(range(1, len(results) + 1))
    for key in (
        "timesteps_total",
        "episode_len_mean",
        "episodes_this_iter",
        "time_this_iter_s",
        "agent_timesteps_total",
        "episode_reward_min",
        "episode_reward_max",
    ):
        assert key in last
    stats = last["info"]["learner"]["default_policy"]["learner_stats"]
    assert set(stats) >= {
        "cur_kl_coeff",
        "cur_lr",
        "total_loss",
        "policy_loss",
        "vf_loss",
        "vf_explained_var",
        "kl",
        "entropy",
        "entropy_coeff",
    }
    assert last["info"]["num_steps_trained"] == last["timesteps_total"]
    params = json.loads((out / "params.json").read_text())
    assert params["config"]["env"] == "CartPole-v1"
    assert "reached episode_reward_mean" in proc.stdout


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["train", "ppo", "--config", "lamda=0.9"], "did you mean 'lambda'"),
        (["train", "ppo", "--config", "lr=-1"], "config['lr']"),
        (["train", "ppo", "--config", "model.fcnet_hiddens=abc"], "a list of integers"),
        (["train", "ppo", "--config", "no_such_file.yaml"], "no such file"),
        (["train", "ppo", "--env", "CartPol-v1"], "Did you mean 'CartPole-v1'"),
        (["train", "ppo", "--num-seeds", "0"], "--num-seeds must be >= 1"),
        (["train", "ppo", "--stop-timesteps", "-5"], "--stop-timesteps must be >= 1"),
        (["train", "ppo", "--config", "sgd_minibatch_size=100000"], "<= train_batch_size"),
        (["train", "ddpg"], "invalid choice"),
        (["train", "ppo", "--output", __file__ + "/sub"], "cannot write results"),
        (["train", "ppo", "--bogus"], "unrecognized arguments"),
    ],
)
def test_bad_input_is_a_one_line_error(argv, fragment, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_config_file_and_overrides(tmp_path):
    f = tmp_path / "cfg.yaml"
    f.write_text("lr: 0.001\nmodel:\n  fcnet_hiddens: [32, 32]\n")
    overrides = cli.parse_overrides(
        [str(f), "lr=2e-3", "grad_clip=None", "shuffle_sequences=false"]
    )
    assert overrides == {
        "lr": 2e-3,
        "model": {"fcnet_hiddens": [32, 32]},
        "grad_clip": None,
        "shuffle_sequences": False,
    }
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(cli.UsageError, match="cannot parse"):
        cli.parse_overrides([str(bad)])


def test_existing_results_are_kept(tmp_path):
    from jaxplan.results import ResultWriter

    (tmp_path / "result.jsonl").write_text('{"old": 1}\n')
    writer = ResultWriter(tmp_path, {"seeds": [0]})
    writer.write([{"new": 2, "episode_reward_mean": float("nan")}])
    assert (tmp_path / "result.1.jsonl").read_text() == '{"old": 1}\n'
    # strict JSON: NaN (no episode finished yet) is written as null
    assert (tmp_path / "result.jsonl").read_text() == '{"new": 2, "episode_reward_mean": null}\n'
    assert writer.kept == [(tmp_path / "result.jsonl", tmp_path / "result.1.jsonl")]


def test_async_throughput_counts_the_true_steps_per_iteration(tmp_path, capsys):
    # async: each round emits one group's fragment (4 envs x 32 steps = 128 env steps), so a
    # train batch of 600 takes ceil(600 / 128) = 5 rounds = 640 env steps, not 2 x 512
    out = tmp_path / "run"
    argv = ["train", "ppo", "--stop-iters", "3", "--report-every", "3", "--no-compile-cache"]
    argv += ["--print-every", "0"]  # a line per iteration (default: at most every 10 s)
    argv += ["--output", str(out), "--config", 'rollout_mode="async"']
    argv += ["--config", "train_batch_size=600", "--config", "model.fcnet_hiddens=[8]"]
    argv += ["--config", "num_sgd_iter=1", "--config", "sgd_minibatch_size=128"]
    assert cli.main(argv) == 0
    stdout = capsys.readouterr().out
    assert "4 groups x 4 envs x 32 steps, train batch >= 600 env steps" in stdout
    lines = [ln for ln in stdout.splitlines() if ln.startswith("iter")]
    results = [json.loads(ln) for ln in (out / "result.jsonl").read_text().splitlines()]
    assert len(lines) == len(results) == 3
    for line, r in zip(lines, results, strict=True):
        assert r["timesteps_this_iter"] == 640
        assert r["timesteps_total"] == 640 * r["training_iteration"]
        rate = r["timesteps_this_iter"] / r["time_this_iter_s"]
        assert r["num_env_steps_sampled_throughput_per_sec"] == pytest.approx(rate)
        printed = float(line.split("env_steps/s")[1].split()[0].replace(",", ""))
        assert abs(printed - rate) <= 0.5
