"""Seeds split over devices (`jaxplan.seed_devices`).

Several CPU devices must be set before JAX starts, so the checks with two devices run
`tests/seed_devices_worker.py` (and the CLI) in subprocesses; this process has one CPU device
(conftest starts JAX's backend), where nothing is split."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import TINY_PPO, run_json_worker
from jax.sharding import PartitionSpec as P

from jaxplan import ppo_plan
from jaxplan.seed_devices import (
    SEED_AXIS,
    cpu_cores,
    pad_seeds,
    padded_seeds,
    seed_mesh,
    spread_seeds,
    use_cpu_devices,
)

ROOT = Path(__file__).resolve().parents[1]
# measured: bitwise equal (0.0) for TINY_PPO; the bound allows last-bit rounding of XLA's
# programs for 2 and 4 seeds, which need not be the same
MAX_DIFF = 1e-5


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    return {**env, "JAX_PLATFORMS": "cpu", **extra}


@pytest.fixture(scope="module")
def two_devices() -> dict:
    return run_json_worker([str(ROOT / "tests" / "seed_devices_worker.py")], _env())


def test_use_cpu_devices_before_jax_starts_and_not_after(two_devices):
    assert two_devices["set"] and two_devices["devices"] == 2
    assert not two_devices["set_again"]  # refused once JAX runs: still 2 devices
    assert not use_cpu_devices(2) and len(jax.devices()) == 1  # this process: started
    with pytest.raises(ValueError, match="num_devices must be an int >= 1"):
        use_cpu_devices(0)
    assert cpu_cores() >= 1


def test_xla_flags_device_count_wins():
    code = (
        "import jax; from jaxplan.seed_devices import use_cpu_devices; "
        "print(use_cpu_devices(2), len(jax.devices()))"
    )
    flags = _env(XLA_FLAGS="--xla_force_host_platform_device_count=3")
    for env in (flags, _env(JAX_NUM_CPU_DEVICES="1")):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-2000:]
        expected = "False 3" if "XLA_FLAGS" in env else "False 1"
        assert out.stdout.split() == expected.split()


def test_seed_mesh_gives_each_device_as_few_seeds_as_it_can(two_devices):
    # 3 and 5 seeds on 2 devices: 2 and 3 per device, one slot padded
    assert two_devices["mesh_sizes"] == {"1": 1, "2": 2, "3": 2, "4": 2, "5": 2}
    assert two_devices["padded"] == {"1": 1, "2": 2, "3": 4, "4": 4, "5": 6}
    assert seed_mesh(8) is None and padded_seeds(8, None) == 8  # one device here
    x = np.arange(6.0).reshape(3, 2)
    np.testing.assert_array_equal(pad_seeds({"a": x}, 4)["a"], [[0, 1], [2, 3], [4, 5], [4, 5]])
    plan = ppo_plan({"num_workers": 1, "num_envs_per_worker": 2, "train_batch_size": 400})
    assert seed_mesh(4, plan.workers.mesh) is None

    def f(x):
        return x + 1

    assert spread_seeds(f, None) is f


@pytest.mark.parametrize("which", ["train_seeds", "hparams", "three", "runner", "resume"])
def test_seeds_split_over_two_devices_train_as_on_one(two_devices, which):
    """`train_seeds` with 4 seeds split 2 + 2, with 3 seeds (2 + 2, one slot a copy: dropped)
    and a 3-run lr sweep with a shared clip, a 3-seed Runner, and that Runner resumed, against
    the same seeds vmapped on one device (lowered the same way) / `train_seeds`: the same run,
    computed on both devices."""
    out = two_devices[which]
    assert out["devices"] == 2
    if which not in ("three", "hparams"):  # split along the seed axis (the Runner's padded
        # state too); the 3 runs train_seeds returns are cut from 4 inside its program, placed
        # as XLA chose
        assert out["spec"] == str(P(SEED_AXIS))
    assert out["ints_equal"] and out["nan_equal"]
    assert out["max_diff"] <= MAX_DIFF, out
    if which in ("three", "hparams", "runner"):
        assert out["rows"] == [3]  # what comes back: the 3 seeds, not the padded slot
    if which == "runner":
        assert out["mesh"] == 2


def test_cli_splits_several_seeds_over_the_cores(tmp_path):
    """`jaxplan train --num-seeds 2` makes the CPU one device per core (2 given here) and
    splits the seeds; `--cpu-devices 1` keeps one device; an XLA_FLAGS count wins, said; with
    `--num-devices 2` the two CPU devices are the plan's data-parallel mesh instead."""
    cli = [sys.executable, "-m", "jaxplan.cli", "train", "ppo", "--num-seeds", "2"]
    cli += ["--stop-iters", "1", "--no-compile-cache", "--quiet"]
    for key, value in TINY_PPO.items():
        cli += ["--config", f"{key}={json.dumps(value)}"]
    runs = {
        # the data-parallel mesh over the CPU devices --cpu-devices makes: no seed split
        "mesh": (["--cpu-devices", "2", "--num-devices", "2"], _env()),
        "split": (["--cpu-devices", "2"], _env()),
        "one": (["--cpu-devices", "1"], _env()),
        "flags": (
            ["--cpu-devices", "2"],
            _env(XLA_FLAGS="--xla_force_host_platform_device_count=1"),
        ),
    }
    procs = {
        k: subprocess.Popen(
            [*cli, *flags, "--output", str(tmp_path / k)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k, (flags, env) in runs.items()
    }
    outs = {k: p.communicate(timeout=600) for k, p in procs.items()}
    for k, p in procs.items():
        assert p.returncode == 0, outs[k][1][-3000:]
    assert "seeds over 2 cpu devices (1 each)" in outs["split"][0]
    assert "| 2 cpu devices (data-parallel)" in outs["mesh"][0]
    assert "| 1 cpu device" in outs["one"][0] and "| 1 cpu device" in outs["flags"][0]
    assert "--cpu-devices 2: the CPU device count was set already" in outs["flags"][1]
    rows = {k: (tmp_path / k / "result.jsonl").read_text().splitlines() for k in runs}
    split, one, mesh = ([json.loads(r) for r in rows[k]] for k in ("split", "one", "mesh"))
    assert [r["seed"] for r in split] == [0, 1] == [r["seed"] for r in one]
    for a, b, c in zip(split, one, mesh, strict=True):  # the same data (per-group keys)
        assert a["timesteps_total"] == b["timesteps_total"] == c["timesteps_total"]
        assert a["episodes_total"] == b["episodes_total"] == c["episodes_total"]
