"""Held-out greedy evaluation compiles once and scores with the task's verifier."""

import numpy as np
from flax import nnx

from jaxrl_llm.data.char_tokenizer import char_tokenizer
from jaxrl_llm.models import ModelConfig, Transformer
from jaxrl_llm.tasks import get_task
from jaxrl_llm.training import Evaluator


def test_evaluator_scores_greedy_completions():
    tok = char_tokenizer()
    task = get_task("arithmetic", preset="add2x1", instruction="")
    rows = task.rows("eval", 12, seed=0)
    cfg = ModelConfig(vocab_size=len(tok), hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8,
                      intermediate_size=64)
    gd, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    ev = Evaluator(gd, tok, rows, task.score, max_new_tokens=4, stop_token_ids=(tok.eos_token_id,),
                   pad_token_id=tok.pad_token_id, chat=False, batch_size=8)
    m1 = ev(params)
    comps = list(ev.last_completions)
    m2 = ev(params)
    assert ev.last_completions == comps  # greedy: deterministic
    assert m1 == m2 and m1["eval/n"] == 12 and 0.0 <= m1["eval/accuracy"] <= 1.0
    want = np.mean([task.score(c, r) >= 1 for c, r in zip(comps, rows)])
    assert m1["eval/accuracy"] == want
    assert len(ev.sampler.compiled_shapes) == 1  # 12 rows in batches of 8: one padded shape
