"""The optional supervised warm-up of an RL run on the task's reference solutions, with an early
stop at a greedy-accuracy target on training prompts (``sft.target_accuracy``)."""

from __future__ import annotations

import time
from typing import Any

from jaxrl_llm.training.configs import RLRunConfig
from jaxrl_llm.training.optim import make_optimizer

__all__ = ["sft_warmup"]


def sft_warmup(cfg: RLRunConfig, gd, state_params, frozen, tok, sft_rows, log_fn, probe=None) -> tuple[Any, dict]:
    """SFT on ``sft_rows``; with ``cfg.sft.target_accuracy`` it stops once ``probe(params)``
    (greedy accuracy on training prompts) reaches the target."""
    from jaxrl_llm.data import ListSource, SFTDataConfig, sft_dataset
    from jaxrl_llm.training.objectives import SFTObjective
    from jaxrl_llm.training.preference import sft_arrays
    from jaxrl_llm.training.step import init_train_state, make_train_step

    s = cfg.sft
    if not sft_rows:
        raise ValueError("sft.steps > 0 needs a task with reference solutions (data.task), not a dataset")
    opt = make_optimizer(s.lr, s.steps, warmup_steps=s.warmup_steps, schedule=s.schedule,
                         weight_decay=s.weight_decay, max_grad_norm=cfg.optim.max_grad_norm)
    state = init_train_state(state_params, opt, seed=cfg.run.seed)
    if cfg.train.max_tokens_per_microbatch:  # packed like the RL update (train.max_tokens_per_microbatch)
        from jaxrl_llm.training.packed_step import make_packed_train_step

        step = make_packed_train_step(gd, opt, SFTObjective(), budget=cfg.train.max_tokens_per_microbatch)
    else:
        step = make_train_step(gd, opt, SFTObjective())
    data = sft_dataset(ListSource(sft_rows, "sft"), tok,
                       SFTDataConfig(batch_size=s.batch_size, chat=cfg.data.chat, system_prompt=cfg.data.system_prompt,
                                     length_buckets=tuple(cfg.rollout.prompt_buckets), seed=cfg.run.seed),
                       process_index=0, process_count=1)  # the global batch on every host (loop docstring)
    t0, probes, done = time.perf_counter(), [], s.steps
    for i in range(s.steps):
        state, m = step(state, sft_arrays(next(data)), *frozen)
        n, reached = i + 1, False
        if probe is not None and s.target_accuracy and n % s.probe_every == 0:
            acc = float(probe(state.params)["eval/accuracy"])
            probes.append((n, acc))
            log_fn({"sft/probe_accuracy": acc}, step=n)
            reached = acc >= s.target_accuracy
        if n % 50 == 0 or n == s.steps or reached:
            log_fn({"sft/nll": float(m["sft/nll"])}, step=n)
        if reached:
            done = n
            break
    info = {"steps": done, "nll_last": float(m["sft/nll"]) if s.steps else None,
            "seconds": time.perf_counter() - t0}
    if s.target_accuracy:
        info["probe_accuracy"] = probes
        info["reached_target"] = bool(probes) and probes[-1][1] >= s.target_accuracy
    return state.params, info
