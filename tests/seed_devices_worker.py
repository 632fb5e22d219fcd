"""Runs in a subprocess started by `test_seed_devices.py`: makes the CPU two devices
(`use_cpu_devices(2)`, before JAX starts), trains seeds split over them and the same seeds on
one device, and prints one JSON line of measurements for the parent test to assert on."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import jax

from jaxplan.fast_rng import unrolled_threefry
from jaxplan.seed_devices import padded_seeds, seed_mesh, use_cpu_devices

out = {"set": use_cpu_devices(2)}  # first: before any JAX operation
out["set_again"] = use_cpu_devices(3)  # the backend has started: refused, nothing changes
out["devices"] = len(jax.devices())

import numpy as np  # noqa: E402

import jaxplan  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import TINY_PPO  # noqa: E402

out["mesh_sizes"] = {n: getattr(seed_mesh(n), "size", 1) for n in (1, 2, 3, 4, 5)}
out["padded"] = {n: padded_seeds(n, seed_mesh(n)) for n in (1, 2, 3, 4, 5)}
plan = jaxplan.ppo_plan(dict(TINY_PPO, env="CartPole-v1"))
seeds = [0, 1, 2, 3]
keys = jax.vmap(jax.random.PRNGKey)(np.asarray(seeds, np.uint32))


def leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def compare(a, b) -> dict:
    """Float leaves' largest absolute difference (NaN where both are NaN: equal), whether they
    are bitwise equal; integer leaves equal."""
    pairs = list(zip(leaves(a), leaves(b), strict=True))
    floats = [(x, y) for x, y in pairs if x.dtype.kind == "f"]
    return {
        "max_diff": max(float(np.nanmax(np.abs(x - y), initial=0.0)) for x, y in floats),
        "nan_equal": all(np.array_equal(np.isnan(x), np.isnan(y)) for x, y in floats),
        "bitwise": all(np.array_equal(x, y, equal_nan=True) for x, y in floats),
        "ints_equal": all(np.array_equal(x, y) for x, y in pairs if x.dtype.kind != "f"),
    }


def placement(tree) -> dict:
    x = jax.tree.leaves(tree)[0]
    return {"devices": len(x.sharding.device_set), "spec": str(getattr(x.sharding, "spec", ""))}


# train_seeds split over the two devices against one device's vmap of the same seeds
state, res = jaxplan.train_seeds(plan, seeds, 3)
one_device = dict(compiler_options=jaxplan.compiler_options())  # lowered as train_seeds
with unrolled_threefry():
    ref = jax.jit(jax.vmap(jaxplan.make_train(plan, 3)), **one_device)(keys)
out["train_seeds"] = {**placement(state), **compare((state, res), ref)}

# an hparams sweep of 3 runs (2 + 2, padded): a per-run lr split with the seeds, a shared
# clip_param on every device
hp = {"default_policy": {"lr": [1e-4, 1e-3, 3e-3], "clip_param": 0.25}}
state, res = jaxplan.train_seeds(plan, seeds[:3], 3, hparams=hp)
axes = {"default_policy": {"lr": 0, "clip_param": None}}
sweep = jax.vmap(jaxplan.make_train(plan, 3), in_axes=(0, axes))
lrs = np.asarray(hp["default_policy"]["lr"], np.float32)
with unrolled_threefry():
    ref = jax.jit(sweep, **one_device)(
        keys[:3], {"default_policy": {"lr": lrs, "clip_param": 0.25}}
    )
out["hparams"] = {**placement(state), **compare((state, res), ref)}
out["hparams"]["rows"] = sorted({x.shape[0] for x in leaves((state, res))})

# 3 seeds: 2 per device, the fourth slot a copy of seed 2, dropped from what comes back
three = seeds[:3]
state3, res3 = jaxplan.train_seeds(plan, three, 3)
with unrolled_threefry():
    ref = jax.jit(jax.vmap(jaxplan.make_train(plan, 3)), **one_device)(keys[:3])
out["three"] = {**placement(state3), **compare((state3, res3), ref)}
out["three"]["rows"] = sorted({x.shape[0] for x in leaves((state3, res3))})

# the Runner, 3 seeds (padded): 4 iterations in chunks of 2, against train_seeds; then
# resumed to 6 iterations against train_seeds' 6
folder = tempfile.mkdtemp()
runner = jaxplan.Runner(plan, three, jaxplan.Stop(training_iteration=4), chunk=2, output=folder)
runner.run()
state4, _ = jaxplan.train_seeds(plan, three, 4)
out["runner"] = {
    "mesh": getattr(runner.seed_mesh, "size", 1),
    "rows": sorted({x.shape[0] for x in leaves(runner.state)}),
    **placement(runner._state),
    **compare(runner.state, state4),
}
runner.close()
stop6 = jaxplan.Stop(training_iteration=6)
resumed = jaxplan.Runner(plan, three, stop6, chunk=2, output=folder, resume=True)
resumed.run()
state6, _ = jaxplan.train_seeds(plan, three, 6)
out["resume"] = {**placement(resumed._state), **compare(resumed.state, state6)}
print(json.dumps(out))
