"""A 64-bit-safe step counter that works with JAX's default 32-bit integers.

`jax_enable_x64` is off by default, so an int32 counter of env steps overflows after 2.1e9
steps (a few hours on a GPU). `Counter` keeps the count as two uint32 words; additions are
exact up to 2**64.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import struct


@struct.dataclass
class Counter:
    """A non-negative integer `hi * 2**32 + lo`; both words are uint32 arrays of equal shape."""

    lo: jnp.ndarray
    hi: jnp.ndarray

    @classmethod
    def zero(cls) -> Counter:
        return cls(lo=jnp.zeros((), jnp.uint32), hi=jnp.zeros((), jnp.uint32))

    def add(self, n: int | jnp.ndarray) -> Counter:
        """Adds `n` (a Python int below 2**32 or a uint32/int32 array >= 0)."""
        if isinstance(n, int) and not 0 <= n < 2**32:
            raise ValueError(f"Counter.add takes 0 <= n < 2**32, got {n}")
        n = jnp.asarray(n, jnp.uint32)
        lo = self.lo + n  # wraps modulo 2**32
        carry = (lo < self.lo).astype(jnp.uint32)
        return Counter(lo=lo, hi=self.hi + carry)

    def ge(self, n: int) -> jnp.ndarray:
        """Exact `self >= n` for a Python int `0 <= n < 2**64`."""
        hi, lo = jnp.uint32(n >> 32), jnp.uint32(n & 0xFFFFFFFF)
        return (self.hi > hi) | ((self.hi == hi) & (self.lo >= lo))

    def to_float(self) -> jnp.ndarray:
        """The count as float32 (exact below 2**24; for schedules, not for counting)."""
        return self.hi.astype(jnp.float32) * 4294967296.0 + self.lo.astype(jnp.float32)


def counter_value(counter: Counter) -> np.ndarray | int:
    """Host side: the exact count as a Python int (an int64 array for stacked counters)."""
    lo = np.asarray(counter.lo).astype(np.uint64)
    hi = np.asarray(counter.hi).astype(np.uint64)
    value = (hi << np.uint64(32)) | lo
    return int(value) if value.ndim == 0 else value.astype(np.int64)
