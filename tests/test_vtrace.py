"""V-trace against an independent float64 numpy reference, GAE, a hand-computed case, jit/vmap.

The reference is a plain Python loop over float64 values and calls no jaxplan code. jaxplan runs
in float32 (x64 off), so comparisons use float32 tolerances, stated at each assert.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxplan.gae import compute_gae
from jaxplan.vtrace import vtrace

# float32 tolerances for results of O(1) magnitude
RTOL = 1e-5
ATOL = 1e-5


def f32(x):
    return np.asarray(x, np.float32)


# Jitted once each (gamma, lambda and the thresholds are traced): one compilation per shape.
_vtrace = jax.jit(vtrace)
_gae = jax.jit(compute_gae)


def vtrace_reference(
    behaviour_logp,
    target_logp,
    rewards,
    values,
    next_values,
    terminated,
    truncated,
    gamma,
    lam,
    rho_bar,
    c_bar,
    pg_rho_bar,
):
    """Float64 V-trace over a time-major fragment [T, N], one column at a time, backwards.

    An episode ends at terminated or truncated and the trace is cut there and at the fragment
    end; only terminated drops the bootstrap value. The policy-gradient target bootstraps from
    vs of the next step inside an episode and from next_values at an episode or fragment end.
    """
    mu = np.asarray(behaviour_logp, np.float64)
    pi = np.asarray(target_logp, np.float64)
    r = np.asarray(rewards, np.float64)
    v = np.asarray(values, np.float64)
    nv = np.asarray(next_values, np.float64)
    term = np.asarray(terminated, bool)
    trunc = np.asarray(truncated, bool)
    num_steps, num_cols = r.shape
    vs = np.zeros((num_steps, num_cols), np.float64)
    pg = np.zeros((num_steps, num_cols), np.float64)
    for col in range(num_cols):
        for t in reversed(range(num_steps)):
            rho = math.exp(pi[t, col] - mu[t, col])
            bootstrap = 0.0 if term[t, col] else gamma * nv[t, col]
            delta = min(rho_bar, rho) * (r[t, col] + bootstrap - v[t, col])
            episode_continues = not (term[t, col] or trunc[t, col]) and t < num_steps - 1
            if episode_continues:
                c = lam * min(c_bar, rho)
                vs[t, col] = v[t, col] + delta + gamma * c * (vs[t + 1, col] - v[t + 1, col])
                q = r[t, col] + gamma * vs[t + 1, col]
            else:
                vs[t, col] = v[t, col] + delta
                q = r[t, col] + bootstrap
            pg[t, col] = min(pg_rho_bar, rho) * (q - v[t, col])
    return vs, pg


def _random_fragment(rng, shape, logp_scale=1.0, p_term=0.12, p_trunc=0.12):
    behaviour_logp = f32(-rng.uniform(0.1, 3.0, size=shape))
    target_logp = f32(behaviour_logp + logp_scale * rng.normal(size=shape))
    rewards = f32(rng.normal(size=shape))
    values = f32(rng.normal(size=shape))
    next_values = f32(rng.normal(size=shape))
    u = rng.uniform(size=shape)
    terminated = u < p_term
    truncated = (u >= p_term) & (u < p_term + p_trunc)
    # both kinds of episode end mid-fragment, a step with both flags, and plain fragment cuts
    terminated[3, 0], truncated[3, 0] = True, False
    terminated[5, 1], truncated[5, 1] = False, True
    terminated[7, 2], truncated[7, 2] = True, True
    terminated[6, 3], truncated[6, 3] = False, True
    terminated[-1, :3], truncated[-1, :3] = False, False
    return behaviour_logp, target_logp, rewards, values, next_values, terminated, truncated


def _call(fragment, gamma, lam, rho_bar, c_bar, pg_rho_bar):
    return _vtrace(
        *(jnp.asarray(x) for x in fragment),
        jnp.float32(gamma),
        jnp.float32(lam),
        jnp.float32(rho_bar),
        jnp.float32(c_bar),
        jnp.float32(pg_rho_bar),
    )


@pytest.mark.parametrize("lam", [1.0, 0.9])
@pytest.mark.parametrize("thresholds", [(1.0, 1.0, 1.0), (2.0, 0.5, 1.5)])
def test_vtrace_against_reference(lam, thresholds):
    rng = np.random.default_rng(0)
    shape = (13, 5)
    gamma = 0.97
    fragment = _random_fragment(rng, shape)
    behaviour_logp, target_logp = fragment[:2]
    rhos = np.exp(target_logp.astype(np.float64) - behaviour_logp)
    # each threshold clips some steps and leaves others alone
    for bar in thresholds:
        assert (rhos > bar).sum() >= 5 and (rhos < bar).sum() >= 5

    vs, pg = _call(fragment, gamma, lam, *thresholds)
    assert vs.shape == shape and pg.shape == shape
    # the reference works on float32-rounded gamma/lambda, as the jitted code does
    ref_vs, ref_pg = vtrace_reference(
        *fragment, float(np.float32(gamma)), float(np.float32(lam)), *thresholds
    )
    # sums of up to 13 O(1) float32 terms: rtol 1e-5, atol 1e-5
    np.testing.assert_allclose(np.asarray(vs), ref_vs, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(np.asarray(pg), ref_pg, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("lam", [1.0, 0.9])
def test_vtrace_on_policy_is_gae(lam):
    """With pi == mu (rho = 1) and no effective clipping, c_t = lambda and V-trace is the
    TD(lambda) return: vs equals the GAE(lambda) value targets. The pg target
    r_t + gamma vs_{t+1} equals vs_t only for lambda = 1 (and next_values[t] == values[t+1]
    inside an episode), so pg advantages equal the GAE advantages only then."""
    rng = np.random.default_rng(1)
    shape = (13, 5)
    fragment = list(_random_fragment(rng, shape))
    fragment[1] = fragment[0].copy()  # target_logp == behaviour_logp
    _, _, rewards, values, next_values, terminated, truncated = fragment
    # consistent values, as a rollout produces them: inside an episode V(x'_t) is V(x_{t+1})
    continues = ~(terminated | truncated)
    next_values[:-1][continues[:-1]] = values[1:][continues[:-1]]
    gamma = 0.97

    vs, pg = _call(fragment, gamma, lam, 1e6, 1e6, 1e6)
    adv, targets = _gae(
        *(jnp.asarray(x) for x in (rewards, values, next_values, terminated, truncated)),
        jnp.float32(gamma),
        jnp.float32(lam),
    )
    # same float32 recursion up to operation order
    np.testing.assert_allclose(np.asarray(vs), np.asarray(targets), rtol=RTOL, atol=ATOL)
    if lam == 1.0:
        np.testing.assert_allclose(np.asarray(pg), np.asarray(adv), rtol=RTOL, atol=ATOL)


def test_vtrace_hand_computed():
    # T=3, B=1, gamma=0.5, lambda=1, rho-bar = c-bar = pg-rho-bar = 1, no episode end (fragment
    # cut after t=2, bootstrap from next_values[2] = 2.0).
    #   rho = [0.5, 2.0, 1.0]  ->  clipped rho = c = pg rho = [0.5, 1.0 (clipped), 1.0]
    behaviour_logp = f32([[-1.0], [-2.0], [-0.5]])
    target_logp = f32([[-1.0 + math.log(0.5)], [-2.0 + math.log(2.0)], [-0.5]])
    rewards = f32([[1.0], [2.0], [3.0]])
    values = f32([[0.5], [1.0], [1.5]])
    next_values = f32([[1.0], [1.5], [2.0]])
    terminated = np.zeros((3, 1), bool)
    truncated = np.zeros((3, 1), bool)
    # deltas: t0: 0.5 * (1 + .5 * 1.0 - .5) = 0.5
    #         t1: 1.0 * (2 + .5 * 1.5 - 1.0) = 1.75   (unclipped rho 2 would give 3.5)
    #         t2: 1.0 * (3 + .5 * 2.0 - 1.5) = 2.5
    # vs - V: t2: 2.5
    #         t1: 1.75 + gamma * c1 * 2.5 = 1.75 + .5 * 1 * 2.5 = 3.0
    #         t0: 0.5 + gamma * c0 * 3.0 = 0.5 + .5 * .5 * 3.0 = 1.25
    # vs = [0.5 + 1.25, 1.0 + 3.0, 1.5 + 2.5] = [1.75, 4.0, 4.0]
    # pg: t0: 0.5 * (1 + .5 * vs1 - .5) = 0.5 * (1 + 2 - .5) = 1.25
    #     t1: 1.0 * (2 + .5 * vs2 - 1.0) = 3.0
    #     t2: 1.0 * (3 + .5 * next_values[2] - 1.5) = 2.5   (fragment end)
    vs, pg = _vtrace(
        *(
            jnp.asarray(x)
            for x in (
                behaviour_logp,
                target_logp,
                rewards,
                values,
                next_values,
                terminated,
                truncated,
            )
        ),
        0.5,
    )
    # rho = exp(float32 log-prob difference) is exact only up to float32 rounding
    np.testing.assert_allclose(np.asarray(vs), [[1.75], [4.0], [4.0]], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(pg), [[1.25], [3.0], [2.5]], rtol=1e-6, atol=1e-6)


def test_vtrace_jit_vmap():
    rng = np.random.default_rng(2)
    num, shape = 3, (13, 5)
    fragments = [_random_fragment(rng, shape) for _ in range(num)]
    stacked = [jnp.asarray(np.stack(xs)) for xs in zip(*fragments, strict=True)]
    args = (jnp.float32(0.97), jnp.float32(0.9), 2.0, 0.5, 1.5)

    batched = jax.jit(jax.vmap(vtrace, in_axes=(0,) * 7 + (None,) * 5))
    vs, pg = batched(*stacked, *args)
    assert vs.shape == (num, *shape) and pg.shape == (num, *shape)
    for i, fragment in enumerate(fragments):
        vs_i, pg_i = _vtrace(*(jnp.asarray(x) for x in fragment), *args)
        # same computation, possibly fused differently
        np.testing.assert_allclose(np.asarray(vs[i]), np.asarray(vs_i), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(np.asarray(pg[i]), np.asarray(pg_i), rtol=1e-6, atol=1e-6)


def test_vtrace_stops_gradients():
    rng = np.random.default_rng(3)
    fragment = [jnp.asarray(x) for x in _random_fragment(rng, (13, 5))]

    def total(values, target_logp):
        args = list(fragment)
        args[1], args[3] = target_logp, values
        vs, pg = vtrace(*args, 0.97)
        return vs.sum() + pg.sum()

    grads = jax.jit(jax.grad(total, argnums=(0, 1)))(fragment[3], fragment[1])
    for g in grads:
        np.testing.assert_array_equal(np.asarray(g), 0.0)
