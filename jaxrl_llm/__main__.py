"""``python -m jaxrl_llm ...`` is the ``jaxrl-llm`` command (see :mod:`jaxrl_llm.cli`)."""

import sys

from jaxrl_llm.cli import main

sys.exit(main())
