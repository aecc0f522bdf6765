"""``python -m jaxrl_llm ...`` is the ``jaxrl-llm`` command (see :mod:`jaxrl_llm.cli`)."""

from jaxrl_llm.cli import entry

entry()
