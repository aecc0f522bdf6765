"""Data: local record sources (jsonl, parquet, saved HF datasets) and grain pipelines for
prompts (RL), preference pairs and SFT, with exact checkpointable iterator state."""

from jaxrl_llm.data import gsm8k, pipeline, sources
from jaxrl_llm.data.gsm8k import *  # noqa: F401,F403
from jaxrl_llm.data.pipeline import *  # noqa: F401,F403
from jaxrl_llm.data.sources import *  # noqa: F401,F403

__all__ = sources.__all__ + pipeline.__all__ + gsm8k.__all__
