"""The ``auto`` execution settings (issue 38, jaxrl_llm.training.auto): every choice resolves as
docs/benchmarks.md's rule says at two or more shapes each way, an explicit setting always wins,
and the runner logs the result (config.json, one printed line) and runs with it."""

import dataclasses
import json

import pytest

from jaxrl_llm.config import ConfigError
from jaxrl_llm.models import ModelConfig
from jaxrl_llm.models.config import PRESETS
from jaxrl_llm.training.auto import (REMAT_DOTS_MIN_BYTES, SHARED_KV_MIN_BYTES, RunShape, activation_bytes, choose,
                                     resolve_remat)
from jaxrl_llm.training.configs import ModelSpec
from jaxrl_llm.training.loading import shapes_of
from jaxrl_llm.training.runner import (DataSpec, ModelSpec as RunnerModelSpec, OptimSpec, RLRunConfig, RolloutSpec,
                                       RunSpec, SFTSpec, check_rl, resolve_execution, run_rl)

SMOL = PRESETS["smollm2-135m"]
# shape (a)'s model: Qwen2-style, 6 layers, hidden 256, vocabulary 16,384 (benchmarks/rollout_vs_hf.py qwen2_8m)
QWEN8M = ModelConfig(vocab_size=16384, hidden_size=256, num_layers=6, num_heads=8, num_kv_heads=2, head_dim=32,
                     intermediate_size=768, tie_embeddings=True)
TINY = shapes_of(ModelSpec(source="tiny", hidden_size=32, num_layers=1))
TINY64 = shapes_of(ModelSpec(source="tiny", hidden_size=64, num_layers=2))

SHAPE_A = (QWEN8M, RunShape(8, 8, 256, 128, 64, 384))  # docs/benchmarks.md shape (a)
SHAPE_B = (SMOL, RunShape(4, 8, 256, 128, 32, 384))  # shape (b)
MAIN = (SMOL, RunShape(4, 8, 64, 12, 32, 76))  # the main job (experiments/smollm2_grpo.py)
TESTS = (TINY, RunShape(2, 4, 32, 4, 8, 36))  # the test suite's tiny runs
TINY_PRESET = (TINY64, RunShape(8, 8, 32, 8, 64, 40))  # experiments/tiny_grpo.py's scale


@pytest.mark.parametrize("case", [SHAPE_A, SHAPE_B, MAIN])
def test_remat_dots_for_large_updates(case):
    m, s = case
    ex = choose(m, s)
    assert ex["model.remat"] == "dots"
    assert activation_bytes(m, s.update_rows, s.update_len) >= REMAT_DOTS_MIN_BYTES
    c = next(c for c in ex.choices if c.key == "model.remat")
    assert not c.given and "GiB" in c.why


@pytest.mark.parametrize("case", [TESTS, TINY_PRESET])
def test_remat_none_for_small_updates(case):
    assert choose(*case)["model.remat"] == "none"


def test_remat_threshold_is_the_activation_estimate():
    m = SMOL
    # rows x 76 tokens: the estimate grows with the rows; the choice flips where it crosses the threshold
    per_row = activation_bytes(m, 1, 76)
    rows = int(REMAT_DOTS_MIN_BYTES // per_row)
    assert choose(m, RunShape(1, 1, 64, 12, rows, 76))["model.remat"] == "none"
    assert choose(m, RunShape(1, 1, 64, 12, rows + 1, 76))["model.remat"] == "dots"


@pytest.mark.parametrize("case,given", [(SHAPE_B, "none"), (MAIN, "full"), (TESTS, "dots"), (TINY_PRESET, "full")])
def test_remat_explicit_wins(case, given):
    ex = choose(*case, remat=given)
    assert ex["model.remat"] == given
    assert next(c for c in ex.choices if c.key == "model.remat").given


@pytest.mark.parametrize("case", [SHAPE_A, SHAPE_B, MAIN])
def test_shared_prompt_kv_on_where_it_saves_bytes(case):
    assert choose(*case)["rollout.shared_prompt_kv"] is True


@pytest.mark.parametrize("case", [TESTS, TINY_PRESET])
def test_shared_prompt_kv_off_for_tiny_caches(case):
    c = next(c for c in choose(*case).choices if c.key == "rollout.shared_prompt_kv")
    assert c.value is False and "MiB" in c.why


def test_shared_prompt_kv_off_where_it_does_not_apply():
    m, s = SHAPE_B
    assert choose(m, dataclasses.replace(s, num_samples=1))["rollout.shared_prompt_kv"] is False
    ex = choose(m, s, shared_kv_why_not="rollout.tree_segment (TreePO)")
    assert ex["rollout.shared_prompt_kv"] is False
    # short prompts and long responses: the prompt's share of a decode step's bytes is below 10%
    long_resp = choose(m, RunShape(4, 8, 32, 2048, 32, 2080))
    assert long_resp["rollout.shared_prompt_kv"] is False
    # many prompts' worth is needed: a few copies of a short prompt are below 16 MiB
    per_token = m.num_layers * 2 * m.num_kv_heads * m.head_dim * 4
    few = choose(m, RunShape(1, 2, 32, 8, 2, 40))
    assert 32 * per_token < SHARED_KV_MIN_BYTES and few["rollout.shared_prompt_kv"] is False


@pytest.mark.parametrize("case,given", [(SHAPE_B, False), (MAIN, False), (TESTS, True), (TINY_PRESET, True)])
def test_shared_prompt_kv_explicit_wins(case, given):
    ex = choose(*case, shared_prompt_kv=given)
    assert ex["rollout.shared_prompt_kv"] is given


def test_unroll_follows_the_samplers_rule():
    assert choose(*SHAPE_B)["rollout.unroll_layers"] is False  # float32, 0.5 GiB: scanned
    assert choose(*MAIN)["rollout.unroll_layers"] is False
    assert choose(*SHAPE_A)["rollout.unroll_layers"] is True  # 33 MiB: unrolled
    assert choose(*TESTS)["rollout.unroll_layers"] is True
    assert choose(*SHAPE_B, sampler_dtype="bfloat16")["rollout.unroll_layers"] is True  # decoded in 16 bits
    bf16 = dataclasses.replace(SMOL, param_dtype="bfloat16", dtype="bfloat16")
    assert choose(bf16, SHAPE_B[1])["rollout.unroll_layers"] is True
    assert choose(*SHAPE_B, unroll_layers=True)["rollout.unroll_layers"] is True
    assert choose(*TESTS, unroll_layers=False)["rollout.unroll_layers"] is False


def test_unroll_agrees_with_the_sampler_on_real_weights():
    """The config-time rule and the sampler's rule on the weights themselves give the same answer."""
    import jax
    from flax import nnx

    from jaxrl_llm.models import Transformer
    from jaxrl_llm.rollout.sampler import resolve_unroll

    for cfg in (TINY, dataclasses.replace(TINY, vocab_size=40000, hidden_size=1024, head_dim=256,
                                          intermediate_size=4096)):
        abstract = nnx.eval_shape(lambda c=cfg: Transformer(c, rngs=nnx.Rngs(0)))
        params = nnx.state(abstract, nnx.Param)
        params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
        expect = resolve_unroll("auto", params)
        assert choose(cfg, TESTS[1])["rollout.unroll_layers"] is expect


def test_sampler_dtype_is_never_chosen_and_attention_is_reported():
    for case in (SHAPE_A, SHAPE_B, TESTS):
        ex = choose(*case)
        assert ex["rollout.sampler_dtype"] is None
        assert ex["model.attention"] == "auto"
    assert choose(*SHAPE_B, sampler_dtype="bfloat16")["rollout.sampler_dtype"] == "bfloat16"
    line = choose(*SHAPE_B).line()
    assert "model.attention=auto (dense)" in line
    assert "auto (blockwise)" in choose(SMOL, RunShape(1, 8, 4096, 128, 8, 4224)).line()
    assert "auto (splash)" in choose(*SHAPE_B, platform="tpu").line()
    given = dataclasses.replace(SMOL, attention="blockwise")
    assert "model.attention=blockwise (given)" in choose(given, SHAPE_B[1]).line()


def test_line_and_dict():
    ex = choose(*SHAPE_B, remat="none")
    line = ex.line()
    assert line.startswith("execution: model.remat=none (given), rollout.shared_prompt_kv=true, ")
    d = ex.to_dict()
    assert d["model.remat"] == {"value": "none", "why": "set in the config", "given": True}
    assert d["rollout.shared_prompt_kv"]["given"] is False
    json.dumps(d)


def test_resolve_remat_for_training_only_runs():
    spec, ex = resolve_remat(ModelSpec(source="tiny", hidden_size=32, num_layers=1), 16, 40)
    assert spec.remat == "none" and ex["model.remat"] == "none"
    spec, ex = resolve_remat(ModelSpec(source="smollm2", preset="smollm2-135m"), 64, 512)
    assert spec.remat == "dots"
    spec, _ = resolve_remat(ModelSpec(source="smollm2", preset="smollm2-135m", remat="full"), 64, 512)
    assert spec.remat == "full"


# ----------------------------------------------------------------------------- the runner


def tiny(out, **over) -> RLRunConfig:
    return RLRunConfig(
        model=RunnerModelSpec(source="tiny", hidden_size=32, num_layers=1, **over.pop("model", {})),
        data=DataSpec(task="arithmetic", task_args={"preset": "add1", "instruction": ""}, chat=False,
                      train_rows=64, eval_rows=8),
        rollout=RolloutSpec(prompts_per_step=2, num_samples=4, max_new_tokens=4, prompt_buckets=(32,),
                            **over.pop("rollout", {})),
        optim=OptimSpec(lr=1e-3), sft=SFTSpec(steps=0, batch_size=8),
        run=RunSpec(out=str(out), steps=1, eval_every=0, checkpoint_every=0, log_samples_every=0, export_hf=False,
                    plot=False, tensorboard=False, progress=False))


def test_runner_resolves_and_explicit_wins(tmp_path):
    cfg, ex = resolve_execution(tiny(tmp_path))
    assert (cfg.model.remat, cfg.rollout.shared_prompt_kv, cfg.rollout.unroll_layers) == ("none", False, True)
    big = dataclasses.replace(tiny(tmp_path), model=RunnerModelSpec(source="smollm2", preset="smollm2-135m"),
                              rollout=RolloutSpec(prompts_per_step=4, num_samples=8, max_new_tokens=128,
                                                  prompt_buckets=(256,)))
    cfg, ex = resolve_execution(big)
    assert (cfg.model.remat, cfg.rollout.shared_prompt_kv, cfg.rollout.unroll_layers) == ("dots", True, False)
    given = dataclasses.replace(big, model=dataclasses.replace(big.model, remat="none"),
                                rollout=dataclasses.replace(big.rollout, shared_prompt_kv=False, unroll_layers=True))
    cfg, ex = resolve_execution(given)
    assert (cfg.model.remat, cfg.rollout.shared_prompt_kv, cfg.rollout.unroll_layers) == ("none", False, True)
    assert all(c.given for c in ex.choices if c.key != "rollout.sampler_dtype" and c.key != "model.attention")
    # TreePO's segment tree and a mixture of experts: prompt keys are not shared
    tree = dataclasses.replace(big, rollout=dataclasses.replace(big.rollout, tree_segment=32))
    assert resolve_execution(tree)[0].rollout.shared_prompt_kv is False
    moe = dataclasses.replace(big, model=RunnerModelSpec(source="hf:/nowhere", preset="qwen3-30b-a3b"))
    assert resolve_execution(moe)[0].rollout.shared_prompt_kv is False
    assert check_rl(big)["execution"]["model.remat"]["value"] == "dots"


def test_bad_values_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="model.remat"):
        check_rl(tiny(tmp_path, model={"remat": "dot"}))
    with pytest.raises(ConfigError, match="rollout.shared_prompt_kv"):
        check_rl(tiny(tmp_path, rollout={"shared_prompt_kv": "yes"}))


def test_run_logs_the_choices(tmp_path, capsys):
    run_rl(tiny(tmp_path / "run"))
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if x.startswith("execution: "))
    assert "model.remat=none" in line and "rollout.shared_prompt_kv=false" in line
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["model"]["remat"] == "none" and cfg["rollout"]["shared_prompt_kv"] is False
    assert cfg["execution"]["model.remat"]["value"] == "none" and not cfg["execution"]["model.remat"]["given"]
