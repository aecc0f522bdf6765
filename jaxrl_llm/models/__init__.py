"""Models: a Flax NNX decoder family (Llama, Mistral, Qwen2/2.5, Qwen3, GPT-2, Gemma 2/3,
Qwen3-MoE) with HF and GGUF import, HF export, KV cache, LoRA, score heads and chunked log-probs."""

from jaxrl_llm.models import config, gguf, hf, logprobs, transformer
from jaxrl_llm.models.config import *  # noqa: F401,F403
from jaxrl_llm.models.gguf import *  # noqa: F401,F403
from jaxrl_llm.models.hf import *  # noqa: F401,F403
from jaxrl_llm.models.logprobs import *  # noqa: F401,F403
from jaxrl_llm.models.transformer import *  # noqa: F401,F403

__all__ = config.__all__ + gguf.__all__ + hf.__all__ + logprobs.__all__ + transformer.__all__
