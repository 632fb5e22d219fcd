"""The XLA options jaxplan compiles its own programs with (`Runner`, so `jaxplan train`, and
`train_seeds`); pass them to your own `jax.jit` of `make_train` for the same compile:

```python
train = jax.jit(jaxplan.make_train(plan, n), compiler_options=jaxplan.compiler_options())
```

On the CPU they are two:

- LLVM's `-O1` (`xla_backend_optimization_level=1`) instead of XLA's default `-O2`: measured
  side by side on PPO programs (2-core CPU; benchmarks/README.md, "Issue 14, 6 December"),
  XLA compile 8-22% less CPU time (one seed at the peers' fixed work 4.71 -> 4.33 CPU-s, 8
  vmapped seeds 6.66 -> 5.22, the MinAtar CNN preset 6.57 -> 5.90) and the same run time
  (0.906 / 0.895 s, 1.348 / 1.341 s, 3.669 / 3.672 s): the kernels' time goes to Eigen's
  matmuls and to memory, not to what `-O2` adds.
- No `tree_reduction_rewriter` (`xla_disable_hlo_passes`): XLA's CPU pass that splits every
  reduction of more than 32 elements into `reduce-window`s of 32 and a last reduce, two or
  three kernels where one does. A PPO program has ~30 such reductions (the finiteness checks
  of every minibatch update, the losses' means, the advantages' statistics), and each kernel
  costs ~3-5 ms of XLA's emission whatever its size: the fixed-work program compiles 289
  kernels instead of 317, 0.88x the compile time (benchmarks/README.md, "Issue 14, 7
  December"), and runs as fast. Long float32 sums stay as accurate (XLA's CPU reduction
  keeps vector accumulators): the mean of 4M values within 1e-7 of float64 either way
  (tests/test_compiler.py).

Floats may round differently in the last bits (e.g. 7.6e-6 at most after 6 fixed-work
iterations), so a run compiled with them is not bitwise the one without; with them, the same
seed still gives the same run. Elsewhere (GPU, TPU) none: XLA's defaults.
"""

from __future__ import annotations

from typing import Any

import jax

CPU_OPTIONS: dict[str, Any] = {
    "xla_backend_optimization_level": 1,
    "xla_disable_hlo_passes": "tree_reduction_rewriter",
}


def compiler_options(platform: str | None = None) -> dict[str, Any] | None:
    """`compiler_options` for `jax.jit` / `Lowered.compile` on `platform` (default: JAX's
    default backend): `CPU_OPTIONS` on the CPU, else None."""
    platform = jax.default_backend() if platform is None else platform
    return dict(CPU_OPTIONS) if platform == "cpu" else None
