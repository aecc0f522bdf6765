"""Shared pytest configuration."""

import os

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
