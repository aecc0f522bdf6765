"""The suite's conftest keeps long-lived test workers within the kernel's limits: JAX's
compiled programs hold memory mappings of their own (past ``vm.max_map_count`` XLA aborts the
worker), so tests/conftest.py clears JAX's caches after every test file. Checked here: that the
hook fires exactly at file boundaries, and that clearing gives the mappings back."""

import gc
import sys
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest

CONFTEST = Path(__file__).with_name("conftest.py").resolve()


def _mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def _program(n: int):
    """A compiled program with a loop and fusions (trivial element-wise programs get no machine
    code of their own on XLA:CPU); each ``n`` is a new shape, so a new program. The jitted
    function stays alive, as a test module's functions do while the suite runs."""
    def f(w, x):
        body = lambda i, h: jax.nn.gelu(h @ w + jnp.sin(h) * i) / (1 + jnp.abs(h))  # noqa: E731
        return jax.lax.fori_loop(0, 3, body, x).sum(0)

    fn = jax.jit(f)
    jax.block_until_ready(fn(jnp.ones((n, n)), jnp.ones((4, n))))
    return fn


def _suite_teardown_hook(config):
    for impl in config.pluginmanager.hook.pytest_runtest_teardown.get_hookimpls():
        if Path(getattr(impl.plugin, "__file__", "")).resolve() == CONFTEST:
            return impl.function
    raise AssertionError(f"{CONFTEST} defines no pytest_runtest_teardown hook")


def test_the_conftest_clears_jax_caches_after_a_files_last_test_only(request, monkeypatch):
    hook = _suite_teardown_hook(request.config)
    calls = []
    monkeypatch.setattr(jax, "clear_caches", lambda: calls.append(1))
    a1, a2, b = (SimpleNamespace(path=Path(p)) for p in ("tests/a.py", "tests/a.py", "tests/b.py"))
    for item, nxt, want in ((a1, a2, 0), (a2, b, 1), (b, None, 1)):
        gen = hook(item, nxt)
        next(gen)  # pytest's own teardown (the fixtures') runs here
        with pytest.raises(StopIteration):
            next(gen)
        assert len(calls) == want, (item.path, nxt and nxt.path, calls)
        calls.clear()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_clearing_jax_caches_returns_the_compiled_programs_mappings():
    _program(3)  # the first compile's one-off mappings (threads, allocator) are not counted
    jax.clear_caches()
    gc.collect()
    before = _mappings()
    live = [_program(n) for n in range(4, 24)]
    grown = _mappings() - before
    assert grown >= 20, grown  # measured: about 6 mappings per program
    jax.clear_caches()
    gc.collect()
    left = _mappings() - before
    assert left <= grown // 4, (grown, left, len(live))
