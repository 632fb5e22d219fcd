"""A uniformly random permutation from one-operand sorts (the SGD epochs' shuffle).

`jax.random.permutation(key, n)` sorts `(random key, index)` pairs: a two-operand sort, which
XLA's CPU runs ~4x slower than a sort of one array (a comparator over tuples). Here the index
rides in the low `b = ceil(log2 n)` bits of each 32-bit random sort key, so one sort of
`uint32` keys yields the order, read back from the low bits.

The `32 - b` random bits leave ties more likely than JAX's 32; a tie keeps the tied entries
in their current order. Like JAX's `permutation`, which repeats its sort until
`(2**32)**rounds >= n**3`, this repeats with fresh keys (each round permutes the previous
round's result) until `(2**(32 - b))**rounds >= n**3`, so the chance that any pair's order is
left to a tie in every round is at most ~1/n, as for JAX's. For 1,024 rows that is 2 rounds,
1.8x faster than JAX's one two-operand round on the CPU; for 4k-262k rows 3.7-3.8x
(benchmarks/README.md, "Issue 14, 6 December (later)"). Above `2**20` entries it is JAX's
`permutation`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

MAX_PACKED = 2**20  # above this, too few random bits are left: jax.random.permutation


def permutation_rounds(n: int) -> int:
    """Sorts `random_permutation` runs for `n` entries: the fewest `r` with
    `(2**(32 - b))**r >= n**3`, `b = ceil(log2 n)` (the index bits)."""
    if n <= 1:
        return 0
    index_bits = (n - 1).bit_length()
    return math.ceil(3 * math.log2(n) / (32 - index_bits))


def random_permutation(key: jax.Array, n: int) -> jax.Array:
    """`[n]` int32: a random permutation of `0..n-1` drawn from `key` (see the module
    docstring; not the same draw as `jax.random.permutation(key, n)`)."""
    if n > MAX_PACKED:
        return jax.random.permutation(key, n).astype(jnp.int32)
    rounds = permutation_rounds(n)
    if rounds == 0:
        return jnp.arange(n, dtype=jnp.int32)
    index = jnp.arange(n, dtype=jnp.uint32)
    mask = jnp.uint32((1 << (n - 1).bit_length()) - 1)
    perm = None
    for k in jax.random.split(key, rounds):
        order = jnp.sort((jax.random.bits(k, (n,), jnp.uint32) & ~mask) | index) & mask
        perm = order if perm is None else perm[order]  # this round permutes the last one's
    return perm.astype(jnp.int32)
