"""Multi-device and multi-process training on CPU.

Several devices need `XLA_FLAGS=--xla_force_host_platform_device_count=N` before JAX starts,
so those checks run `tests/devices_worker.py` or the CLI in subprocesses; the errors and
helpers that need one device run here.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import serialization

from jaxplan import MultiGPUTrainOneStep, PPOConfig, TrainOneStep, build_workers, ppo_plan
from jaxplan.checkpoint import restore, save
from jaxplan.cli import main
from jaxplan.devices import make_mesh
from jaxplan.distributed import check_replicated, resolve_settings

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "devices_worker.py"


def _env(num_devices: int) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={num_devices}"
    env.pop("JAX_COORDINATOR_ADDRESS", None)
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _popen(args, num_devices: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, *args],
        env=_env(num_devices),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


WORKERS = [("equivalence", 1), ("equivalence", 2), ("equivalence", 4), ("equivalence", 8)]
WORKERS += [("solve", 4), ("async", 2), ("ma", 2), ("evaluation", 4)]
WORKERS += [("plan", 2), ("plan", 4), ("plan_ma", 2)]
CLI_COMMON = ["--stop-iters", "4", "--report-every", "2", "--no-compile-cache", "--seed", "5"]


class _Subprocesses:
    """Every multi-device check of this module, started at once: the subprocesses are mostly
    single-threaded compiles, so running them side by side keeps both cores busy."""

    def __init__(self, tmp: Path):
        self.workers = {(mode, n): _popen([str(WORKER), mode, str(n)], n) for mode, n in WORKERS}
        port = _free_port()
        self.multi_dir, self.single_dir = tmp / "multi", tmp / "single"
        cli = ["-m", "jaxplan.cli", "train", "ppo", *CLI_COMMON]
        multi = [
            *cli,
            *["--output", str(self.multi_dir), "--coordinator-address", f"127.0.0.1:{port}"],
            *["--num-processes", "2", "--process-id"],
        ]
        self.cli = [_popen([*multi, str(i)], 2) for i in range(2)]
        self.cli.append(_popen([*cli, "--output", str(self.single_dir), "--num-devices", "4"], 4))

    def worker(self, mode: str, n: int) -> dict:
        proc = self.workers[(mode, n)]
        stdout, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stderr[-3000:]
        return json.loads(stdout.strip().splitlines()[-1])

    def cli_outputs(self) -> list[tuple[str, str]]:
        outs = [p.communicate(timeout=900) for p in self.cli]
        for p, (_, stderr) in zip(self.cli, outs, strict=True):
            assert p.returncode == 0, stderr[-3000:]
        return outs


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    procs = _Subprocesses(tmp_path_factory.mktemp("devices"))
    yield procs
    for p in [*procs.workers.values(), *procs.cli]:
        if p.poll() is None:
            p.kill()


# ---- N devices == 1 device ------------------------------------------------------------------
# Tolerance: the N-device update differs from the 1-device one only by float32 summation order
# (a mean of N shard means instead of one mean; all-reduced sums). Measured: <= 6e-8 on params
# of magnitude ~1 after 16 Adam steps, <= 4e-7 on standardized advantages; asserted with margin.
PARAMS_ATOL = 1e-6
STATS_ATOL = 1e-5


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_n_devices_match_one_device(launched, n):
    out = launched.worker("equivalence", n)
    assert out["devices"] == n and out["mesh"] == n
    # sharded rollouts: each device steps its own actor groups, yet together they produce the
    # one-device data row for row (per-group keys), the same episode window and counters
    assert out["rollout_actions_equal"]
    assert out["rollout_max_diff"] <= 1e-6
    assert out["episodes_equal"] and out["counters_equal"]
    # StandardizeFields uses global statistics; MultiGPUTrainOneStep computes TrainOneStep's update
    assert out["standardized_max_diff"] <= 1e-5
    assert out["params_changed"] > 1e-2  # the update is real, so agreement means something
    assert out["params_max_diff"] <= PARAMS_ATOL
    assert out["opt_state_max_diff"] <= PARAMS_ATOL
    for key, diff in out["stats_max_diff"].items():
        assert diff <= STATS_ATOL, (key, diff)
    if n > 1:
        assert out["divergence_caught"]


# Whole iterations: the gathered train batch has the one-device row order, so the shuffled
# minibatches hold the same rows on any number of devices. Measured <= 6e-8 after 2 iterations
# (16 Adam steps); with device-major rows (the old gather) 0.04 to 0.05, as large as the update.
@pytest.mark.parametrize("mode,n", [("plan", 2), ("plan", 4), ("plan_ma", 2)])
def test_whole_ppo_iterations_on_n_devices_match_one_device(launched, mode, n):
    out = launched.worker(mode, n)
    assert out["mesh"] == n
    assert out["gather_rows_ok"]
    assert out["policies"] == (["default_policy"] if mode == "plan" else ["p0", "p1"])
    assert out["params_changed"] > 1e-2  # the update is real, so agreement means something
    assert out["params_max_diff"] <= 1e-5, out


def test_evaluation_on_four_devices_is_one_devices(launched):
    out = launched.worker("evaluation", 4)
    assert out["equal"], out
    assert out["evaluation"]["episodes_this_iter"] == 5
    assert len(out["evaluation"]["hist_stats"]["episode_reward"]) == 5


def test_ppo_on_four_devices_solves_cartpole(launched):
    out = launched.worker("solve", 4)
    assert out["mesh"] == 4
    assert out["episode_reward_mean"] >= 475.0, out
    assert out["timesteps_total"] <= 150_000


def test_async_on_two_devices_staggers_groups_per_device(launched):
    out = launched.worker("async", 2)
    assert out["mesh"] == 2
    # 4 groups per device: the warm-up ramp, then groups/device - 1 = 3 train steps of lag
    assert out["lag_max"] == [0, 1, 2, 3, 3, 3, 3, 3]
    assert out["steps_per_iter"] == 2 * 2 * 8  # one fragment (2 envs x 8 steps) per device
    assert len(out["group_versions"]) == 8


def test_multi_agent_on_two_devices(launched):
    out = launched.worker("ma", 2)
    # each policy's rows from 2 devices are the 1-device rows
    assert out["rollout_max_diff"]["p0"] <= 1e-6 and out["rollout_max_diff"]["p1"] <= 1e-6
    # async on 2 devices x 4 groups (8 actor groups), one train step per round: lag 3 per policy
    assert out["lag_max"] == {"p0": [0, 1, 2, 3, 3, 3], "p1": [0, 1, 2, 3, 3, 3]}
    assert out["policy_reward_keys"] == ["p0", "p1"]
    assert out["agent_steps"] == 2 * out["env_steps"]


# ---- two processes x two devices == one process x four devices -----------------------------
def _leaves(path: Path) -> list[tuple[str, np.ndarray]]:
    """The checkpointed policies' and counters' leaves (the whole run state is checkpointed;
    env states may differ once float rounding of the all-reduce flips an action)."""
    tree = serialization.msgpack_restore(path.read_bytes())["state"]
    tree = {"policies": tree["policies"], "counters": tree["counters"]}
    return [
        (jax.tree_util.keystr(p), np.asarray(x))
        for p, x in jax.tree_util.tree_leaves_with_path(tree)
    ]


def test_two_processes_match_one_process(launched):
    outs = launched.cli_outputs()
    multi_dir, single_dir = launched.multi_dir, launched.single_dir
    # the mesh spans both processes' devices; only process 0 prints and writes
    assert "4 cpu devices on 2 processes" in outs[0][0]
    assert "jaxplan" not in outs[1][0] and "iter" not in outs[1][0]
    assert sorted(f.name for f in multi_dir.iterdir()) == [
        "checkpoint.msgpack",
        "checkpoints",
        "params.json",
        "progress.csv",
        "result.jsonl",
        "tb",
    ]
    multi = [json.loads(line) for line in (multi_dir / "result.jsonl").read_text().splitlines()]
    ref = [json.loads(line) for line in (single_dir / "result.jsonl").read_text().splitlines()]
    assert [r["timesteps_total"] for r in multi] == [512, 1024, 1536, 2048]
    for a, b in zip(multi, ref, strict=True):
        assert a["episodes_total"] == b["episodes_total"]
        assert a["episode_reward_mean"] == pytest.approx(b["episode_reward_mean"], rel=1e-4)
        stats_a = a["info"]["learner"]["default_policy"]["learner_stats"]
        stats_b = b["info"]["learner"]["default_policy"]["learner_stats"]
        for key in stats_b:
            assert stats_a[key] == pytest.approx(stats_b[key], rel=1e-3, abs=1e-5), key
    # the processes agreed on params at every chunk (the CLI checks; a mismatch exits non-zero)
    # and the final params equal the one-process run's up to all-reduce summation order
    got, want = (
        _leaves(multi_dir / "checkpoint.msgpack"),
        _leaves(single_dir / "checkpoint.msgpack"),
    )
    assert [k for k, _ in got] == [k for k, _ in want]
    for (key, a), (_, b) in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5, err_msg=key)


# ---- errors before any work -----------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides,key,text",
    [
        ({"num_devices": 2, "num_gpus": 4}, "num_gpus", "disagrees with num_devices"),
        ({"num_gpus": -2}, "num_gpus", "-1 (all devices)"),
        ({"num_gpus": 0.5}, "num_gpus", "integer"),
    ],
)
def test_bad_device_config_is_a_clear_error(overrides, key, text):
    with pytest.raises(ValueError, match=re.escape(text)) as err:
        PPOConfig().updated({"num_workers": 4, **overrides})
    assert repr(key) in str(err.value)


def test_more_devices_than_exist_is_a_clear_error():
    n = jax.device_count() + 1
    with pytest.raises(
        ValueError, match=r"only 1 cpu device.*xla_force_host_platform_device_count"
    ):
        make_mesh(n)
    config = PPOConfig().updated({"num_devices": 2 * n, "num_workers": 2 * n})
    with pytest.raises(ValueError, match="num_devices"):
        build_workers(config)


def test_cli_device_errors_are_one_line(capsys):
    # mesh divisibility is checked by its owners (WorkerSet, MultiGPUTrainOneStep) as the CLI
    # builds the plan on 4 devices, before anything compiles
    cli = ["-m", "jaxplan.cli", "train", "ppo", "--num-devices", "4", "--stop-iters", "1"]
    cli += ["--no-compile-cache", "--config"]
    procs = [
        _popen([*cli, "num_workers=2"], 4),
        _popen([*cli, "sgd_minibatch_size=130"], 4),
    ]
    expected = [
        "num_workers=2: 2 actor group(s) cannot be split evenly across 4 devices",
        "sgd_minibatch_size (130) does not split evenly across 4 devices; use a multiple of 4",
    ]
    for proc, text in zip(procs, expected, strict=True):
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 2 and err.count("\n") == 1 and text in err, err
    argv = ["train", "ppo", "--num-devices", "8", "--config", "num_workers=8", "--stop-iters", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "num_devices=8 but only 1 cpu device" in err
    assert main(["train", "ppo", "--num-processes", "2", "--stop-iters", "1"]) == 2
    err = capsys.readouterr().err
    assert "coordinator_address" in err and "process_id" in err


def test_resolve_settings_from_flags_and_environment():
    assert resolve_settings(environ={}) is None
    env = {
        "JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234",
        "JAX_NUM_PROCESSES": "4",
        "JAX_PROCESS_ID": "3",
    }
    assert resolve_settings(environ=env) == {
        "coordinator_address": "10.0.0.1:1234",
        "num_processes": 4,
        "process_id": 3,
    }
    # flags win over the environment
    assert resolve_settings(process_id=1, environ=env)["process_id"] == 1
    with pytest.raises(ValueError, match="HOST:PORT"):
        resolve_settings("10.0.0.1", 2, 0, environ={})
    with pytest.raises(ValueError, match=r"process_id must be in \[0, num_processes=2\)"):
        resolve_settings("h:1", 2, 2, environ={})
    with pytest.raises(ValueError, match="missing: num_processes"):
        resolve_settings("h:1", None, 0, environ={})


def test_multi_gpu_train_one_step_checks_its_arguments():
    workers = build_workers(PPOConfig().updated({"num_workers": 2}))
    with pytest.raises(ValueError, match="num_gpus=2.*no device"):
        MultiGPUTrainOneStep(workers, sgd_minibatch_size=32, num_sgd_iter=1, num_gpus=2)
    # without a mesh it is TrainOneStep
    step = MultiGPUTrainOneStep(workers, sgd_minibatch_size=32, num_sgd_iter=1, num_gpus=0)
    assert isinstance(step, TrainOneStep)


def test_one_device_mesh_is_the_plain_plan():
    """num_devices=1 runs the plan inside a 1-device shard_map: same numbers as no mesh."""
    config = {"rollout_fragment_length": 8, "train_batch_size": 128, "sgd_minibatch_size": 64}
    outs = []
    for n in (0, 1):
        plan = ppo_plan({**config, "num_devices": n}, env="CartPole-v1")
        assert (plan.workers.mesh is None) == (n == 0)
        state = plan.init(jax.random.PRNGKey(0))
        state, result = jax.jit(plan.step)(state)
        outs.append((state.policies, result))
    np.testing.assert_allclose(
        np.concatenate([np.ravel(x) for x in jax.tree.leaves(outs[0])]),
        np.concatenate([np.ravel(x) for x in jax.tree.leaves(outs[1])]),
        rtol=1e-6,
        atol=1e-7,
    )


def test_check_replicated_and_checkpoint_roundtrip(tmp_path):
    tree = {"w": jnp.arange(6.0).reshape(2, 3), "n": jnp.int32(7)}
    check_replicated(tree)  # one device: trivially identical
    path = save(tmp_path / "ckpt.msgpack", {"seeds": [0, 1], "tree": tree})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.msgpack"]  # no temp file left
    target = {"seeds": [0, 0], "tree": {"w": jnp.zeros((2, 3)), "n": jnp.int32(0)}}
    back = restore(path, target)
    np.testing.assert_array_equal(back["tree"]["w"], tree["w"])
    assert int(back["tree"]["n"]) == 7 and list(back["seeds"]) == [0, 1]
