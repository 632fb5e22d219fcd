"""Unrolled threefry on the CPU: the same random numbers from fewer runtime ops.

JAX lowers its threefry2x32 hash (behind every `jax.random` call with the default PRNG) with
rolled `while` loops on the CPU and unrolled everywhere else. A rollout step of 8 CartPole envs
runs several such loops (key splits, the action sample, the env's auto-reset), most of its
runtime ops. The random bits are identical with either lowering (same hash, same counters): a
run takes the same actions and episodes, and its floats differ only by rounding (XLA fuses
the other program differently).

Measured side by side on a 2-core CPU (benchmarks/README.md, "--unrolled-rng" and "Issue 14,
6 December"), since envs and action noise draw over one flat batch axis: for one seed, acting
alone 1.3-1.5x, PPO at the peers' fixed work 0.96-1.10x, ~0.7 s more XLA compile; for 8
`vmap`ped seeds, PPO 1.06-1.09x and ~20% less compile. So `train_seeds` and a several-seed
`Runner` lower with it (`unrolled_threefry`); for one seed it is opt-in
(`use_unrolled_threefry`, `jaxplan train --unrolled-rng`).

This needs JAX internals (`jax._src`), isolated here: `use_unrolled_threefry` returns False and
leaves JAX alone when they are not where this module expects them, and
tests/test_fast_rng.py fails loudly when an upgrade moves them. The lowering is process-wide
and applies to programs lowered after the switch (already compiled ones keep theirs).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator


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


_unrolled = False  # the lowering this module last registered


def use_unrolled_threefry(enable: bool = True) -> bool:
    """Lower threefry unrolled on the CPU (`enable=True`) or with JAX's rolled loops again
    (`False`) for programs compiled from now on. Returns whether the lowering was set (False:
    this JAX keeps its internals elsewhere; nothing changed)."""
    global _unrolled
    internals = _internals()
    if internals is None:
        return False
    mlir, primitive, unrolled, rolled = internals
    if enable:
        mlir.register_lowering(primitive, unrolled, platform="cpu", inline=False)
    else:
        mlir.register_lowering(primitive, rolled, platform="cpu")
    _unrolled = enable
    return True


@contextlib.contextmanager
def unrolled_threefry() -> Iterator[bool]:
    """Programs lowered inside the block use the unrolled lowering; the previous one is back
    after it. Yields whether the unrolled lowering is in force.

    `train_seeds` and a `Runner` of several seeds lower their `vmap`ped programs so: with a
    seed axis the rolled loops' bodies are rank-2 arrays, costly to compile and run, while
    the unrolled hash is not. Measured side by side (PPO at the peers' fixed work, 8 seeds
    `vmap`ped, 2-core CPU; benchmarks/README.md, "Issue 14, 6 December"): XLA
    compile 6.1-6.3 -> 4.9-5.0 CPU-s, steps/s 1.09x. With one seed it is a trade-off (acting
    faster, ~0.7 s more compile), so there it stays opt-in."""
    before = _unrolled
    ok = use_unrolled_threefry(True)
    try:
        yield ok
    finally:
        if ok:
            use_unrolled_threefry(before)
