"""A mixture of experts in the RL loop: routes from the sampler to the train batch, routing
replay in the update, the router metrics, the load-balancing term, and the config checks."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.config import ConfigError, apply_overrides
from jaxrl_llm.models import Transformer, preset
from jaxrl_llm.training.objectives import policy_logprobs
from jaxrl_llm.training.rl import align_routes, build_rl_batch
from jaxrl_llm.training.runner import ModelSpec, TrainSpec, check_rl, run_rl
from test_shared_prefix_update import _tiny


def _moe(out, **train):
    cfg = _tiny(out, train=TrainSpec(**train))
    return dataclasses.replace(cfg, model=ModelSpec(source="tiny-moe", hidden_size=32, num_layers=2))


def test_align_routes_right_aligns_the_prompts():
    # 2 rows, sampler bucket of 3 prompt columns + 2 completion tokens, 1 layer, k = 1
    r = np.arange(2 * 5).reshape(2, 5, 1, 1)
    wide = align_routes(r, 2, 4)  # a wider train prompt: one more padding column on the left
    assert wide.shape == (2, 6, 1, 1)
    assert np.array_equal(wide[:, 1:], r) and np.all(wide[:, 0] == 0)
    narrow = align_routes(r, 2, 2)  # a narrower one: the sampler's leftmost (padding) column goes
    assert np.array_equal(narrow, r[:, 1:])


def test_sampler_routes_reach_the_train_batch():
    from jaxrl_llm.rollout import Sampler, SamplingConfig

    cfg = preset("tiny-moe", num_layers=2)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    gd, params = nnx.split(model)
    prompts = [[5, 17, 3], [7, 2, 9, 11, 4]]
    out = Sampler(gd, SamplingConfig(max_new_tokens=4, num_samples=2, pad_token_id=0), length_buckets=(8,))(
        params, prompts, jax.random.key(0))
    assert out.routes.shape == (4, 8 + 4, 2, 2)
    batch = build_rl_batch(prompts, out, 6, 0)
    assert batch["routes"].shape == (4, 6 + 4, 2, 2)
    # the sampler's routes are the experts a full forward of the same tokens picks (real tokens)
    _, _, stats = model(jnp.asarray(batch["tokens"]), jnp.asarray(batch["mask"]), return_routing=True)
    own = np.moveaxis(np.asarray(stats.choice), 0, 2)
    real = batch["mask"]
    agree = np.all(np.sort(own, -1) == np.sort(batch["routes"], -1), -1)[real]
    assert agree.mean() > 0.95, agree.mean()  # decode vs full forward: near-ties may flip
    # replaying them: the log-probs the update computes use exactly these experts
    b = {k: jnp.asarray(v) for k, v in batch.items()}
    lp_replay, _ = policy_logprobs(model, b, routing_replay=True)
    h, _ = model(b["tokens"], b["mask"], routes=b["routes"])
    from jaxrl_llm.models import token_logprobs

    ref, _ = token_logprobs(h[:, :-1], model.unembedding(), b["tokens"][:, 1:], with_entropy=False)
    np.testing.assert_array_equal(np.asarray(lp_replay), np.asarray(ref))
    flipped = dict(b, routes=(b["routes"] + 1) % cfg.num_experts)
    assert float(jnp.abs(policy_logprobs(model, flipped, routing_replay=True)[0] - lp_replay).max()) > 1e-4


@pytest.mark.parametrize("replay", [True, False])
def test_moe_run_logs_router_metrics(tmp_path, replay):
    out = tmp_path / str(replay)
    run_rl(_moe(out, routing_replay=replay, router_aux_coef=0.01))
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    for m in lines:
        assert 0.0 <= m["moe/router_mismatch"] <= 1.0
        assert m["moe/load_balancing_loss"] >= 1.0 - 1e-5  # E * sum f P >= 1 (k assignments per token / k)
        assert np.isfinite(m["loss"])


def test_moe_config_checks(tmp_path):
    dense = _tiny(tmp_path)
    with pytest.raises(ConfigError, match="mixture of experts"):
        check_rl(apply_overrides(dense, ["train.routing_replay=true"]))
    with pytest.raises(ConfigError, match="mesh.expert=2 splits the experts"):
        check_rl(apply_overrides(dense, ["mesh.expert=2"]), n_devices=2)
    moe = _moe(tmp_path)
    with pytest.raises(ConfigError, match="rollout.shared_prompt_kv"):
        check_rl(apply_overrides(moe, ["train.routing_replay=true", "rollout.shared_prompt_kv=true"]))
    with pytest.raises(ConfigError, match="mesh.expert=3 must divide"):
        check_rl(apply_overrides(moe, ["mesh.expert=3"]), n_devices=3)
    with pytest.raises(ConfigError, match="router_aux_coef must be >= 0"):
        check_rl(apply_overrides(moe, ["train.router_aux_coef=-1"]))
    info = check_rl(apply_overrides(moe, ["train.routing_replay=true"]))
    assert "off" in info["shared_prefix"]  # each row's own forward: its own routes
