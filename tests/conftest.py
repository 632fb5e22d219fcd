import os
import signal

# Keep XLA from grabbing every core's thread pool in odd ways on the 2-core CI machines, and make
# tests independent of a user's persistent compilation cache.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# The Ctrl-C tests need Ctrl-C to be Ctrl-C. A shell starts a background job (`make test &`,
# `nohup ... &`) with SIGINT ignored, Python then keeps it ignored, and so does every child
# it starts: the CLI rightly ignores SIGINT then, and those tests would hang. Run them as in
# the foreground: pytest and its children get Python's KeyboardInterrupt handler.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

TINY_PPO = {
    "num_workers": 2,
    "num_envs_per_worker": 2,
    "rollout_fragment_length": 16,
    "train_batch_size": 64,
    "sgd_minibatch_size": 16,
    "num_sgd_iter": 2,
    "model": {"fcnet_hiddens": [16, 16]},
}


def assert_same_run(a, b, rtol: float, atol: float) -> None:
    """Two runs' outputs (pytrees) are the same run up to float rounding: integer leaves
    (counters, episodes, actions taken) equal, float leaves allclose."""
    import jax
    import numpy as np

    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x, y = np.asarray(x), np.asarray(y)
        if np.issubdtype(x.dtype, np.floating):
            np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(x, y)


def pytest_configure(config):
    """Start JAX's backend (one CPU device) before any test: `jaxplan train --num-seeds N`
    called in-process would otherwise make the CPU one device per core for the whole worker
    when it runs first (`jaxplan.seed_devices.use_cpu_devices`), and tests after it would see
    two devices. Tests that need several devices start subprocesses."""
    import jax

    jax.devices()


def run_json_worker(args: list[str], env: dict, timeout: float = 600) -> dict:
    """Runs `python ARGS` with `env` (e.g. several CPU devices, which must be set before JAX
    starts) and returns the JSON object its last stdout line holds; fails with its stderr's
    tail when it exits non-zero."""
    import json
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
