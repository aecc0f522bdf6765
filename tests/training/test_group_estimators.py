"""The papers' group estimators in the loop: answer clusterers and the ``answer_ids`` input, each
estimator's registry entry against its core function, and a 2-step run of each through
:class:`RLTrainer` on the toy task (tests/training/test_rl_recipes_extra.py)."""

import numpy as np
import pytest

import jaxrl_llm.core as core
from jaxrl_llm.algorithms import CLUSTERERS, ESTIMATORS, EstimatorInputs, RegistryError, answer_key, cluster_ids
from jaxrl_llm.training import recipe
from test_rl_recipes_extra import make, target_frac

NEW = ["agrae", "canon", "canon_entropy", "stratified", "seed_grpo", "hapo", "riskpo", "adora", "loop", "hicra", "copo",
       "arm"]


def test_answer_keys_and_cluster_ids():
    assert answer_key("3") == answer_key("3.0") == answer_key("+3") == answer_key(" $3$ ")
    assert answer_key("1,234") == answer_key("1234") and answer_key("x + 1") == answer_key("X+1")
    assert answer_key(None) is None and answer_key("3") != answer_key("4")
    keys = CLUSTERERS["answer"].fn(["so \\boxed{4}", "4.0", "the answer is 5", "no idea", "#### 4", "nothing"])
    assert keys[0] == keys[1] == keys[4] and keys[2] != keys[0] and keys[3] is None and keys[5] is None
    ids = cluster_ids(keys, [0, 0, 0, 0, 1, 1])
    # same key in another group is another cluster; None is a cluster of its own
    assert list(ids) == [0, 0, 1, 2, 3, 4]
    assert CLUSTERERS["text"].fn(["a  b", "a b", "ab"]) == ["a b", "a b", "ab"]


def test_estimator_entries_call_their_core_functions():
    rng = np.random.default_rng(0)
    n, t, g = 8, 5, 2
    gid = np.repeat(np.arange(g), 4).astype(np.int32)
    mask = (np.arange(t)[None] < rng.integers(1, t + 1, n)[:, None])
    x = {"scores": rng.integers(0, 2, n).astype(np.float32), "mask": mask, "group_ids": gid,
         "old_entropy": rng.uniform(0, 2, (n, t)).astype(np.float32),
         "component_scores": rng.integers(0, 3, (n, 2)).astype(np.float32),
         "answer_ids": np.array([0, 1, 0, 1, 4, 4, 4, 5], np.int32)}

    def run(name, **kw):
        part = ESTIMATORS[name]
        return np.asarray(part.fn(EstimatorInputs(x, g, allowed=part.requires), **kw).advantages)

    L = mask.sum(1).astype(np.float32)
    np.testing.assert_array_equal(run("agrae"), core.agrae_advantages(x["scores"], mask, gid, g))
    np.testing.assert_array_equal(run("canon", mu=0.5), core.canon_advantages(x["scores"], L, mask, gid, g, mu=0.5))
    ent = (x["old_entropy"] * mask).sum(1) / mask.sum(1)
    np.testing.assert_allclose(run("canon_entropy"), core.canon_advantages(x["scores"], ent, mask, gid, g,
                                                                             variant="entropy"), atol=1e-6)
    np.testing.assert_array_equal(run("stratified", alpha=0.5, stratum_index=1), core.stratified_advantages(
        x["scores"], x["component_scores"][:, 1].astype(np.int32), mask, gid, g, alpha=0.5, num_strata=16))
    np.testing.assert_array_equal(run("seed_grpo"), core.seed_grpo_advantages(x["scores"], x["answer_ids"], mask, gid, g))
    np.testing.assert_array_equal(run("hapo"), core.hapo_token_group_advantages(x["scores"], mask, gid, g))
    np.testing.assert_array_equal(run("riskpo", bundle_size=2), core.riskpo_advantages(x["scores"], mask, gid, g,
                                                                                        bundle_size=2))
    np.testing.assert_array_equal(run("adora"), core.adora_advantages(x["scores"], mask, gid, g))
    want = core.drop_small_advantages(core.rloo_advantages(x["scores"], mask, gid, g, singleton="zero"), mask, 0.01)
    np.testing.assert_array_equal(run("loop"), want)
    with pytest.raises(ValueError, match="stratum_index=2 but the run has 2 reward functions"):
        run("stratified", alpha=0.5, stratum_index=2)


def test_config_errors_name_the_key():
    with pytest.raises(RegistryError, match="recipe.advantage=stratified: argument 'alpha' has no default"):
        recipe("grpo", num_samples=4, advantage="stratified")
    with pytest.raises(RegistryError, match="recipe.clusterer: unknown answer clusterer 'words'"):
        recipe("grpo", num_samples=4, advantage="seed_grpo", clusterer="words")
    with pytest.raises(RegistryError, match="recipe.advantage=canon .*normalizer"):
        recipe("grpo", num_samples=4, advantage={"name": "canon", "normalizer": 0.0})
    assert "answer_ids" in recipe("grpo", num_samples=4, advantage="seed_grpo").requires
    assert "old_entropy" in recipe("grpo", num_samples=4, advantage="canon_entropy").requires


ARGS = {"stratified": {"alpha": 0.5}, "riskpo": {"bundle_size": 2}, "arm": {"alpha": 0.1}}


# in the default suite: one estimator per provider it exercises (answer clusters, the sampling
# policy's entropy, the prompt's confidence) and a plain one; all of them with -m slow
LOOP_DEFAULT = ("seed_grpo", "canon_entropy", "arm", "riskpo")


@pytest.mark.parametrize("name", [n if n in LOOP_DEFAULT else pytest.param(n, marks=pytest.mark.slow) for n in NEW])
def test_two_steps_through_the_trainer(name):
    """Each estimator runs in the loop: finite metrics, the providers it needs ran, and the
    advantages in the batch are the estimator's."""
    tr = make("grpo", g=4, advantage={"name": name, **ARGS.get(name, {})}, reward=[target_frac])
    h = [tr.step() for _ in range(2)]
    for m in h:
        assert all(np.isfinite(v) for v in m.values() if isinstance(v, float)), name
    b = tr.last_batch
    if "answer_ids" in tr.recipe.requires:
        assert "answer_ids" in b and h[-1]["answers/clusters_per_group"] >= 1
    if "old_entropy" in tr.recipe.requires:
        assert h[-1]["old_entropy/mean"] > 0
    assert np.all(np.isfinite(b["advantages"])) and not np.any(b["advantages"][~b["loss_mask"]])


def test_egae_bootstraps_the_rows_cut_by_the_budget():
    """T-PPO's estimator with a critic: the loop marks the rows the sampler cut at max_new_tokens,
    and the advantages are EGAE's on the batch's own values."""
    import jax.numpy as jnp

    from test_rl_recipes_extra import PPO_KW

    kw = dict(PPO_KW)
    kw.update(advantage={"name": "egae", "lam": 0.95, "whiten": False}, stop=True)
    tr = make("ppo", **kw)
    m = [tr.step() for _ in range(2)][-1]
    b = tr.last_batch
    np.testing.assert_array_equal(b["truncated"], (~b["stopped"]).astype(np.float32))
    assert 0 < b["truncated"].sum() < len(b["truncated"])  # both kinds of rows in the batch
    assert np.isfinite(m["critic/vf_loss"])
    # the advantages: EGAE on the token rewards (score on the last token minus the KL in the reward), the
    # score of a truncated row left out, the critic's values at rollout time
    p = b["tokens"].shape[1] - b["completion_mask"].shape[1]
    cm = b["completion_mask"]
    tr_rows = b["truncated"] > 0
    last = cm.shape[1] - 1 - np.argmax(cm[:, ::-1], axis=1)
    rewards = np.zeros(cm.shape, np.float32)
    rewards[np.arange(len(last)), last] = np.where(tr_rows, 0.0, b["scores"])
    kl = 0.05 * (b["old_logp"] - b["ref_logp"])[:, p - 1:]  # k1 in the reward, PPO_KW's coefficient
    want, _ = core.egae_advantages(np.where(cm, rewards - kl, 0.0), b["old_values"][:, p - 1:], cm, tr_rows,
                                   gamma=1.0, lam=0.95, whiten=False)
    np.testing.assert_allclose(b["advantages"][:, p - 1:], np.asarray(want), atol=1e-5)


def first_is_target(prompts, completions, completion_ids, **_):
    """A reward fixed by the first completion token: every continuation of a prefix that holds it
    scores the same, so the Monte-Carlo value at any later cut is the row's own reward."""
    from test_rl_recipes_extra import TARGET

    return [float(len(ids) > 0 and ids[0] == TARGET) for ids in completion_ids]


@pytest.mark.parametrize("name", ["spo_chain", "pav"])
def test_monte_carlo_values_at_cut_points(name):
    tr = make("grpo", g=4, advantage={"name": name, "interval": 1, "rollouts": 3}, reward=[first_is_target])
    m = [tr.step() for _ in range(2)][-1]
    b = tr.last_batch
    p = b["tokens"].shape[1] - b["completion_mask"].shape[1]
    cuts, vals = b["mc_cuts"][:, p - 1:] > 0, b["mc_values"][:, p - 1:]
    assert cuts.any() and m["mc/rollouts"] == cuts.sum() * 3
    later = cuts.copy()
    later[:, 0] = False  # a cut after the first token: every continuation has the row's first token
    rows = np.nonzero(later)[0]
    np.testing.assert_allclose(vals[later], b["scores"][rows], atol=1e-6)
    assert np.all(vals[~cuts] == 0)
    # the estimator's loss mask: only low-probability tokens train (here all are: a near-uniform policy)
    assert 0 < m["advantages/loss_token_frac"] <= 1


def test_monte_carlo_scores_are_split_by_cut_point_across_processes(monkeypatch):
    """With several processes each scores a contiguous share of the cut points' continuation
    blocks (never splitting a block) and every process ends with every total, in order."""
    import jax

    from jaxrl_llm.parallel import multihost
    from jaxrl_llm.training import providers

    n, blocks = 3, 7
    texts = [f"t{i}" for i in range(n * blocks)]
    seen = []

    class Tr:
        @staticmethod
        def rewards(prompts, completions, completion_ids, completion_lengths, group_ids, **cols):
            seen.append((list(completions), list(group_ids), list(cols["answer"])))
            return type("O", (), {"total": [float(c[1:]) for c in completions]})()
    args = (Tr, n, [f"p{i // n}" for i in range(len(texts))], texts, [[i] for i in range(len(texts))],
            {"answer": list(range(len(texts)))})
    one = providers._score_split(*args)
    np.testing.assert_array_equal(one, np.arange(len(texts), dtype=np.float32))
    shares = {}
    monkeypatch.setattr(jax, "process_count", lambda: 3)
    monkeypatch.setattr(multihost, "allgather_objects", lambda obj: [shares.get(i, obj) for i in range(3)])
    for i in (1, 2, 0):  # process 0 last: by then the fake exchange holds the others' shares
        monkeypatch.setattr(jax, "process_index", lambda i=i: i)
        seen.clear()
        out = providers._score_split(*args)
        (got,) = seen
        shares[i] = np.asarray([float(c[1:]) for c in got[0]], np.float32)
        assert len(got[0]) % n == 0 and got[2] == [int(c[1:]) for c in got[0]]  # whole blocks, their columns
        assert got[1] == [int(c[1:]) // n for c in got[0]]  # a block's rows share a group id
    np.testing.assert_array_equal(out, one)
    assert sorted(len(v) // n for v in shares.values()) == [2, 2, 3]


def test_monte_carlo_estimators_refuse_reward_shaping():
    from jaxrl_llm.algorithms import RegistryError
    from jaxrl_llm.training.configs import RecipeSpec
    from jaxrl_llm.training.recipes import build_recipe
    from jaxrl_llm.config import Choice

    with pytest.raises(RegistryError, match="recipe.shaping=overlong would put the two on different scales"):
        build_recipe(RecipeSpec(advantage=Choice("spo_chain"), shaping=Choice("overlong", {"buffer": 4})),
                     num_samples=4)


def test_d3s_down_samples_on_its_schedule_and_ends_as_grpo():
    """Iteration 0: the loss mask is D^3S's (2 rows per group, a quarter of their tokens by |A| H);
    from iteration total_steps on it is the whole response (GRPO)."""
    tr = make("grpo", g=4, advantage={"name": "d3s", "total_steps": 2, "samples_init": 2, "tokens_init": 0.25})
    fracs = []
    for it in range(3):
        m = tr.step()
        b = tr.last_batch
        p = b["tokens"].shape[1] - b["completion_mask"].shape[1]
        cm = b["completion_mask"]
        adv = core.grpo_advantages(b["scores"], cm, b["group_ids"], 4)
        np.testing.assert_allclose(b["advantages"][:, p - 1:], np.asarray(adv), atol=1e-6)
        size, frac = {0: (2, 0.25), 1: (3, 0.625), 2: (4, 1.0)}[it]
        want = core.d3s_mask(adv, b["old_entropy"][:, p - 1:], cm, b["group_ids"], 4, samples_per_group=size,
                             token_fraction=frac)
        np.testing.assert_array_equal(b["loss_mask"][:, p - 1:], np.asarray(want) > 0)
        fracs.append(m["advantages/loss_token_frac"])
    assert fracs[0] < fracs[1] < fracs[2] == 1.0


def test_prompt_confidence_is_the_prompts_least_likely_tokens():
    """ProGRPO's prompt input: the mean log-prob of the least likely fifth of each prompt's tokens
    under the policy before the update, from a teacher-forced pass over the prompt."""
    import jax.numpy as jnp

    import jax

    tr = make("grpo", g=4, advantage={"name": "arm", "alpha": 0.1})
    before = jax.tree.map(np.array, tr.state.params)  # the step updates (and donates) the state
    tr.step()
    b = tr.last_batch
    p = b["tokens"].shape[1] - b["completion_mask"].shape[1]
    lp = np.asarray(tr.logp(jax.tree.map(jnp.asarray, before), tr.frozen, b["tokens"], b["mask"]))[:, :p - 1]
    pm = b["mask"][:, :p - 1] & b["mask"][:, 1:p]
    want = [np.sort(lp[i][pm[i]])[:int(np.ceil(0.2 * pm[i].sum()))].mean() for i in range(len(lp))]
    np.testing.assert_allclose(b["prompt_confidence"], want, rtol=1e-5, atol=1e-6)
    for g in np.unique(b["group_ids"]):  # one prompt, one confidence
        assert len(set(np.round(b["prompt_confidence"][b["group_ids"] == g], 5))) == 1
