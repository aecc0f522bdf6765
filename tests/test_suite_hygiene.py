"""What the suite's conftest relies on to keep long-lived test workers within the kernel's
limits: JAX's compiled programs hold memory mappings of their own, and ``jax.clear_caches()``
plus a collection gives them back (tests/conftest.py does this after every test file)."""

import gc
import sys

import jax
import jax.numpy as jnp
import pytest


def _mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def _run_program(n: int):
    """Compile and run a small program with a loop and fusions (trivial element-wise programs
    get no machine code of their own on XLA:CPU); each ``n`` is a new shape, so a new program."""
    def f(w, x):
        body = lambda i, h: jax.nn.gelu(h @ w + jnp.sin(h) * i) / (1 + jnp.abs(h))  # noqa: E731
        return jax.lax.fori_loop(0, 3, body, x).sum(0)

    jax.block_until_ready(jax.jit(f)(jnp.ones((n, n)), jnp.ones((4, n))))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_clearing_jax_caches_returns_the_compiled_programs_mappings():
    _run_program(3)  # the first compile's one-off mappings (threads, allocator) are not counted
    jax.clear_caches()
    gc.collect()
    before = _mappings()
    for n in range(4, 24):
        _run_program(n)
    grown = _mappings() - before
    assert grown >= 20, grown  # measured: about 6 mappings per program
    jax.clear_caches()
    gc.collect()
    left = _mappings() - before
    assert left <= grown // 10, (grown, left)
