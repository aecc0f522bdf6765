"""Mixture of experts (Qwen3-MoE): expert parallelism on 8 simulated devices, the
load-balancing loss against transformers', routing replay and the mismatch rate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hf_factory import make_hf_model, padded_batch, save_hf_model
from jaxrl_llm.models import Transformer, load_hf, preset
from jaxrl_llm.models.transformer import RouterStats, load_balancing_loss, router_mismatch


def test_forward_on_data_expert_meshes_equals_single_device():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("moe_sharding_worker.py"))],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    for shape in ("(2, 4)", "(1, 8)", "(4, 2)"):
        r = res[shape]
        assert r["choice_equal"] and r["routes_equal"] and r["dropped_equal"], (shape, r)
        assert max(r["forward"], r["replay"], r["decode"], r["capacity"]) < 1e-5 and r["grad"] < 1e-6, (shape, r)
    assert res["capacity_dropped"] > 0  # the capacity path really dropped assignments
    assert res["self_replay"] == 0.0  # replaying the router's own choices is the plain forward
    assert res["replay_differs"] > 1e-3  # and other routes do change the output


def test_load_balancing_loss_equals_transformers(tmp_path):
    hf = make_hf_model("qwen3_moe", seed=2)
    model = load_hf(save_hf_model(hf, tmp_path / "moe"))
    import torch

    tokens, mask = padded_batch(4)
    m = torch.tensor(mask.astype(np.int64))
    with torch.no_grad():
        out = hf(input_ids=torch.tensor(tokens.astype(np.int64)), attention_mask=m,
                 position_ids=(m.cumsum(-1) - 1).clamp(min=0), output_router_logits=True)
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    ref = float(load_balancing_loss_func(out.router_logits, 8, 2, m))
    _, _, stats = model(tokens, mask, return_routing=True)
    assert abs(float(load_balancing_loss(stats)) - ref) < 1e-5 * max(1.0, abs(ref)), (float(load_balancing_loss(stats)), ref)
    assert stats.choice.shape == (3, 3, 9, 2) and float(jnp.sum(stats.tokens)) == 3 * mask.sum()


def test_router_mismatch_counts_differing_expert_sets():
    choice = jnp.asarray([[[[0, 1], [2, 3]]]])  # [L=1, B=1, T=2, k=2]
    stats = RouterStats(choice, jnp.zeros((1, 4)), jnp.zeros((1, 4)), jnp.ones((1,)))
    same_set = jnp.asarray([[[[1, 0]], [[2, 3]]]])  # [B, T, L, k]: order within the set does not matter
    assert float(router_mismatch(stats, same_set, jnp.ones((1, 2), bool))) == 0.0
    other = jnp.asarray([[[[1, 0]], [[2, 0]]]])
    assert float(router_mismatch(stats, other, jnp.ones((1, 2), bool))) == 0.5
    assert float(router_mismatch(stats, other, jnp.asarray([[True, False]]))) == 0.0  # padding ignored


def test_replay_weights_are_the_routers_probabilities_at_the_replayed_experts():
    """With routes replayed, the experts that compute are the replayed ones and their weights
    come from the current router (renormalised over the k): gradients reach the router."""
    cfg = preset("tiny-moe", num_layers=1)
    model = Transformer(cfg, rngs=nnx.Rngs(1))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 5)), jnp.int32)
    _, _, stats = model(tokens, return_routing=True)
    routes = jnp.moveaxis(stats.choice, 0, 2)
    flipped = (routes + 3) % cfg.num_experts
    gd, params = nnx.split(model)

    def out(p, r):
        return nnx.merge(gd, p)(tokens, routes=r)[0]

    g = jax.grad(lambda p, r: jnp.sum(out(p, r)[..., :7]))(params, flipped)
    assert float(jnp.abs(g["blocks"]["moe"]["router"]["kernel"][...]).max()) > 0
    assert float(jnp.abs(out(params, flipped) - out(params, routes)).max()) > 1e-3
    with pytest.raises(ValueError, match="routes"):
        model(tokens, routes=routes[:, :2])


def test_capacity_buffers_equal_dropless_when_nothing_drops_and_count_drops():
    """``moe_capacity_factor = E / k`` leaves room for every token: the dropless outputs; a
    smaller factor drops assignments, counted in ``RouterStats.dropped``."""
    cfg = preset("tiny-moe")
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    params = nnx.state(model)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (4, 16)), jnp.int32)
    h0, _, s0 = model(tokens, return_routing=True)
    assert float(jnp.sum(s0.dropped)) == 0.0

    def with_factor(c):
        gd = nnx.graphdef(Transformer(cfg.replace(moe_capacity_factor=c), rngs=nnx.Rngs(0)))
        return nnx.merge(gd, params)(tokens, return_routing=True)

    h, _, st = with_factor(cfg.num_experts / cfg.num_experts_per_tok)
    assert float(jnp.abs(h - h0).max()) < 1e-5 and float(jnp.sum(st.dropped)) == 0.0
    h, _, st = with_factor(0.5)  # room for half the assignments on average
    n = 4 * 16 * cfg.num_experts_per_tok * cfg.num_layers
    assert 0.3 * n < float(jnp.sum(st.dropped)) < 0.8 * n
    assert float(jnp.abs(h - h0).max()) > 1e-3


def test_padding_takes_no_expert_capacity():
    """The same real tokens left- or right-padded: padding never fills an expert's buffer, so
    the real tokens' outputs (and drops) do not depend on where the padding is."""
    cfg = preset("tiny-moe", moe_capacity_factor=2.0)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    real = np.random.default_rng(3).integers(1, cfg.vocab_size, (2, 8))
    left = np.zeros((2, 16), np.int32)
    right = np.zeros((2, 16), np.int32)
    left[:, 8:], right[:, :8] = real, real
    lm, rm = left > 0, right > 0
    hl, _, sl = model(jnp.asarray(left), jnp.asarray(lm), return_routing=True)
    hr, _, sr = model(jnp.asarray(right), jnp.asarray(rm), return_routing=True)
    assert float(jnp.abs(hl[:, 8:] - hr[:, :8]).max()) < 1e-5
    assert float(jnp.sum(sl.dropped)) == float(jnp.sum(sr.dropped))
