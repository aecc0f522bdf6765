"""The planner's targets (``jaxrl-llm plan --target``): target names, the refusals, ``--search`` on
this host's CPU, and (``-m slow``, with ``.venv-tpu`` / ``.venv-gpu`` from
``scripts/setup_tpu_compiler.sh`` / ``setup_gpu_compiler.sh``) the seed papers' experiments compiled
by the chips' own compilers: each must fit its chips' memory, train step and sampler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl_llm import cli
from jaxrl_llm.plan import PlanSpec, parse_target, search

ROOT = Path(__file__).resolve().parents[2]


def test_target_names():
    t = parse_target("tpu-v5e:8x8")
    assert (t.platform, t.topology, t.chip, t.devices, t.usable_hbm_gib) == ("tpu", "v5e:8x8", "tpu-v5e", 64, 15.75)
    assert parse_target("v5e-64").topology == "v5e:8x8"
    p = parse_target("v5p-16")  # Cloud TPU names count TensorCores: 8 v5p chips
    assert (p.topology, p.devices, p.usable_hbm_gib) == ("v5p:2x2x2", 8, 95.74)
    assert parse_target("v4-16").devices == 16  # libtpu counts v4's two TensorCores as devices
    assert parse_target("tpu-v6e:4x4").devices == 16
    h = parse_target("h100:8")
    assert (h.platform, h.topology, h.devices) == ("gpu", "1x1x8", 8)
    for bad, msg in (("v5e-48", "no standard v5e slice of 48 chips"), ("v5p-15", "2 TensorCores per chip"),
                     ("tpu-v9:2x2", "unknown target")):
        with pytest.raises(ValueError, match=msg):
            parse_target(bad)


def test_plan_target_refusals_are_one_line(capsys):
    rc = cli.main(["plan", "--model", "tiny", "--prompts", "0", "--target", "v5e-64"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "the mesh has 1 devices, the target v5e-64 has 64" in err[0]
    rc = cli.main(["plan", "--model", "tiny", "--prompts", "0", "--target", "v5e-7"])
    assert rc == 2 and "no standard v5e slice of 7 chips" in capsys.readouterr().err
    rc = cli.main(["plan", "--model", "tiny", "--prompts", "0", "--seq-len", "64", "--context", "3"])
    assert rc == 2 and "PlanSpec.context=3 must divide the sequence length seq_len=64" in capsys.readouterr().err


def test_plan_target_without_the_compiler_names_the_setup(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_compiler_python", lambda platform: None)
    args = cli._parser()[1]["plan"].parse_intermixed_args(["--model", "tiny", "--mesh", "1,64,1", "--target", "v5e-64"])
    args.argv = []
    assert cli._run_for_target(args, parse_target("v5e-64")) == 2
    err = capsys.readouterr().err
    assert "needs libtpu; run `bash scripts/setup_tpu_compiler.sh`" in err
    assert cli._run_for_target(args, parse_target("h100:8")) == 2
    assert "bash scripts/setup_gpu_compiler.sh" in capsys.readouterr().err


def test_search_finds_the_least_compute_that_fits():
    """On this host's one CPU device: with room for everything, no remat in one micro-batch; with
    less room than that needs, a setting that fits, never one that was measured not to."""
    import jax

    dev = jax.devices()[:1]
    base = PlanSpec(model="tiny", rows=8, seq_len=256, prompts=0, hbm_gib=64.0)
    roomy = search(base, devices=dev)
    assert roomy["best_settings"] == {"remat": "none", "context": 1, "fsdp": 1, "num_microbatches": 1}
    assert [t["remat"] for t in roomy["tried"]] == ["full", "dots", "none"] and all(t["fits"] for t in roomy["tried"])
    need = roomy["tried"][-1]["peak_gib"]  # no remat, one micro-batch
    tight = search(PlanSpec(model="tiny", rows=8, seq_len=256, prompts=0, hbm_gib=need * 0.97), devices=dev)
    first_none = next(t for t in tight["tried"] if t["remat"] == "none")
    assert first_none["num_microbatches"] == 1 and not first_none["fits"]
    assert tight["best"] is not None and tight["best_settings"] != roomy["best_settings"]
    assert tight["best"]["train_step"]["peak_with_reference"] <= need * 0.97 * 2**30
    chosen = tight["best_settings"]
    tried = [{k: t[k] for k in chosen} for t in tight["tried"]]
    assert chosen in tried and tight["tried"][tried.index(chosen)]["fits"]


# ----------------------------------------------------------------------- the chips' own compilers
SEED_PLANS = {
    # name: (experiment and overrides, target)
    "qwen2.5-7b-dapo-20k-v5e-64": ("qwen25_7b_dapo_20k_tpu", "v5e-64"),
    "qwen2.5-7b-dapo-20k-v5p-16": ("qwen25_7b_dapo_20k_tpu mesh.fsdp=8 mesh.context=1 rollout.prompts_per_step=8",
                                   "v5p-16"),
    "qwen2.5-32b-16k-v5p-64": ("qwen25_32b_16k_tpu", "v5p-64"),
    "qwen3-30b-a3b-16k-v5p-64": ("qwen3_30b_a3b_16k_tpu", "v5p-64"),
    "gemma3-27b-32k-v5p-64": ("gemma3_27b_32k_tpu", "v5p-64"),
    "qwen2.5-7b-dapo-16k-h100-8": ("qwen25_7b_gsm8k_dapo_gpu", "h100:8"),
}


def _compiler(platform: str):
    py = cli._compiler_python(platform)
    if py is None:
        pytest.skip(f"no {platform.upper()} compiler here: bash scripts/setup_{platform}_compiler.sh first")
    return py


def _plan(*args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, "-m", "jaxrl_llm", "plan", *args, "--json"], capture_output=True, text=True,
                          env=env, timeout=3600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SEED_PLANS))
def test_seed_experiments_fit_their_chips(name):
    exp, target = SEED_PLANS[name]
    _compiler(parse_target(target).platform)
    r = _plan(*exp.split(), "--target", target)
    assert r["target"]["name"] == target and r["devices"] == parse_target(target).devices
    assert r["fit"]["train_fits"], (name, r["train_step"].get("compiled_peak"), r["fit"])
    assert r["fit"]["sampler_fits"], (name, r["sampler"]["compiled_peak"], r["fit"])


@pytest.mark.slow
def test_qwen7b_16k_on_v5e16_dense_is_refused_and_splash_compiles():
    """The issue's starting point: the GRPO step of Qwen2.5-7B with 16,384-token rows on 16 v5e chips
    (one row each, FSDP, bf16 compute, remat=full) was refused by the TPU compiler for 57 GiB of
    temporaries with dense attention; splash attention removes the score matrices."""
    _compiler("tpu")
    flags = ["--model", "qwen2.5-7b", "--mesh", "1,16,1", "--rows", "16", "--seq-len", "16384", "--prompts", "0",
             "--dtype", "bfloat16", "--remat", "full", "--target", "v5e-16"]
    dense = _plan(*flags, "--attention", "dense")
    assert "refused" in dense["train_step"] and not dense["fit"]["train_fits"]
    assert dense["train_step"]["compiled_temp"] > 40 * 2**30
    splash = _plan(*flags, "--attention", "splash")
    assert "refused" not in splash["train_step"]
    assert splash["train_step"]["compiled_temp"] < 20 * 2**30
