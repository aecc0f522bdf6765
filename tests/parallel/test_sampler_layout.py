"""The sampler's own weight layout (``Sampler(param_rules=SAMPLER_RULES)``,
``rollout.sampler_weights=tensor``) on 8 simulated devices: the same completions as with the
trainer's FSDP layout, without the FSDP all-gathers inside the decode loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

# 8 simulated devices, the mesh from argv[1], a tiny model created in its shards
PRELUDE = textwrap.dedent("""
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import json, jax, numpy as np
    from flax import nnx
    from jaxrl_llm.models import ModelConfig, Transformer
    from jaxrl_llm.parallel import SAMPLER_RULES, init_sharded, make_mesh, state_shardings
    from jaxrl_llm.rollout import Sampler, SamplingConfig
    mesh = make_mesh(tuple(int(x) for x in sys.argv[1].split(",")))
    cfg = ModelConfig(vocab_size=96, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                      intermediate_size=128)
    gd, params = nnx.split(init_sharded(cfg, mesh, 0))
""")

SCRIPT = PRELUDE + textwrap.dedent("""
    scfg = SamplingConfig(max_new_tokens=12, num_samples=2, temperature=1.0, pad_token_id=0)
    prompts = [[int(t) for t in np.random.default_rng(i).integers(4, 96, 5 + i)] for i in range(8)]
    out = {}
    for name, rules in (("train", None), ("tensor", SAMPLER_RULES)):
        s = Sampler(gd, scfg, length_buckets=(16,), mesh=mesh, param_rules=rules, unroll_layers=False)
        r = s(params, prompts, jax.random.key(3))
        p = params if rules is None else jax.device_put(params, state_shardings(params, mesh, rules))
        with jax.set_mesh(mesh):
            hlo = s._fn.lower(gd, p, *[jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.P(("data", "fsdp"))))
                                        for x in (np.ones((8, 16), np.int32), np.ones((8, 16), bool))],
                              jax.random.key(3), scfg, unroll_layers=False).compile().as_text()
        lines = hlo.splitlines()
        out[name] = {"tokens": np.asarray(r.tokens).tolist(), "logprobs": np.asarray(r.logprobs).tolist(),
                     # collectives XLA attributes to the decode loop (op_name ".../while/body/...")
                     "gathers_in_loop": sum("all-gather" in l and "/while/body/" in l for l in lines),
                     "ops_in_loop": sum("/while/body/" in l for l in lines)}
    print(json.dumps(out))
""")


@pytest.mark.parametrize("mesh", ["1,4,2", pytest.param("2,4,1", marks=pytest.mark.slow)])
def test_sampler_layout_same_completions_without_per_token_gathers(mesh):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    p = subprocess.run([sys.executable, "-c", SCRIPT, mesh], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["train"]["tokens"] == r["tensor"]["tokens"]
    lt, ls = (sum(r[k]["logprobs"], []) for k in ("train", "tensor"))
    assert max(abs(a - b) for a, b in zip(lt, ls)) < 1e-5
    assert r["train"]["ops_in_loop"] > 0 and r["train"]["gathers_in_loop"] > 0, r["train"]
    print(mesh, "all-gathers in the decode loop: train layout", r["train"]["gathers_in_loop"], "tensor layout",
          r["tensor"]["gathers_in_loop"])
    if mesh.endswith(",1"):  # no tensor axis: the sampler's weights are whole on every device
        assert r["tensor"]["gathers_in_loop"] == 0, r["tensor"]
    else:  # what remains gathers activations split over tensor (e.g. the vocabulary for sampling)
        assert r["tensor"]["gathers_in_loop"] < r["train"]["gathers_in_loop"]


SHARED_SCRIPT = PRELUDE + textwrap.dedent("""
    gd1, params1 = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    out = {}
    for n_prompts in (8, 3):  # 3 prompts: the shared prefix's batch is not divisible by the data axes
        prompts = [[int(t) for t in np.random.default_rng(i).integers(4, 96, 5 + i)] for i in range(n_prompts)]
        for name, shared in (("copied", False), ("shared", True)):
            scfg = SamplingConfig(max_new_tokens=10, num_samples=2, temperature=1.0, pad_token_id=0,
                                  shared_prompt_kv=shared)
            for where, g, p, m in (("mesh", gd, params, mesh), ("one", gd1, params1, None)):
                r = Sampler(g, scfg, length_buckets=(16,), mesh=m)(p, prompts, jax.random.key(3))
                out[f"{n_prompts}/{name}/{where}"] = {"tokens": np.asarray(r.tokens).tolist(),
                                                     "logprobs": np.asarray(r.logprobs).ravel().tolist()}
    print(json.dumps(out))
""")


@pytest.mark.parametrize("mesh", ["2,2,2"])
def test_shared_prompt_kv_on_a_mesh(mesh):
    """``shared_prompt_kv`` (what a run's execution settings turn on at long prompts) on 8 devices:
    the same tokens as one device and as the copied cache, log-probs to float rounding; also when
    the prompts do not divide over the data axes."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    p = subprocess.run([sys.executable, "-c", SHARED_SCRIPT, mesh], capture_output=True, text=True, env=env,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    for n in (8, 3):
        ref = r[f"{n}/copied/one"]
        for k in ("copied/mesh", "shared/one", "shared/mesh"):
            got = r[f"{n}/{k}"]
            assert got["tokens"] == ref["tokens"], (n, k)
            assert max(abs(a - b) for a, b in zip(got["logprobs"], ref["logprobs"])) < 1e-4, (n, k)
