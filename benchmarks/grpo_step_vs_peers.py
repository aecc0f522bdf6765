"""GRPO step time: jaxrl_llm's ``RLTrainer`` vs TRL's ``GRPOTrainer`` (torch CPU) vs google-tunix's
``GRPOLearner`` (JAX CPU), same run, same weights.

One step in all three = generate 8 completions of exactly 64 new tokens for 1 chat prompt
(temperature 1, no top-k / top-p), score them with a trivial reward (completion length in
characters), GRPO group advantages, then one log-prob forward + backward over the 8 rows and one
AdamW update (lr 1e-6, weight decay 0, gradient clipping at global norm 1), float32, beta = 0 (no
KL term, no reference model), one optimiser update per rollout (no PPO epochs / mini-batches):

- ours: ``RLTrainer`` with ``recipe("grpo", num_samples=8)``, a ``Sampler`` with
  ``max_new_tokens=64`` and no stop token, a prompt pipeline of batch 1, ``trainer.run(steps)``.
- TRL: ``GRPOConfig(per_device_train_batch_size=8, num_generations=8, max_completion_length=64,
  beta=0.0, bf16=False, use_cpu=True, loss_type="grpo", gradient_checkpointing=False,
  generation_kwargs={"min_new_tokens": 64})``: generation batch = 8 = 1 prompt x 8, one
  optimiser step per generation (``steps_per_generation = gradient_accumulation_steps = 1``,
  ``num_iterations = 1``, so no extra "old log-prob" forward); ``trainer.train()``.
- tunix: ``RLCluster`` (actor and rollout share one model on a 1-device mesh, vanilla rollout
  engine, ``RolloutConfig(max_tokens_to_generate=64, temperature=1.0, top_p=1.0,
  eos_tokens=[-1])`` so no row stops early) and ``GRPOLearner(GRPOConfig(num_generations=8,
  num_iterations=1, beta=0.0))``, ``mini_batch_size = train_micro_batch_size = 1`` prompt;
  ``learner.train(dataset)``.

Each implementation runs in its own process and virtualenv (``.venv``, ``.venv-peers``,
``.venv-tunix``), one after another. Step time is the wall time between the ends of consecutive
optimiser steps (ours: the ``log_fn`` call after each step; TRL: ``on_step_end``; tunix: the end
of each global step, after blocking on the actor's parameters), so it covers everything a user's
``run``/``train`` call does per step. The first ``--warmup`` steps are excluded (default 2: ours
compiles its train step a second time in step 2) and listed with the XLA compilation seconds
inside them; the median of ``--repeats`` steps is reported. TRL's torch uses all cores
(``--torch-threads``); on a machine whose cores are shared with other work, torch's threads slow
down many-fold, so measure on an idle machine.

Models: the ~8M-parameter Qwen2-style model of ``rollout_vs_hf.py`` (random weights, torch seed
0, SmolLM2's tokenizer: the prompt's token ids all fall inside its 16384-token vocabulary) and
SmolLM2-135M-Instruct (the embedded GGUF, dequantised to float32 and exported with
``save_hf``). Every implementation loads the same safetensors directory; before training each
reports the summed log-prob of the prompt under its loaded model, which must agree.

Run: ``.venv/bin/python benchmarks/grpo_step_vs_peers.py [--models tiny,smollm2] [--repeats 5]
[--write]`` (needs ``bash scripts/setup_peers.sh`` and ``bash scripts/setup_tunix.sh``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENVS = {"ours": ROOT / ".venv", "ours-warm": ROOT / ".venv", "trl": ROOT / ".venv-peers", "tunix": ROOT / ".venv-tunix"}
G, T, LR = 8, 64, 1e-6
MESSAGES = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is 2+3?"}]
RESULT = "RESULT "


def _shape(job: dict) -> tuple[list[str], int, float]:
    """``(prompts of one step, new tokens, beta)`` of a job (default: the one chat prompt, T, 0)."""
    return list(job.get("prompts") or [job["prompt"]]), int(job.get("new_tokens") or T), float(job.get("beta") or 0.0)


def long_prompts(tok, n: int, target: int) -> list[str]:
    """``n`` distinct chat prompts of at most ``target`` tokens and at least ``target - 8``: a long
    system prompt of worked examples (the part a real run shares: instructions, few-shot
    examples) and a different question each."""
    examples = [f"Example {i}: {i * 7 % 50} + {i * 13 % 40} = {i * 7 % 50 + i * 13 % 40}." for i in range(200)]
    out = []
    for j in range(n):
        q = [{"role": "user", "content": f"What is {12 + j} + {30 + 3 * j}?"}]
        lo, hi = 0, len(examples)
        while lo < hi:  # the most examples that keep the prompt within target tokens
            mid = (lo + hi + 1) // 2
            sys_msg = [{"role": "system", "content": "Solve the sum. " + " ".join(examples[:mid])}]
            text = tok.apply_chat_template(sys_msg + q, tokenize=False, add_generation_prompt=True)
            if len(tok(text, add_special_tokens=False)["input_ids"]) <= target:
                lo = mid
            else:
                hi = mid - 1
        sys_msg = [{"role": "system", "content": "Solve the sum. " + " ".join(examples[:lo])}]
        text = tok.apply_chat_template(sys_msg + q, tokenize=False, add_generation_prompt=True)
        n_tok = len(tok(text, add_special_tokens=False)["input_ids"])
        if n_tok < target - 8:
            raise SystemExit(f"could not build a prompt of about {target} tokens (got {n_tok})")
        out.append(text)
    return out


def length_reward(prompts, completions, **kwargs):
    """The trivial reward of every implementation: completion length in characters."""
    return [float(len(c)) for c in completions]


def _stats(stamps: list[float], warmup: int) -> tuple[float, list[float]]:
    """Median step time from end-of-step timestamps (``stamps[0]`` = start of the first step)."""
    steps = [b - a for a, b in zip(stamps, stamps[1:])]
    timed = steps[warmup:]
    return statistics.median(timed), steps


def _compile_clock() -> list[tuple[float, float]]:
    """Record ``(end time, seconds)`` of every XLA compilation in this process from now on."""
    import jax

    events: list[tuple[float, float]] = []

    def on_event(name, duration, **kw):
        if name == "/jax/core/compile/backend_compile_duration":
            events.append((time.perf_counter(), duration))

    jax.monitoring.register_event_duration_secs_listener(on_event)
    return events


def _peak_rss_gb() -> float:
    """Peak resident memory of this process so far, GB (Linux reports ``ru_maxrss`` in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def _launch_stats(job: dict, first_step_end: float) -> dict:
    """Time from the driver's launch of this process to the end of its first optimiser step
    (imports, model load, setup, compilation and the step itself) less the benchmark's own
    log-prob check of the loaded model (not part of any library's start), and the peak RSS."""
    return {"first_step_s": first_step_end - job["launched"] - job["check_s"], "check_s": job["check_s"],
            "peak_rss_gb": _peak_rss_gb()}


def _compile_per_step(stamps: list[float], events: list[tuple[float, float]]) -> list[float]:
    """Seconds of XLA compilation inside each step."""
    return [sum(d for t, d in events if a < t <= b) for a, b in zip(stamps, stamps[1:])]


# --------------------------------------------------------------------------- workers


def worker_ours(job: dict) -> dict:
    import jax
    import optax
    from flax import nnx

    from jaxrl_llm.data import ListSource, PromptDataConfig, prompt_dataset
    from jaxrl_llm.models import load_hf, token_logprobs
    from jaxrl_llm.models.hf import load_tokenizer
    from jaxrl_llm.rewards import Rewards
    from jaxrl_llm.rollout import Sampler, SamplingConfig
    from jaxrl_llm.training import RLTrainer, init_train_state, make_train_step, recipe

    if job.get("compile_cache"):  # the library's run.compile_cache (the runner turns it on the same way)
        from jaxrl_llm.training.host_loop import use_compile_cache

        use_compile_cache(job["compile_cache"])
    from jaxrl_llm.models import load_config
    from jaxrl_llm.training.auto import RunShape, choose

    prompts, t_new, beta = _shape(job)
    bf16 = bool(job.get("bf16", False))
    # the execution settings as a plain `jaxrl-llm train` resolves them (jaxrl_llm.training.auto); a flag wins
    kv, unroll = job.get("shared_prompt_kv", "auto"), job.get("unroll", "auto")
    execution = choose(load_config(job["model_dir"]),
                       RunShape(prompts=len(prompts), num_samples=G, prompt_len=job["prompt_bucket"], new_tokens=t_new,
                                update_rows=len(prompts) * G, update_len=job["prompt_bucket"] + t_new),
                       remat=job.get("remat", "auto"),
                       shared_prompt_kv=None if kv in ("auto", None) else kv in (True, "true"),
                       unroll_layers=None if unroll == "auto" else unroll == "true",
                       sampler_dtype="bfloat16" if bf16 else None, platform=jax.default_backend())
    print(execution.line(), file=sys.stderr, flush=True)
    model = load_hf(job["model_dir"], remat=execution["model.remat"])
    tok = load_tokenizer(job["model_dir"])
    ids = tok(job["prompt"], add_special_tokens=False)["input_ids"]
    check_t0 = time.time()
    x = jax.numpy.asarray([ids], jax.numpy.int32)
    hidden, _ = model(x[:, :-1], jax.numpy.ones_like(x[:, :-1], bool))
    lp, _ = token_logprobs(hidden, model.unembedding(), x[:, 1:])
    check = float(lp.sum())
    job["check_s"] = time.time() - check_t0
    if job.get("check_only"):
        return {"prompt_tokens": len(ids), "prompt_logp": check}

    gd, params = nnx.split(model)
    n_params = sum(v.size for v in jax.tree.leaves(params))
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(LR, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0))
    # bfloat16 sampler weights: the sampler's log-probs are the cast model's, so the ratio's old policy is
    extra = {"old_logp": "recompute"} if bf16 else {}  # recomputed (as the runner requires)
    rec = recipe("grpo", num_samples=G, kl={"coef": beta}, **extra) if beta else recipe("grpo", num_samples=G, **extra)
    plan = None
    if job.get("shared_prefix", True):  # the library's default (train.shared_prefix unset): on where exact
        from jaxrl_llm.training.prefix import plan_shared_prefix

        plan, _ = plan_shared_prefix(G, len(prompts), 1)
    if plan is not None:
        rec = dataclasses.replace(rec, objective=dataclasses.replace(rec.objective,
                                                                     rows_per_prompt=plan.rows_per_prompt))
    state = init_train_state(params, opt, seed=0)
    ref = jax.tree.map(lambda x: x.copy(), params) if beta else None
    sampler = Sampler(gd, SamplingConfig(max_new_tokens=t_new, num_samples=G, temperature=1.0,
                                         pad_token_id=tok.pad_token_id,  # no stop token: exactly T tokens
                                         shared_prompt_kv=execution["rollout.shared_prompt_kv"],
                                         weight_dtype="bfloat16" if bf16 else None),
                      length_buckets=(job["prompt_bucket"],), unroll_layers=execution["rollout.unroll_layers"])
    data = prompt_dataset(ListSource([{"prompt": p} for p in prompts], "bench"), tok,
                          PromptDataConfig(batch_size=len(prompts), chat=False, shuffle=False), process_index=0,
                          process_count=1)
    stamps, walls = [], []
    compiles = _compile_clock()
    trainer = RLTrainer(gd, state, make_train_step(gd, opt, rec.objective), sampler, data, Rewards([length_reward]),
                        rec, tok, seed=0, ref_params=ref, shared_prefix=plan,
                        log_fn=lambda m: (stamps.append(time.perf_counter()), walls.append(time.time())))
    stamps.append(time.perf_counter())
    hist = trainer.run(job["warmup"] + job["repeats"])
    med, steps = _stats(stamps, job["warmup"])
    timed = hist[job["warmup"]:]
    phases = {k.split("/", 1)[1]: statistics.median(h[k] for h in timed)
              for k in ("time/data", "time/rollout", "time/rewards", "time/prepare", "time/update")}
    return {"step_s": med, "steps_s": steps, "compile_s": _compile_per_step(stamps, compiles), "phases_s": phases,
            "prompt_tokens": len(ids), "prompt_logp": check,
            "completion_len_mean": [h["response/length_mean"] for h in hist],
            "min_len": min(h["response/length_mean"] for h in hist),
            "params": int(n_params), "version": f"jax {jax.__version__}",
            "loss": [h.get("loss") for h in hist], "shared_prefix": plan.rows_per_prompt if plan else 0,
            "execution": {c.key: c.value for c in execution.choices},
            **_launch_stats(job, walls[0])}


def worker_trl(job: dict) -> dict:
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(job.get("torch_threads") or os.cpu_count() or 1)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(job["model_dir"], dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(job["model_dir"])
    ids = tok(job["prompt"], add_special_tokens=False)["input_ids"]
    check_t0 = time.time()
    with torch.no_grad():
        x = torch.tensor([ids])
        logits = model(x).logits.float()
        check = float(torch.log_softmax(logits[0, :-1], -1).gather(-1, x[0, 1:, None]).sum())
    job["check_s"] = time.time() - check_t0
    if job.get("check_only"):
        return {"prompt_tokens": len(ids), "prompt_logp": check}

    stamps: list[float] = []
    walls: list[float] = []
    lengths: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())
            walls.append(time.time())

    def reward(prompts, completions, completion_ids=None, **kwargs):
        lengths.append(min(len(c) for c in completion_ids))
        return length_reward(prompts, completions)

    steps = job["warmup"] + job["repeats"]
    prompts, t_new, beta = _shape(job)
    b = len(prompts)
    with tempfile.TemporaryDirectory() as out:
        # generation batch = B prompts x G rows = one optimiser step (steps_per_generation = 1)
        # with m micro-batches (gradient accumulation, to fit in memory): m x (B G / m) rows, still one
        # optimiser step and one generation per step (steps_per_generation = gradient_accumulation_steps)
        m = int(job.get("peer_micro_batches") or 1)
        args = GRPOConfig(output_dir=out, per_device_train_batch_size=b * G // m, gradient_accumulation_steps=m,
                          num_generations=G, max_completion_length=t_new, beta=beta,
                          bf16=bool(job.get("bf16", False)), use_cpu=True, learning_rate=LR,
                          weight_decay=0.0, max_grad_norm=1.0, temperature=1.0, top_k=0, top_p=1.0,
                          generation_kwargs={"min_new_tokens": t_new}, loss_type="grpo", gradient_checkpointing=False,
                          max_steps=steps, report_to="none", save_strategy="no", disable_tqdm=True, seed=0,
                          shuffle_dataset=False)
        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, processing_class=tok,
                              train_dataset=Dataset.from_dict({"prompt": prompts * steps}),
                              callbacks=[Clock()])
        stamps.append(time.perf_counter())
        trainer.train()
    med, all_steps = _stats(stamps, job["warmup"])
    return {"step_s": med, "steps_s": all_steps, "prompt_tokens": len(ids), "prompt_logp": check,
            "completion_len_min": lengths, "min_len": min(lengths), **_launch_stats(job, walls[0]),
            "version": f"trl {trl.__version__}, torch {torch.__version__}, {torch.get_num_threads()} threads"}


def _tunix_model(model_dir: str, mesh):
    import jax.numpy as jnp

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    rope = cfg.get("rope_parameters") or {}
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    common = dict(num_layers=cfg["num_hidden_layers"], vocab_size=cfg["vocab_size"], embed_dim=cfg["hidden_size"],
                  hidden_dim=cfg["intermediate_size"], num_heads=cfg["num_attention_heads"],
                  head_dim=cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
                  num_kv_heads=cfg["num_key_value_heads"], rope_theta=theta, norm_eps=cfg["rms_norm_eps"])
    if cfg["model_type"] == "qwen2":
        from tunix.models.qwen2 import model as m, params as p

        config = m.ModelConfig(**common, use_tied_embedding=cfg["tie_word_embeddings"], dtype=jnp.float32,
                               param_dtype=jnp.float32)
    elif cfg["model_type"] == "llama":
        from tunix.models.llama3 import model as m, params as p

        if (rope.get("rope_type") or "default") != "default":
            raise NotImplementedError(f"tunix's Llama3 model has no {rope['rope_type']!r} rope scaling")
        # tunix 0.1.7's Llama3 attention calls apply_rope(x, positions, head_dim=...) without the
        # config's rope_theta (so always its default, 1e6); pass SmolLM2's (1e5). Same compute.
        m.apply_rope = functools.partial(m.apply_rope, rope_theta=theta)
        config = m.ModelConfig(**common, weight_tying=cfg["tie_word_embeddings"])
    else:
        raise NotImplementedError(f"no tunix model for model_type {cfg['model_type']!r}")
    return p.create_model_from_safe_tensors(model_dir, config, mesh, dtype=jnp.float32)


def worker_tunix(job: dict) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    import tunix  # noqa: F401
    from flax import nnx
    from importlib.metadata import version
    from transformers import AutoTokenizer
    from tunix.rl import rl_cluster as rlc
    from tunix.rl.grpo.grpo_learner import GRPOConfig, GRPOLearner
    from tunix.rl.rollout.base_rollout import RolloutConfig

    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    model = _tunix_model(job["model_dir"], mesh)
    tok = AutoTokenizer.from_pretrained(job["model_dir"])
    ids = tok.encode(job["prompt"])  # what tunix's sampler does with a prompt string
    check_t0 = time.time()
    x = jnp.asarray([ids], jnp.int32)
    n = x.shape[1]
    logits, _ = model(x, jnp.arange(n)[None], None, jnp.tril(jnp.ones((1, n, n), bool)))
    lp = jax.nn.log_softmax(logits[0, :-1].astype(jnp.float32), -1)
    check = float(jnp.take_along_axis(lp, x[0, 1:, None], -1).sum())
    job["check_s"] = time.time() - check_t0
    if job.get("check_only"):
        return {"prompt_tokens": len(ids), "prompt_logp": check}

    prompt_len = job["prompt_bucket"]
    steps = job["warmup"] + job["repeats"]
    prompts, t_new, beta = _shape(job)
    b = len(prompts)
    reference = _tunix_model(job["model_dir"], mesh) if beta else None  # tunix's KL needs its own copy
    m = int(job.get("peer_micro_batches") or 1)  # prompts per micro-batch: b // m (the rollout stays whole)
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(LR, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0))
    cluster_config = rlc.ClusterConfig(
        role_to_mesh={rlc.Role.ACTOR: mesh, rlc.Role.REFERENCE: mesh, rlc.Role.ROLLOUT: mesh},
        rollout_engine="vanilla", offload_to_cpu=False,
        training_config=rlc.RLTrainingConfig(actor_optimizer=opt, eval_every_n_steps=10 ** 9, max_steps=steps,
                                             mini_batch_size=b, train_micro_batch_size=b // m,
                                             rollout_micro_batch_size=b, compute_logps_micro_batch_size=b // m),
        rollout_config=RolloutConfig(max_tokens_to_generate=t_new, max_prompt_length=prompt_len,
                                     kv_cache_size=prompt_len + t_new, temperature=1.0, top_p=1.0, top_k=None,
                                     eos_tokens=[-1]))  # an id never sampled: every row runs T steps
    cluster = rlc.RLCluster(actor=model, reference=reference, tokenizer=tok, cluster_config=cluster_config)
    lengths: list[float] = []

    learner = GRPOLearner(rl_cluster=cluster, algo_config=GRPOConfig(num_generations=G, num_iterations=1, beta=beta,
                                                                     epsilon=0.2), reward_fns=[length_reward])
    generate = cluster.generate

    def generate_and_count(*a, **kw):  # only records the completion lengths
        out = generate(*a, **kw)
        lengths.append(min(len(t) for t in out.tokens))
        return out

    cluster.generate = generate_and_count
    stamps: list[float] = []
    walls: list[float] = []
    compiles = _compile_clock()
    inner = learner._run_global_step

    def timed_global_step(*a, **kw):
        out = inner(*a, **kw)
        jax.block_until_ready(nnx.state(cluster.actor_trainer.model))
        stamps.append(time.perf_counter())
        walls.append(time.time())
        return out

    learner._run_global_step = timed_global_step
    stamps.append(time.perf_counter())
    # a batch's fields are arrays (tunix repeats each leaf G times with np.repeat)
    learner.train([{"prompts": np.array(prompts)} for _ in range(steps)])
    med, all_steps = _stats(stamps, job["warmup"])
    return {"step_s": med, "steps_s": all_steps, "compile_s": _compile_per_step(stamps, compiles),
            "prompt_tokens": len(ids), "prompt_logp": check, "completion_len_min": lengths, "min_len": min(lengths),
            **_launch_stats(job, walls[0]), "version": f"google-tunix {version('google-tunix')}, jax {jax.__version__}"}


WORKERS = {"ours": worker_ours, "ours-warm": worker_ours, "trl": worker_trl, "tunix": worker_tunix}


# --------------------------------------------------------------------------- driver


def prepare(name: str, tmp: Path) -> tuple[Path, str]:
    """Write the model directory (safetensors + config + tokenizer); return it and a label."""
    from gguf import GGUFReader

    from jaxrl_llm.models import load_smollm2, save_hf, smollm2_path
    from jaxrl_llm.models.gguf import gguf_tokenizer

    out = tmp / name
    if name == "tiny":
        sys.path.insert(0, str(Path(__file__).parent))
        from rollout_vs_hf import qwen2_8m

        qwen2_8m(out)
        gguf_tokenizer(GGUFReader(str(smollm2_path()))).save_pretrained(str(out))
        return out, "Qwen2-style, random"
    if name == "smollm2":
        model, tok = load_smollm2()
        save_hf(model, out, tokenizer=tok)
        return out, "SmolLM2-135M-Instruct"
    raise SystemExit(f"unknown model {name!r} (tiny, smollm2)")


def run_worker(impl: str, job: dict, *, peer_hugepages: bool = False, ours_venv: Path | None = None) -> dict:
    py = (ours_venv if ours_venv is not None and impl.startswith("ours") else VENVS[impl]) / "bin" / "python"
    if not py.exists():
        how = (f"python3 -m venv {py.parent.parent.name} && {py.parent.parent.name}/bin/pip install -e ."
               if impl.startswith("ours") else f"bash scripts/setup_{'peers' if impl == 'trl' else impl}.sh")
        return {"error": f"{py} missing (run {how})"}
    env = dict(os.environ, JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT))
    env.pop("GLIBC_TUNABLES", None)
    # ours as the jaxrl-llm command runs itself: large allocations on huge pages when JAXRL_LLM_HUGEPAGES=1
    # (jaxrl_llm/launch.py); the peers with the same setting only with --peer-hugepages
    from jaxrl_llm.launch import OPT_IN, malloc_environment

    if impl.startswith("ours"):
        env = malloc_environment(env) or env
    else:
        env.pop(OPT_IN, None)
        if peer_hugepages:
            env = malloc_environment(dict(env, **{OPT_IN: "1"})) or env
    t0 = time.perf_counter()
    job = dict(job, launched=time.time())
    p = subprocess.run([str(py), __file__, "--worker", "ours" if impl == "ours-warm" else impl, "--job", json.dumps(job)], env=env, cwd=str(ROOT),
                       capture_output=True, text=True)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(RESULT)]
    if p.returncode != 0 or not lines:
        tail = "\n".join(p.stderr.strip().splitlines()[-15:])
        print(f"--- {impl} failed (exit {p.returncode}):\n{tail}", file=sys.stderr, flush=True)
        last = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
        return {"error": last[-1] if last else f"exit code {p.returncode}"}
    res = json.loads(lines[-1][len(RESULT):])
    res["process_s"] = time.perf_counter() - t0
    return res


def _execution_cell(res: dict) -> str:
    """Ours' resolved execution settings, per model, for the section's text."""
    parts = []
    for name, r in res.items():
        ex = r.get("ours", {}).get("execution")
        if ex:
            parts.append(f"{name}: " + ", ".join(f"`{k}={v}`" for k, v in ex.items() if v is not None and k != "model.attention"))
    return "; ".join(parts) or "not reported"


def _row(name: str, label: str, res: dict, notes: list[str], n_expected: int, t_new: int = T) -> str:
    ok = {k: v for k, v in res.items() if "error" not in v}
    for k, v in res.items():
        if "error" in v:
            notes.append(f"{name}, {k}: n/a: {v['error']}")
    for k, v in ok.items():
        if v["prompt_tokens"] != n_expected:
            notes.append(f"{name}, {k}: the prompt was tokenised to {v['prompt_tokens']} tokens, not {n_expected}")
        if v["min_len"] < t_new:
            notes.append(f"{name}, {k}: some completions were shorter than {t_new} tokens ({v['min_len']})")
        if len(v.get("compile_s", [])) > 1 and v["compile_s"][1] >= 0.5:
            notes.append(f"{name}, {k}: XLA compiled again in step 2 ({v['compile_s'][1]:.1f} s)")
        late = sum(v.get("compile_s", [])[len(v["warmup_s"]):])
        if late >= 0.05:
            notes.append(f"{name}, {k}: {late:.1f} s of XLA compilation fell inside the timed steps")
    logps = {k: round(v["prompt_logp"], 4) for k, v in ok.items()}
    if logps and max(logps.values()) - min(logps.values()) > 1e-3 * max(1.0, abs(min(logps.values()))):
        notes.append(f"{name}: the loaded models disagree (summed prompt log-probs {logps})")
    n_params = ok.get("ours", {}).get("params")
    size = f", {n_params / 1e6:.1f}M params" if n_params else ""

    def cell(k):
        return f"{ok[k]['step_s']:.2f}" if k in ok else "n/a"

    def ratio(k):
        return f"{ok[k]['step_s'] / ok['ours']['step_s']:.2f}x" if k in ok and "ours" in ok else "n/a"

    def warm(k):
        if k not in ok:
            return "n/a"
        comp = ok[k].get("compile_s") or [0.0] * len(ok[k]["steps_s"])
        return " + ".join(f"{x:.1f}" + (f" ({c:.1f} compiling)" if c >= 0.05 else "")
                          for x, c in zip(ok[k]["warmup_s"], comp))

    ph = ok.get("ours", {}).get("phases_s")
    phases = (f"{ph['rollout']:.2f} / {ph['update']:.2f} / {ph['data'] + ph['rewards'] + ph['prepare']:.2f}"
              if ph else "n/a")
    def first(k):
        return f"{ok[k]['first_step_s']:.0f}" if k in ok and "first_step_s" in ok[k] else "n/a"

    def rss(k):
        return f"{ok[k]['peak_rss_gb']:.1f}" if k in ok and "peak_rss_gb" in ok[k] else "n/a"

    first_cells = f"{first('trl')} / {first('tunix')} / {first('ours')}"
    if "ours-warm" in res:
        first_cells += f" / {first('ours-warm')}"
        if "ours-warm" in ok and "tunix" in ok:
            first_cells += f" ({ok['tunix']['first_step_s'] / ok['ours-warm']['first_step_s']:.1f}x vs tunix)"
    return (f"| {name} ({label}{size}) | {cell('trl')} | {cell('tunix')} | {cell('ours')} | {ratio('trl')} | "
            f"{ratio('tunix')} | {phases} | {first_cells} | {rss('trl')} / {rss('tunix')} / {rss('ours')} | "
            f"{warm('trl')}; {warm('tunix')}; {warm('ours')} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny,smollm2", help="comma-separated: tiny, smollm2")
    ap.add_argument("--impls", default="ours,ours-warm,trl,tunix",
                    help="comma-separated: ours (cold compilation cache), ours-warm (the same run again on the cache ours "
                         "filled), trl, tunix")
    ap.add_argument("--repeats", type=int, default=5, help="timed steps (median reported)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed first steps (compilation)")
    ap.add_argument("--torch-threads", type=int, default=0, help="TRL's torch threads (default: all cores)")
    ap.add_argument("--check-only", action="store_true", help="only compare the loaded models (prompt log-prob)")
    ap.add_argument("--shape", choices=("one-prompt", "realistic"), default="one-prompt",
                    help="one-prompt: 1 chat prompt x 8 x 64 new tokens; realistic: B distinct prompts of about "
                         "--prompt-tokens tokens (8 for tiny, 4 for smollm2) x 8 x --new-tokens")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--beta", type=float, default=0.0, help="KL coefficient (> 0: a reference model in every impl)")
    ap.add_argument("--no-shared-prefix", action="store_true", help="ours: the row-by-row update")
    ap.add_argument("--remat", choices=("auto", "none", "dots", "full"), default="auto",
                    help="ours: model.remat, what the update's backward pass recomputes instead of storing (dots: keeps "
                         "only the projections' outputs; the peers store everything, as configured by default); "
                         "auto: as a plain run chooses (jaxrl_llm.training.auto)")
    ap.add_argument("--shared-prompt-kv", choices=("auto", "true", "false"), default="auto",
                    help="ours: rollout.shared_prompt_kv (the G rows of a prompt read its keys once while decoding)")
    ap.add_argument("--unroll", choices=("auto", "true", "false"), default="auto",
                    help="ours: rollout.unroll_layers (the sampler's layers unrolled, scanned, or the run's rule)")
    ap.add_argument("--bf16", action="store_true",
                    help="ours: float32 training weights, the sampler decoding with them cast to bfloat16 "
                         "(rollout.sampler_dtype=bfloat16, with recipe.old_logp=recompute); TRL: bf16=True (float32 "
                         "weights under bfloat16 autocast). With --shape realistic and --impls ours,trl (not tunix)")
    ap.add_argument("--peer-micro-batches", default="",
                    help="name=m,...: TRL's and tunix's update in m micro-batches (gradient accumulation; the rollout "
                         "stays one batch) so it fits in memory (default: smollm2=4 at --shape realistic, else 1)")
    ap.add_argument("--peer-hugepages", action="store_true",
                    help="run TRL and tunix with large allocations on huge pages (GLIBC_TUNABLES=glibc.malloc.hugetlb=1). "
                         "Ours gets it when JAXRL_LLM_HUGEPAGES=1 is set, as its command does; a GLIBC_TUNABLES of "
                         "the calling shell is not passed to any worker")
    ap.add_argument("--ours-venv", default="",
                    help="run ours from this virtualenv instead of .venv, e.g. .venv-core: the core install of "
                         "scripts/main.sh, without the test extras' torch that transformers imports when present")
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    ap.add_argument("--section", default="", help="with --write: the section's title (default: from the options)")
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        res = WORKERS[a.worker](json.loads(a.job))
        print(RESULT + json.dumps(res), flush=True)
        return
    if a.repeats < 1 or a.warmup < 1:
        raise SystemExit("--repeats and --warmup must be >= 1")

    from jaxrl_llm.models.hf import load_tokenizer
    from jaxrl_llm.rollout.sampler import bucket

    sys.path.insert(0, str(Path(__file__).parent))
    from _report import machine, write_section

    from jaxrl_llm.launch import malloc_environment
    impls = a.impls.split(",")
    if a.bf16 and a.shape != "realistic":
        raise SystemExit("--bf16 is for --shape realistic (its own docs sections)")
    if a.bf16 and "tunix" in impls:
        raise SystemExit("--bf16 compares ours with TRL in bfloat16; drop tunix from --impls (e.g. --impls ours,trl)")
    ours_tuned = malloc_environment() is not None
    rows: list[str] = []
    executions: dict = {}  # model -> {impl: result}: ours reports its resolved execution settings
    notes: list[str] = []
    versions: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models.split(","):
            model_dir, label = prepare(name, Path(tmp))
            tok = load_tokenizer(model_dir)
            prompt = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
            ids = tok(prompt, add_special_tokens=False)["input_ids"]
            n_prompt = len(ids)
            vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
            if max(ids) >= vocab:
                raise SystemExit(f"prompt token {max(ids)} is outside the model's {vocab}-token vocabulary")
            t_new, prompts = T, [prompt]
            if a.shape == "realistic":
                prompts = long_prompts(tok, {"tiny": 8, "smollm2": 4}[name], a.prompt_tokens)
                prompt, t_new = prompts[0], a.new_tokens
                ids = tok(prompt, add_special_tokens=False)["input_ids"]
                n_prompt = len(ids)
            longest = max(len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts)
            micro = dict(kv.split("=") for kv in a.peer_micro_batches.split(",") if kv) if a.peer_micro_batches else (
                {"smollm2": "4"} if a.shape == "realistic" else {})
            job = {"model_dir": str(model_dir), "peer_micro_batches": int(micro.get(name, 1)), "prompt": prompt, "prompts": prompts, "new_tokens": t_new,
                   "beta": a.beta, "remat": a.remat, "shared_prompt_kv": a.shared_prompt_kv, "bf16": a.bf16, "unroll": a.unroll, "shared_prefix": not a.no_shared_prefix, "warmup": a.warmup, "repeats": a.repeats,
                   "prompt_bucket": bucket(longest, (32, 64, 128, 256, 512, 1024, 2048)),
                   "check_only": a.check_only, "torch_threads": a.torch_threads,
                   "compile_cache": str(Path(tmp) / f"xla-cache-{name}")}  # ours: cold, then ours-warm reads it
            res = {}
            for impl in impls:
                print(f"[{name}] {impl} ...", flush=True)
                # ours-warm only measures the launch on a warm cache: two steps are enough
                res[impl] = run_worker(impl, dict(job, warmup=1, repeats=1) if impl == "ours-warm" else job,
                                       peer_hugepages=a.peer_hugepages,
                                       ours_venv=(ROOT / a.ours_venv) if a.ours_venv else None)
                if "steps_s" in res[impl]:
                    res[impl]["warmup_s"] = res[impl]["steps_s"][:1 if impl == "ours-warm" else a.warmup]
                versions.update({impl: res[impl]["version"]} if "version" in res[impl] else {})
                print(f"[{name}] {impl}: {json.dumps(res[impl])}", flush=True)
            if a.check_only:
                print(f"[{name}] {len(ids)} prompt tokens; summed prompt log-probs: "
                      + ", ".join(f"{k} {v.get('prompt_logp', v.get('error'))}" for k, v in res.items()))
                continue
            executions[name] = res
            rows.append(_row(name, label, res, notes, len(ids), t_new))
            print(rows[-1], flush=True)
    if a.check_only:
        return
    body = (
        "One GRPO step of `jaxrl_llm.training.RLTrainer` (`recipe(\"grpo\", num_samples=8)`) vs TRL's "
        "`GRPOTrainer` (torch CPU) and google-tunix's `GRPOLearner` (JAX CPU) on the same weights, same run, each "
        f"in its own process and virtualenv: 1 chat prompt ({n_prompt} tokens) x 8 completions x exactly 64 new "
        "tokens (temperature 1, no top-k/top-p, no stop), reward = completion length, GRPO group advantages, one "
        "log-prob forward + backward and one AdamW update (lr 1e-6, clipping at norm 1), float32, beta = 0 (no "
        "reference model), one optimiser update per rollout. Step = wall time between the ends of consecutive "
        "optimiser steps inside each library's own training loop (`trainer.run`, `trainer.train()`, "
        f"`learner.train`); median of {a.repeats} steps after {a.warmup} warm-up steps, whose times are listed "
        "with the XLA compilation inside them. Speed-up = their step time / ours. Ours by phase: rollout / "
        "update / rest (data, rewards, advantages and batch layout). "
        f"Versions: {'; '.join(f'{k}: {v}' for k, v in versions.items())}. Machine: {machine()}. "
        "Reproduce (after `bash scripts/setup_peers.sh` and `bash scripts/setup_tunix.sh`): "
        "`.venv/bin/python benchmarks/grpo_step_vs_peers.py --write`.\n\n"
        "| model | TRL s | tunix s | ours s | speed-up vs TRL | speed-up vs tunix | ours rollout / update / rest s "
        "| launch to end of step 1, s (TRL / tunix / ours cold cache / ours warm cache) | peak RSS GB (TRL / tunix "
        "/ ours) | warm-up steps s (TRL; tunix; ours) |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows))
    section = "grpo_step_vs_peers"
    if a.shape == "realistic":
        section = f"grpo_step_vs_peers, realistic shapes, beta {a.beta:g}" + (f", bf16 ({a.models})" if a.bf16 else "")
        body = (
            f"The same comparison at realistic shapes: B distinct chat prompts per step (8 for tiny, 4 for smollm2), "
            f"each a long system prompt of worked examples plus its own question, {a.prompt_tokens - 8}-"
            f"{a.prompt_tokens} tokens, x 8 completions x exactly {a.new_tokens} new tokens; beta = {a.beta:g} "
            f"({'no reference model' if not a.beta else 'a reference model and the k3 KL term in every implementation'}"
            f"); ours {'row by row' if a.no_shared_prefix else 'with its default shared-prefix update'}"
            + (f" and `model.remat={a.remat}`" if a.remat != "auto" else "")
            + (f" and `rollout.shared_prompt_kv={a.shared_prompt_kv}`" if a.shared_prompt_kv != "auto" else "")
            + (f" and `rollout.unroll_layers={a.unroll}`" if a.unroll != "auto" else "")
            + (", with its execution settings as a plain run resolves them (" + _execution_cell(executions) + ")"
               if (a.remat, a.shared_prompt_kv, a.unroll) == ("auto",) * 3 else "") + ". "
            + ("In bfloat16: ours keeps float32 training weights and samples with them cast to bfloat16 "
               "(`rollout.sampler_dtype=bfloat16`, which needs `recipe.old_logp=recompute`: one more forward pass "
               "for the old log-probs); TRL runs with `bf16=True` (float32 weights under bfloat16 autocast, its "
               "generation included). " if a.bf16 else "")
            + "Everything else as in the section \"grpo_step_vs_peers, realistic shapes, beta 0\" (" + ("" if a.bf16 else "float32, ")
            + "one AdamW update per rollout, medians of "
            f"{a.repeats} steps after {a.warmup} warm-up steps). "
            f"Versions: {'; '.join(f'{k}: {v}' for k, v in versions.items())}. Machine: {machine()}. "
            f"Reproduce: `.venv/bin/python benchmarks/grpo_step_vs_peers.py --models {a.models} --shape realistic "
            f"--beta {a.beta:g} "
            f"--repeats {a.repeats} --warmup {a.warmup}" + (f" --remat {a.remat}" if a.remat != "auto" else "")
            + (f" --shared-prompt-kv {a.shared_prompt_kv}" if a.shared_prompt_kv != "auto" else "")
            + (f" --unroll {a.unroll}" if a.unroll != "auto" else "") + (" --bf16 --impls " + a.impls if a.bf16 else "")
            + (" --peer-hugepages" if a.peer_hugepages else "") + (f" --ours-venv {a.ours_venv}" if a.ours_venv else "")
            + "`" + (" with `JAXRL_LLM_HUGEPAGES=1` in the environment" if ours_tuned else "")
            + ".\n\n"
            + body[body.index("| model | TRL s"):])
    if ours_tuned or a.peer_hugepages:
        notes.append("Allocator: " + ("ours with large allocations on transparent huge pages (`JAXRL_LLM_HUGEPAGES=1`, "
                                      "jaxrl_llm/launch.py)" if ours_tuned else "ours with glibc's defaults")
                     + "; TRL and tunix " + ("with huge pages (`--peer-hugepages`)." if a.peer_hugepages else
                                            "with glibc's defaults, as installed."))
    if notes:
        body += "\n\n" + "\n".join(f"- {n}" for n in notes)
    print(body)
    if a.write:
        write_section(a.section or section, body)


if __name__ == "__main__":
    main()
