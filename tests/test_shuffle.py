"""jaxplan.shuffle.random_permutation: a permutation of 0..n-1, uniformly random, with
JAX's bound on ties (the chance that a pair's order is left to ties in every round)."""

import itertools
import math
import re

import jax
import numpy as np
import pytest

from jaxplan.shuffle import MAX_PACKED, permutation_rounds, random_permutation


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 64, 1000, 1024, 1025, 4096])
def test_is_a_permutation(n):
    for seed in range(3):
        perm = np.asarray(
            jax.jit(random_permutation, static_argnums=1)(jax.random.PRNGKey(seed), n)
        )
        assert perm.dtype == np.int32 and perm.shape == (n,)
        np.testing.assert_array_equal(np.sort(perm), np.arange(n))


@pytest.mark.parametrize(
    "n,rounds",
    # hand-computed: ceil(3 log2 n / (32 - ceil(log2 n)))
    [(1, 0), (2, 1), (256, 1), (1000, 2), (1024, 2), (1025, 2), (65536, 3), (262144, 4)]
    + [(2**20, 5)],
)
def test_rounds_bound_ties_as_jax_does(n, rounds):
    assert permutation_rounds(n) == rounds
    if n > 1:
        free = 32 - (n - 1).bit_length()
        # JAX's rule for its 32-bit keys, with the random bits that are left here
        assert (2**free) ** rounds >= n**3 > (2**free) ** (rounds - 1)


def test_every_order_equally_likely():
    """n = 4: the 24 orders over 4,800 keys, chi-square against uniform (p > 0.001; the
    statistic of a fixed key set, so the test is deterministic)."""
    keys = jax.random.split(jax.random.PRNGKey(0), 4800)
    perms = np.asarray(jax.vmap(lambda k: random_permutation(k, 4))(keys))
    index = {p: i for i, p in enumerate(itertools.permutations(range(4)))}
    counts = np.bincount([index[tuple(p)] for p in perms], minlength=24)
    expected = len(keys) / 24
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 49.7, counts  # the 0.999 quantile of chi-square with 23 degrees of freedom


def test_every_position_equally_likely_with_several_rounds():
    """n = 1,000 (2 rounds): where entry 0 and entry 999 land, over 2,000 keys, in 10 bins;
    and two entries' relative order is a fair coin."""
    n, draws = 1000, 2000
    keys = jax.random.split(jax.random.PRNGKey(1), draws)
    perms = np.asarray(jax.vmap(lambda k: random_permutation(k, n))(keys))
    where = np.argsort(perms, axis=1)  # where[d, i]: the position of entry i
    for entry in (0, n - 1):
        counts = np.bincount(where[:, entry] * 10 // n, minlength=10)
        chi2 = float(((counts - draws / 10) ** 2 / (draws / 10)).sum())
        assert chi2 < 27.9, (entry, counts)  # 0.999 quantile, 9 degrees of freedom
    before = int(np.sum(where[:, 0] < where[:, 1]))
    assert abs(before - draws / 2) < 3.3 * math.sqrt(draws / 4)


def test_large_n_is_jax_permutation():
    key = jax.random.PRNGKey(2)
    n = MAX_PACKED + 1
    np.testing.assert_array_equal(
        np.asarray(random_permutation(key, n)), np.asarray(jax.random.permutation(key, n))
    )


def _sort_operands(fn) -> list[int]:
    """The operand count of every sort in `fn`'s lowered program."""
    text = jax.jit(fn).lower(jax.random.PRNGKey(0)).as_text()
    return [len(m.split(",")) for m in re.findall(r'"stablehlo.sort"\(([^)]*)\)', text)]


def test_one_operand_sorts_only():
    """What makes it fast: it sorts one array where JAX's permutation sorts two."""
    assert _sort_operands(lambda k: jax.random.permutation(k, 1024)) == [2]
    assert _sort_operands(lambda k: random_permutation(k, 1024)) == [1]  # one sort function
    text = jax.jit(lambda k: random_permutation(k, 1024)).lower(jax.random.PRNGKey(0)).as_text()
    assert text.count("call @sort(") == permutation_rounds(1024)  # called once per round
