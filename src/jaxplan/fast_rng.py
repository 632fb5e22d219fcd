"""Unrolled threefry on the CPU: the same random numbers from fewer runtime ops.

JAX lowers its threefry2x32 hash (behind every `jax.random` call with the default PRNG) with
rolled `while` loops on the CPU and unrolled everywhere else. A rollout step of 8 CartPole envs
runs six such loops (key splits, the action sample, the env's auto-reset), about 500 of its
~600 runtime ops. With the unrolled lowering, measured side by side on a 2-core CPU
(benchmarks/README.md, "--unrolled-rng"): acting alone 1.7-2.8x, one-seed PPO at the peers'
fixed work 1.0-1.4x, 8 vmapped seeds no gain (0.94-0.98x), about 1.2 s more cold compile.
The random bits are identical (same hash, same counters): a run takes the same actions and
episodes, and its floats differ only by rounding (XLA fuses the other program differently).

This needs JAX internals (`jax._src`), isolated here: `use_unrolled_threefry` returns False and
leaves JAX alone when they are not where this module expects them, and
tests/test_fast_rng.py fails loudly when an upgrade moves them. It is process-wide and applies
to programs lowered after the call (already compiled ones keep their lowering).
"""

from __future__ import annotations

import functools


@functools.cache
def _internals():
    """`(mlir, threefry2x32_p, unrolled_rule, rolled_rule)`, or None if JAX moved them."""
    try:
        from jax._src.interpreters import mlir
        from jax._src.random import threefry2x32 as t

        return (
            mlir,
            t.threefry2x32_p,
            t._threefry2x32_lowering_rule,  # unrolled, out of line (JAX's non-CPU default)
            t._threefry2x32_cpu_lowering_rule,  # rolled loops (JAX's CPU default)
        )
    except (ImportError, AttributeError):
        return None


def use_unrolled_threefry(enable: bool = True) -> bool:
    """Lower threefry unrolled on the CPU (`enable=True`) or with JAX's rolled loops again
    (`False`) for programs compiled from now on. Returns whether the lowering was set (False:
    this JAX keeps its internals elsewhere; nothing changed)."""
    internals = _internals()
    if internals is None:
        return False
    mlir, primitive, unrolled, rolled = internals
    if enable:
        mlir.register_lowering(primitive, unrolled, platform="cpu", inline=False)
    else:
        mlir.register_lowering(primitive, rolled, platform="cpu")
    return True
