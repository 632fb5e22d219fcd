"""Unrolled threefry on the CPU: the same random numbers from fewer runtime ops.

JAX lowers its threefry2x32 hash (behind every `jax.random` call with the default PRNG) with
rolled `while` loops on the CPU and unrolled everywhere else. A rollout step of 8 CartPole envs
runs several such loops (the action sample, the env's auto-reset), most of its runtime ops.
The random bits are identical with either lowering (same hash, same counters): a run takes
the same actions and episodes, and its floats differ at most by rounding (XLA fuses the other
program differently).

Two scopes (measured side by side on a 2-core CPU: benchmarks/README.md, "--unrolled-rng",
"Issue 14, 6 December" and "Issue 14, 6 December (later)"):
- **The rollouts' steps** (`unrolled_here`, always on the CPU): the rollout stage traces its
  segment inside it, so only the env steps' hashes are unrolled. Acting alone 2.1x (with
  the segment's keys derived before its `scan`), PPO at the peers' fixed work 1.08-1.09x;
  the whole program unrolled made PPO's SGD epochs slower (~1.22 against ~0.93 ms each).
- **The whole program** (`use_unrolled_threefry`, `unrolled_threefry`): `train_seeds` and a
  several-seed `Runner` lower their `vmap`ped programs so (with a seed axis every rolled loop
  body is a rank-2 array, slow to compile and run: PPO 1.06-1.09x, ~20% less compile); for
  one seed it is opt-in (`jaxplan train --unrolled-rng`): it adds only the SGD epochs'
  hashes, and PPO is no faster for it.

This needs JAX internals (`jax._src`; the region is marked with
`jax.experimental.xla_metadata`), isolated here: the functions return False and leave JAX
alone when they are not where this module expects them, and tests/test_fast_rng.py fails
loudly when an upgrade moves them. The lowering is process-wide and applies to programs
lowered after the switch (already compiled ones keep theirs).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import jax

_MARK = "jaxplan_threefry"  # the xla_metadata key `unrolled_here` marks its region with


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


def _marked(ctx) -> bool:
    """Whether the equation `ctx` lowers was traced inside `unrolled_here`."""
    eqn_ctx = getattr(ctx, "jaxpr_eqn_ctx", None)
    metadata = getattr(eqn_ctx, "xla_metadata", None) or {}
    return metadata.get(_MARK) == "unrolled"


@functools.cache  # one rule object, however often `unrolled_here` (re)registers it
def _dispatch_rule(unrolled, rolled):
    """A CPU lowering rule: unrolled for equations traced inside `unrolled_here`, JAX's
    rolled loops for the others."""

    def rule(ctx, *args, **params):
        return (unrolled if _marked(ctx) else rolled)(ctx, *args, **params)

    return rule


@functools.cache
def _metadata_scope():
    """`jax.experimental.xla_metadata.set_xla_metadata`, or None if this JAX lacks it."""
    try:
        from jax.experimental.xla_metadata import set_xla_metadata

        return set_xla_metadata
    except ImportError:
        return None


def _register(unrolled_everywhere: bool) -> bool:
    """Registers the CPU lowering: unrolled everywhere, or rolled except where `unrolled_here`
    marked the equations (plain rolled if this JAX cannot mark them)."""
    internals = _internals()
    if internals is None:
        return False
    mlir, primitive, unrolled, rolled = internals
    if unrolled_everywhere:
        mlir.register_lowering(primitive, unrolled, platform="cpu", inline=False)
    elif _metadata_scope() is None:
        mlir.register_lowering(primitive, rolled, platform="cpu")
    else:
        mlir.register_lowering(primitive, _dispatch_rule(unrolled, rolled), platform="cpu")
    return True


def use_unrolled_threefry(enable: bool = True) -> bool:
    """Lower threefry unrolled on the CPU (`enable=True`) or with JAX's rolled loops again
    (`False`; but unrolled inside `unrolled_here`) for programs compiled from now on.
    Returns whether the lowering was set (False: this JAX keeps its internals elsewhere;
    nothing changed)."""
    global _unrolled
    if not _register(enable):
        return False
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


@contextlib.contextmanager
def unrolled_here() -> Iterator[bool]:
    """The threefry hashes *traced* inside the block are lowered unrolled on the CPU, the
    rest of the program keeps the lowering in force (JAX's rolled loops by default). Yields
    whether it is in force (False: this JAX lacks what it needs; nothing changes).

    The rollout stage traces its segment's `scan` inside it: acting's many small draws per
    env step (the action noise, the env's reset) are what the rolled loops make slow, while
    a whole program lowered unrolled made PPO's SGD epochs slower (measured:
    benchmarks/README.md, "Issue 14, 6 December (later)"). The equations are marked with
    `jax.experimental.xla_metadata` (the marker reaches the hashes inside `jax.random`'s own
    jitted functions and keeps their lowerings apart in JAX's lowering cache); the same
    random bits either way. Off the CPU (JAX unrolls there) it marks nothing."""
    scope = _metadata_scope()
    if _unrolled or jax.default_backend() != "cpu" or scope is None or not _register(False):
        # unrolled everywhere already; or not the CPU (where JAX unrolls); or not available
        yield _unrolled
        return
    with scope(**{_MARK: "unrolled"}):
        yield True
