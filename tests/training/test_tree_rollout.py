"""TreePO's tree sampler and its loop: the width rule by hand, leaves that share a node share
their tokens, the sampler's log-probs equal teacher-forced ones, the tokens decoded against the
responses' tokens, the fallback that completes a prompt's G leaves, and a training step whose
advantages are the tree advantage of the batch's paths."""

import jax
import numpy as np
import pytest

import jaxrl_llm.core as core
from jaxrl_llm.rollout import SamplingConfig, TreeSampler, tree_widths
from jaxrl_llm.training.rl import build_rl_batch
from test_rl_recipes_extra import PROMPTS, STOP, init, make


def test_width_rule_by_hand():
    # (finished so far, of them ended in this segment, paths going on, G, branch)
    assert tree_widths(0, 0, 2, 8, 2) == [2, 2]  # doubling
    assert tree_widths(1, 1, 3, 16, 2) == [2, 2, 4]  # the ended path's two slots pass on: min(15, 2 * 4) = 8
    assert tree_widths(3, 0, 2, 8, 2) == [2, 2]  # min(8 - 3, 2 * 2) = 4
    assert tree_widths(2, 2, 3, 7, 2) == [1, 1, 3]  # min(7 - 2, 2 * 5) = 5: the remainder to the last
    assert tree_widths(6, 0, 2, 8, 2) == [1, 1]  # the width is used up: one child each
    assert tree_widths(7, 0, 1, 8, 2) == [1]  # a path always goes on
    assert tree_widths(0, 0, 0, 8, 2) == []
    with pytest.raises(ValueError, match="ended <= finished"):
        tree_widths(0, 1, 2, 8, 2)


def _teacher_forced(tr, params, prompts, r, p_len=8):
    b = build_rl_batch(prompts, r, p_len, 0)
    lp = np.asarray(tr.logp(params, tr.frozen, b["tokens"], b["mask"]))
    return np.abs(lp - b["old_logp"])[b["loss_mask"]].max()


def test_tree_sampler_shares_prefixes_and_counts_the_tokens():
    gd, params = init()
    tr = make("grpo", g=8)  # its log-prob pass, for the teacher-forced check
    prompts = PROMPTS[:2]
    ts = TreeSampler(gd, SamplingConfig(max_new_tokens=12, num_samples=8), segment=3, length_buckets=(8,))
    r = ts(params, prompts, jax.random.key(0))
    assert r.tokens.shape == (16, 12) and r.lengths.tolist() == [12] * 16 and not r.stopped.any()
    assert r.prompt_index.tolist() == np.repeat(np.arange(2), 8).tolist()
    # widths 2, 4, 8, 8 per prompt: segments of 3 tokens decoded (2 + 4 + 8 + 8) * 3 times per prompt
    assert ts.last_stats["tree/decoded_tokens"] == 2 * 22 * 3 and ts.last_stats["tree/leaf_tokens"] == 16 * 12
    assert ts.last_stats["tree/saved_frac"] == pytest.approx(1 - 66 / 96)
    assert ts.last_stats["tree/fallback_leaves"] == 0
    for p in range(2):
        rows = np.arange(8 * p, 8 * p + 8)
        paths, toks = r.paths[rows], r.tokens[rows]
        assert len(np.unique(paths[:, 0])) == 2 and len(np.unique(paths[:, 1])) == 4
        assert len(np.unique(paths[:, 3])) == 8  # every leaf ends in its own node
        for d in range(1, 4):
            for i in range(8):
                for j in range(8):
                    same = paths[i, d - 1] == paths[j, d - 1]
                    assert same == np.array_equal(paths[i, :d], paths[j, :d])  # a node fixes its ancestors
                    if same:
                        assert np.array_equal(toks[i, :3 * d], toks[j, :3 * d])
        # the children of a node sampled apart: leaves that split at depth d differ somewhere after it
        assert len({tuple(t) for t in toks}) == 8
    assert _teacher_forced(tr, params, prompts, r) < 2e-5


def test_fallback_completes_every_prompt_to_g_leaves():
    """One segment (the whole budget) and branch 2: each prompt's two paths end at once, and the
    other six leaves are sampled from the prompt (each its own node)."""
    gd, params = init()
    tr = make("grpo", g=8)
    ts = TreeSampler(gd, SamplingConfig(max_new_tokens=6, num_samples=8), segment=6, length_buckets=(8,))
    r = ts(params, PROMPTS[:2], jax.random.key(2))
    assert r.tokens.shape == (16, 6) and ts.last_stats["tree/fallback_leaves"] == 12
    assert ts.last_stats["tree/decoded_tokens"] == ts.last_stats["tree/leaf_tokens"] == 16 * 6
    assert len(np.unique(r.paths[:, 0])) == 16
    assert _teacher_forced(tr, params, PROMPTS[:2], r) < 2e-5
    with pytest.raises(ValueError, match="does not take counts"):
        ts(params, PROMPTS[:2], jax.random.key(2), counts=[8, 8])
    with pytest.raises(ValueError, match="segment must be"):
        TreeSampler(gd, SamplingConfig(max_new_tokens=6, num_samples=8), segment=0)


def test_treepo_step_uses_the_tree_advantage_of_the_batch():
    """With stop tokens: paths end early and their slots pass to the others; still G leaves."""
    tr = make("grpo", g=4, tree=2, advantage="treepo", agg="token-mean", stop=True)
    m = tr.step()
    b = tr.last_batch
    p = b["tokens"].shape[1] - b["completion_mask"].shape[1]
    lengths = b["completion_mask"].sum(1)
    ends = b["tokens"][np.arange(len(lengths)), p + np.maximum(lengths - 1, 0)]
    np.testing.assert_array_equal(b["stopped"], ends == STOP)
    assert np.bincount(b["group_ids"]).tolist() == [4] * (len(lengths) // 4)
    assert m["tree/saved_frac"] > 0 and m["tree/leaf_tokens"] == b["completion_mask"].sum()
    ids = b["tree_prefix_ids"]
    assert ids.shape == (len(b["scores"]), 4) and (ids[:, 0] == b["group_ids"]).all()
    want = core.treepo_advantages(b["scores"], ids, b["completion_mask"], valid=b["valid"])
    np.testing.assert_allclose(b["advantages"][:, -b["completion_mask"].shape[1]:], np.asarray(want), atol=1e-6)
    with pytest.raises(ValueError, match="rollout.tree_segment=<tokens per segment>"):
        make("grpo", g=4, advantage="treepo").step()
    with pytest.raises(ValueError, match="cannot be combined with recipe.replay"):
        make("grpo", g=4, tree=2, replay="arpo", old_logp="recompute")


def test_tree_run_resumes_bitwise(tmp_path):
    from test_rl_recipes_extra import straight_and_resumed

    def build():
        return make("grpo", g=4, tree=2, advantage="treepo", agg="token-mean", stop=True)

    a, b = straight_and_resumed(build, 3, 2, tmp_path / "ckpt")
    assert a[0] == b[0] and a[1] == b[1]
