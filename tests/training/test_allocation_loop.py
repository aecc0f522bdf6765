"""Knapsack RL's budget allocation in the RL loop: groups of different sizes from one rollout of
fixed shape, the estimate from the store's history, the advantages per group, determinism and
bitwise resume (the store's outcome window in the checkpoint)."""

import numpy as np
import pytest

import jaxrl_llm.core as core
from jaxrl_llm.algorithms import ALLOCATORS, AllocateInputs, RegistryError
from jaxrl_llm.algorithms.allocation import knapsack_estimates
from jaxrl_llm.training.prompt_store import STORE_INPUTS, PromptStore
from test_rl_recipes_extra import PROMPTS, TARGET, make, straight_and_resumed


def any_target(prompts, completions, completion_ids, const, **_):
    """1 when the completion holds the TARGET token at all (p about 0.3 for the random toy model);
    always 1 for a 'const' prompt (p = 1: the knapsack gives it its minimum)."""
    return [1.0 if c else float(TARGET in ids) for ids, c in zip(completion_ids, const)]


# 4 prompts, 2 per step (each seen every other step): one always solved, one not, in every step
ROWS = [(p, c) for p, c in zip(PROMPTS[:4], [False, True, False, True])]


def _knapsack(**kw):
    return make("grpo", g=4, prompts_per_step=2, rows=ROWS, reward=any_target,
                allocator={"name": "knapsack", "min_history": 4, "window": 8, "max_n": 6, **kw})


def test_estimates_read_the_last_visit_or_the_recent_window():
    st = PromptStore(1.0, recent_window=8)
    st.observe(0, ["a", "b"], [1, 0, 0, 0, 1, 1, 1, 0], [3] * 8, [0, 0, 0, 0, 1, 1, 1, 1])
    st.observe(1, ["a"], [1, 1, 1, 1, 1, 1, 1, 1, 0, 0], [3] * 10, [0] * 10)
    x = AllocateInputs(("a", "b", "c"), st.records, st.lookup(["a", "b", "c"]), 4, 12, 2)
    # a: its last visit had 10 >= 8 samples: p = 8/10; b: 4 samples, fewer than the window: its
    # last 4 outcomes (all it has): 3/4; c: never seen
    valid, p = knapsack_estimates(x, min_history=4, window=8)
    np.testing.assert_array_equal(valid, [True, True, False])
    np.testing.assert_allclose(p, [0.8, 0.75, 0.0])
    assert st.records["a"]["recent"] == "11111100"  # the last 8 outcomes, oldest first
    # history needed before an estimate: 12 samples
    valid, p = knapsack_estimates(x, min_history=12, window=8)
    np.testing.assert_array_equal(valid, [True, False, False])


def test_knapsack_divides_the_rollout_unevenly_and_trains_on_groups_of_any_size():
    tr = _knapsack()
    sizes_seen = set()
    for it in range(6):
        m = tr.step()
        b = tr.last_batch
        gid, valid = b["group_ids"], b["valid"]
        assert len(gid) == 2 * 4  # the same rows every step
        sizes = np.bincount(gid)
        sizes_seen.add(tuple(sorted(sizes.tolist())))
        # GRPO's advantages sum to zero within each group of any size (mean-centred)
        cm = b["completion_mask"]
        p = b["tokens"].shape[1] - cm.shape[1]
        seq_adv = np.array([b["advantages"][i, p - 1:][cm[i]][0] if cm[i].any() else 0.0 for i in range(len(gid))])
        for g in range(len(sizes)):
            assert abs(seq_adv[gid == g].sum()) < 1e-4
        if it >= 2:  # every prompt has 4 samples of history: the knapsack decides
            assert "allocation/knapsack_prompts" in m and m["allocation/max"] + m["allocation/min"] >= 2
    # the store counted each prompt's samples, however many it got
    assert sum(r["samples"] for r in tr.store.records.values()) == 6 * 8
    assert (3, 5) in sizes_seen, sizes_seen  # p = 1: 2 + the surplus 1; p in (0, 1): 2 + 3 from the knapsack


def test_knapsack_counts_follow_the_core_allocation_from_the_store():
    tr = _knapsack()
    tr.run(3)
    keys = [f"toy:{(tr.data.pos + i) % 4}" for i in range(2)]
    valid, p = knapsack_estimates(AllocateInputs(tuple(keys), tr.store.records, tr.store.lookup(keys), 4, 8, 3),
                                  min_history=4, window=8)
    want, _ = core.knapsack_allocate(valid, p, 4, max_n=6)
    m = tr.step()
    got = np.bincount(tr.last_batch["group_ids"], minlength=2)
    kept = want[want > 0]
    np.testing.assert_array_equal(got, kept)
    assert m["allocation/max"] == want.max() and len(set(want.tolist())) > 1


def test_resume_with_an_allocator_is_bitwise(tmp_path):
    a, b = straight_and_resumed(_knapsack, 5, 3, tmp_path)
    assert a == b and any(r.get("recent") for r in a[2]["records"].values())


def test_allocator_configuration_errors():
    with pytest.raises(RegistryError, match="recipe.allocator"):
        make("grpo", g=4, allocator={"name": "nope"})
    with pytest.raises(RegistryError, match="num_minibatches=1"):
        make("disco", g=4, allocator="knapsack", num_minibatches=2)
    with pytest.raises(ValueError, match="summing to the budget 8"):
        from jaxrl_llm.algorithms.allocation import check_allocation
        check_allocation("x", np.array([4, 3]), 2, 8)
    assert "knapsack" in ALLOCATORS.names() and STORE_INPUTS


def test_head_grad_norm_equals_autodiff():
    """GVM's G: the closed form ``|| sum_t h_t (onehot(y_t) - pi_t)^T ||`` equals jax.grad of the
    response log-likelihood with respect to the output projection."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxrl_llm.training.providers import policy_head_grad_norm

    tr = make("grpo", g=4)
    tr.step()
    b = tr.last_batch
    got = np.asarray(policy_head_grad_norm(tr.graphdef, tr.state.params, tr.frozen, b["tokens"], b["mask"],
                                           b["loss_mask"]))
    model = nnx.merge(tr.graphdef, tr.state.params, *tr.frozen)
    h, _ = model(jnp.asarray(b["tokens"]), jnp.asarray(b["mask"]))
    w0 = model.unembedding().astype(jnp.float32)

    def loglik(w, row):
        lp = jax.nn.log_softmax(h[row, :-1].astype(jnp.float32) @ w, axis=-1)
        y = jnp.asarray(b["tokens"][row, 1:])
        return jnp.sum(jnp.take_along_axis(lp, y[:, None], 1)[:, 0] * jnp.asarray(b["loss_mask"][row]))

    want = [float(jnp.linalg.norm(jax.grad(loglik)(w0, r))) for r in range(len(got))]
    np.testing.assert_allclose(got, want, rtol=2e-4)
    assert (got > 0).all()


def test_gvm_allocates_by_the_last_visits_statistics():
    tr = make("grpo", g=4, prompts_per_step=2, rows=ROWS, reward=any_target, allocator="gvm")
    tr.run(2)  # every prompt visited once: its statistics are in the slot
    slot = tr.store.slots["allocator/gvm"]
    assert set(slot) == {f"toy:{i}" for i in range(4)}
    keys = [f"toy:{(tr.data.pos + i) % 4}" for i in range(2)]
    g = np.array([slot[k]["grad_norm"] for k in keys])
    p = np.array([slot[k]["accept"] for k in keys])
    assert p[1] == 1.0 and 0 <= p[0] < 1  # toy:1 / toy:3 always pass
    if p[0] > 0:
        want = 1 + core.round_preserving_sum(core.gvm_sample_ratios(g, p), 8 - 2)
    else:  # the failing prompt gets its minimum, the other the rest
        want = np.array([1, 7])
    m = tr.step()
    np.testing.assert_array_equal(np.bincount(tr.last_batch["group_ids"]), want)
    assert m["allocation/estimated_frac"] == 1.0 and m["allocation/max"] == want.max()
