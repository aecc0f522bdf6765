"""Off-policy training with stale rollouts (rollout.staleness=k): each step samples with the
policy of k updates before, the ratio's old policy is the current one (recomputed), the
sampler's log-probs are the behaviour policy's for the importance correction, the mismatch is
logged, and the past policies are checkpointed (bitwise resume)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.training import Checkpointer
from test_rl_recipes_extra import make

KW = dict(g=4, prompts_per_step=2, old_logp="recompute", is_weights={"name": "icepop"})


def _logp(tr, params, b):
    p = b["tokens"].shape[1] - b["completion_mask"].shape[1]
    lp = np.asarray(tr.logp(params, tr.frozen, b["tokens"], b["mask"]))
    return lp, b["loss_mask"].astype(bool), p


def test_each_step_samples_with_the_policy_of_k_updates_before():
    tr = make("grpo", staleness=1, **KW)
    snaps = [jax.tree.map(jnp.copy, tr.state.params)]
    batches, metrics = [], []
    for _ in range(3):
        metrics.append(tr.step())
        batches.append({k: np.array(v) for k, v in tr.last_batch.items()})
        snaps.append(jax.tree.map(jnp.copy, tr.state.params))
    # step 0 and 1 sample with the initial policy, step 2 with the policy after step 0's update
    for s, behaviour in ((0, 0), (1, 0), (2, 1)):
        b = batches[s]
        lp, m, _ = _logp(tr, snaps[behaviour], b)
        np.testing.assert_allclose(b["rollout_logp"][m], lp[m], atol=2e-4)
        cur, _, _ = _logp(tr, snaps[s], b)  # the ratio's old policy: the one being updated
        np.testing.assert_allclose(b["old_logp"][m], cur[m], atol=2e-4)
    # the mismatch is logged: none at step 0, some once the sampler lags
    assert metrics[0]["offpolicy/approx_kl_k3"] < 1e-6
    assert metrics[1]["offpolicy/approx_kl_k3"] > 1e-5 and metrics[2]["offpolicy/staleness"] == 1.0
    assert "correction/is_weights_mean" in metrics[1] or any(k.startswith("correction/") for k in metrics[1])


def test_staleness_needs_recomputed_old_logprobs():
    with pytest.raises(ValueError, match="recipe.old_logp=recompute"):
        make("grpo", g=4, prompts_per_step=2, staleness=1)


def test_resume_with_stale_policies_is_bitwise(tmp_path):
    tr = make("grpo", staleness=2, **KW)
    for _ in range(3):
        tr.step()
    tr.checkpointer = Checkpointer(tmp_path, keep_last=1)
    tr.save()
    tr.checkpointer.wait()
    fresh = make("grpo", staleness=2, **KW)
    fresh.checkpointer = Checkpointer(tmp_path, keep_last=1)
    assert fresh.restore()
    for a, b in zip(jax.tree.leaves(tr.parts.get("rollout.staleness").stale),
                    jax.tree.leaves(fresh.parts.get("rollout.staleness").stale)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for _ in range(2):
        m1, m2 = tr.step(), fresh.step()
        assert m1["loss"] == m2["loss"] and m1["offpolicy/approx_kl"] == m2["offpolicy/approx_kl"]
