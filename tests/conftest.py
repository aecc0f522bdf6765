"""Shared pytest configuration."""

import os
from pathlib import Path

# One XLA compilation cache for the whole test run (both xdist workers and every subprocess the
# tests start inherit it through the environment; set before anything imports jax): most tests
# compile the same tiny-model programs, and a cached executable is the same program (the
# bitwise golden-run tests pass with cache hits). A JAX_COMPILATION_CACHE_DIR of your own is
# respected; JAXRL_TEST_COMPILE_CACHE=0 turns it off.
if os.environ.get("JAXRL_TEST_COMPILE_CACHE", "1") != "0":
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                          str(Path(__file__).resolve().parent.parent / ".cache" / "jax-tests"))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "dev", max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "dev")


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The embedded SmolLM2 tokenizer (chat template included), built from the GGUF metadata."""
    import gguf

    from jaxrl_llm.models import gguf_tokenizer, smollm2_path

    return gguf_tokenizer(gguf.GGUFReader(str(smollm2_path())))


_COMPILES: list[str] = []


def _on_event(name, duration, **kw):
    if name == "/jax/core/compile/backend_compile_duration":
        _COMPILES.append(name)


def _register():
    import jax

    jax.monitoring.register_event_duration_secs_listener(_on_event)


_register()


@pytest.fixture
def compiles():
    """A callable returning how many XLA compilations have happened so far in this process."""
    return lambda: len(_COMPILES)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a test file's last test (and its module fixtures' teardown), drop JAX's compiled
    programs: ``jax.clear_caches()`` and a garbage collection.

    An XLA:CPU executable holds its machine code in memory mappings of its own (a few per
    program), and a long-lived xdist worker keeps every program it compiled: measured 10,500
    mappings after 80 s of the suite, on a course past the kernel's ``vm.max_map_count`` (65,530
    here). Past it, the next mmap fails and XLA aborts the worker with no message (seen in CI
    as "Fatal Python error: Aborted" while serialising an executable for the compile cache).
    Programs a later file shares come back from the persistent compile cache."""
    yield
    if nextitem is None or nextitem.path != item.path:
        import gc

        import jax

        jax.clear_caches()
        gc.collect()
