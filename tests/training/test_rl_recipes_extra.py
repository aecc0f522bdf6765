"""DAPO dynamic sampling and overlong shaping, ReMax, PPO with a critic and REINFORCE++ through
:class:`RLTrainer` on a tiny model (the toy of test_rl_pieces.py: the reward is the fraction
of completion tokens equal to TARGET)."""

import dataclasses
import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxrl_llm.core as core
from jaxrl_llm.data.pipeline import PromptBatch
from jaxrl_llm.models import ModelConfig, Transformer
from jaxrl_llm.rewards import Rewards
from jaxrl_llm.rollout import Sampler, SamplingConfig
from jaxrl_llm.algorithms import RegistryError, overlong_lengths
from jaxrl_llm.training import (Checkpointer, Critic, RLTrainer, ValueObjective, critic_params_from_policy,
                                critic_values, init_train_state, make_train_step, recipe)

CFG = ModelConfig(vocab_size=17, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                  intermediate_size=64)
TARGET, STOP = 7, 16
P, T = 4, 6
PROMPTS = [[1, 2, 3, 4], [4, 3, 2], [5, 6], [2, 2, 2, 2], [3, 1], [6, 5, 4], [1, 1], [2, 5, 3]]


class Tok:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(int(i)) for i in ids)


class ToyData:
    """Cycles through (prompt, const) rows, ``batch_size`` at a time; exact state."""

    def __init__(self, rows, batch_size):
        self.rows, self.b, self.pos = rows, batch_size, 0

    def __next__(self):
        idx = [(self.pos + i) % len(self.rows) for i in range(self.b)]
        rows = [self.rows[i] for i in idx]
        self.pos += self.b
        ids = [list(p) for p, _ in rows]
        return PromptBatch(ids, [str(p) for p in ids], ids, {"const": [c for _, c in rows]},
                           [f"toy:{i}" for i in idx])

    def get_state(self):
        return {"pos": self.pos}

    def set_state(self, state):
        self.pos = state["pos"]


def target_frac(prompts, completions, completion_ids, **_):
    return [sum(t == TARGET for t in ids) / T for ids in completion_ids]


def varied_or_const(prompts, completions, completion_ids, const, **_):
    """0.5 for every completion of a 'const' prompt (zero spread), else a value that differs
    between samples almost surely."""
    return [0.5 if c else sum(ids) / 100 + len(ids) / 7 for ids, c in zip(completion_ids, const)]


def prompt_offset(prompts, completions, **_):
    """A per-prompt constant (0.6 to 1.2): the critic must learn prompt-dependent values."""
    return [len(p) / 10 for p in prompts]


_CACHE: dict = {}


def cached(key, build):
    """Compiled pieces and initial weights shared by the tests (same shapes -> one compile)."""
    if key not in _CACHE:
        _CACHE[key] = build()
    return _CACHE[key]


def copy(tree):
    """A host copy (the trainer donates its device buffers; a device copy would compile)."""
    return jax.tree.map(np.array, tree)


def init(head="lm"):
    """``(graphdef, fresh device params)`` of the one tiny policy (or its critic)."""
    def build():
        if head == "lm":
            gd, p = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))
        else:
            gd, p = nnx.split(Transformer(CFG, rngs=nnx.Rngs(1), head="score"))
            p = critic_params_from_policy(init()[1], p)  # the critic starts from the policy's backbone
        return gd, copy(p)
    gd, p = cached(("init", head), build)
    return gd, p


def commit(state):
    """On the device, committed, like a restored checkpoint: a restored state then hits the
    same compilations as a fresh one."""
    return jax.device_put(state, jax.devices()[0])


class MismatchedSampler:
    """A sampler whose log-probs differ from the trainer's, as an inference engine's do (vLLM,
    another precision): the real sampler's, shifted by a fixed pattern of -0.4 .. +0.4."""

    def __init__(self, sampler):
        self.inner = sampler

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __call__(self, *args, **kw):
        r = self.inner(*args, **kw)
        n, t = np.shape(r.logprobs)
        shift = (np.arange(n * t).reshape(n, t) % 9 - 4) / 10.0
        return r._replace(logprobs=np.asarray(r.logprobs) + shift.astype(np.float32))


def make(name, *, g, prompts_per_step=4, rows=None, reward=target_frac, lr=3e-2, critic_lr=1e-2, ref=False,
         stop=False, mismatch=False, aux=False, candidates=1, staleness=0, data=None, encoder=None, buckets=(P,),
         pcl=False, tree=None, weight_dtype=None, **overrides):
    """A trainer of recipe ``name`` on the toy task. Every test uses 16-row mini-batches so
    that the train steps of equal objectives compile once."""
    rec = recipe(name, num_samples=g, **overrides)  # RecipeSpec fields (choices as dicts)
    gd, params = init()
    opt = cached(("adam", lr), lambda: optax.adam(lr))
    state = commit(init_train_state(params, opt, seed=0))
    ref_params = commit(params) if ref else None
    critic = None
    if rec.needs_critic:
        cgd, cparams = init("score")
        copt = cached(("adam", critic_lr), lambda: optax.adam(critic_lr))
        critic = Critic(cgd, commit(init_train_state(cparams, copt, seed=1)),
                        cached(("step", rec.value_objective, critic_lr),
                               lambda: make_train_step(cgd, copt, rec.value_objective)))
    sampler = cached(("sampler", g, stop, buckets, weight_dtype), lambda: Sampler(
        gd, SamplingConfig(max_new_tokens=T, num_samples=g, stop_token_ids=(STOP,) if stop else (),
                           weight_dtype=weight_dtype), length_buckets=buckets))
    if tree is not None:  # TreePO's tree sampler, segments of `tree` tokens
        from jaxrl_llm.rollout import TreeSampler

        sampler = cached(("tree", g, stop, buckets, tree), lambda: TreeSampler(
            gd, SamplingConfig(max_new_tokens=T, num_samples=g, stop_token_ids=(STOP,) if stop else ()),
            segment=tree, length_buckets=buckets))
    if mismatch:
        sampler = MismatchedSampler(sampler)
    step = cached(("step", rec.objective, lr), lambda: make_train_step(gd, opt, rec.objective))
    rows = rows or [(p, False) for p in PROMPTS]
    rewards = Rewards(reward if isinstance(reward, list) else [reward])
    # an auxiliary policy (RTO's DPO model): the initial weights, moved a little
    aux_params = commit(jax.tree.map(lambda x: x + 0.05 * np.sign(x), params)) if aux else None
    data = data if data is not None else ToyData(rows, prompts_per_step * candidates)
    prompt_value = None
    if pcl:  # PCL's value model of prompts: a score head on the toy backbone
        pgd, pparams = init("score")
        popt = cached(("adam", critic_lr), lambda: optax.adam(critic_lr))
        vobj = ValueObjective(None, "token-mean")
        prompt_value = Critic(pgd, commit(init_train_state(pparams, popt, seed=2)),
                              cached(("pv-step", critic_lr), lambda: make_train_step(pgd, popt, vobj)))
    return RLTrainer(gd, state, step, sampler, data, rewards, rec, Tok(), seed=3,
                     ref_params=ref_params, critic=critic, aux_params=aux_params, candidates=candidates,
                     staleness=staleness, prompt_encoder=encoder, prompt_value=prompt_value)


def resumed_after_one_step(tmp_path, name="grpo", **kw):
    """A trainer of ``make(name, **kw)`` restored from the checkpoint of another one saved after
    its first step (the tests then check that it goes on as an uninterrupted run does)."""
    straight = make(name, **kw)
    straight.step()
    straight.checkpointer = Checkpointer(tmp_path, keep_last=1)
    straight.save()
    straight.checkpointer.wait()
    resumed = make(name, **kw)
    resumed.checkpointer = Checkpointer(tmp_path, keep_last=1)
    assert resumed.restore()
    return resumed


def without_timings(m: dict) -> dict:
    """A step's metrics without the wall-clock ones (which differ between two equal runs)."""
    return {k: v for k, v in m.items() if not k.startswith(("time/", "tokens_per_s")) and not k.endswith("/seconds")}


def max_diff(a, b):
    """Largest absolute difference between two param trees (numpy: no compilation)."""
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(jax.tree.leaves(a),
                                                                                      jax.tree.leaves(b)))


def reward_rises(rewards):
    return np.mean(rewards[-3:]) > max(0.4, 3 * rewards[0])  # rewards[0]: before any update


COEF = 0.05  # KL-in-reward coefficient of the PPO runs
PPO_KW = dict(g=4, num_minibatches=1, epochs=2, kl={"coef": COEF}, ref=True, advantage={"lam": 0.95},
              reward=[target_frac, prompt_offset])
# overlong penalty factor 0.2: stopping early (no penalty, no TARGET tokens) must not pay more than TARGETs
DAPO_KW = dict(g=8, num_minibatches=2, stop=True, shaping={"buffer": 3, "penalty_factor": 0.2})


# ---------------------------------------------------------------------------------------- recipes


def test_presets_and_validation():
    d = recipe("dapo")
    assert (d.group_filter.max_rounds, [p.name for p in d.shaping], d.objective.agg_mode, d.num_samples,
            d.num_minibatches) == (10, ["overlong"], "token-mean", 16, 16)
    # the paper's objective: clip-higher without a dual clip
    assert dict(d.objective.policy_kwargs) == {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": None}
    assert overlong_lengths(20480) == (20480, 4096)
    p = recipe("ppo")
    assert (p.needs_critic, p.estimator.name, p.num_samples, p.num_minibatches, p.value_objective.clip_range) == (
        True, "gae", 1, 4, 0.5)
    assert {"greedy_scores", "token_rewards"} <= recipe("remax").requires
    assert recipe("reinforce_pp").estimator.part.core == ("reinforce_pp_advantages",)
    for g, kw, key in [
            (1, {"advantage": {"gamma": 1.5}}, "recipe.advantage=reinforce_pp .*'gamma' must be in \\[0, 1\\]"),
            (1, {"advantage": "vtrace"}, "recipe.advantage: unknown advantage estimator 'vtrace'"),
            (2, {"kl": {"coef": 0.1}, "advantage": "grpo"}, "recipe.kl.placement=reward subtracts"),
            (1, {"advantage": "grpo"}, "rollout.num_samples must be >= 2, got 1"),
            (2, {"group_filter": {"name": "dynamic_sampling", "max_rounds": 0}}, "recipe.group_filter.max_rounds"),
            (1, {"group_filter": "dynamic_sampling"}, "recipe.num_samples must be >= 2 with dynamic sampling"),
            (1, {"critic_warmup": 2}, "recipe.critic_warmup=2 needs an estimator with a critic")]:
        with pytest.raises(RegistryError, match=key):
            recipe("reinforce_pp", num_samples=g, **kw)
    with pytest.raises(ValueError, match="RLRecipe.value_objective"):
        dataclasses.replace(recipe("ppo"), value_objective=None)
    with pytest.raises(ValueError, match="recipe.shaping.buffer \\(7\\) must be <= the overlong max length 6"):
        make("dapo", g=4, shaping={"buffer": T + 1})
    with pytest.raises(ValueError, match="pass critic="):
        gd, _ = init()
        RLTrainer(gd, None, None, Sampler(gd, SamplingConfig(max_new_tokens=T, num_samples=2)), None, None,
                  recipe("ppo", num_samples=2), Tok())
    with pytest.raises(ValueError, match="temperature 1.0 but the sampler samples at 0.7"):
        gd, _ = init()
        RLTrainer(gd, None, None, Sampler(gd, SamplingConfig(max_new_tokens=T, num_samples=2, temperature=0.7)), None,
                  None, recipe("grpo", num_samples=2), Tok())


def test_critic_create_copies_the_backbone_into_new_buffers():
    gd, params = init()
    params = commit(params)
    c = Critic.create(CFG, optax.adam(1e-3), ValueObjective(), policy_params=params, seed=1)
    pol, cri = nnx.to_pure_dict(params), nnx.to_pure_dict(c.state.params)
    assert set(cri) == set(pol) - {"lm_head"} | {"score"} and cri["score"]["kernel"].shape == (CFG.hidden_size, 1)
    for a, b in zip(jax.tree.leaves(pol["blocks"]) + [pol["embed"]], jax.tree.leaves(cri["blocks"]) + [cri["embed"]]):
        np.testing.assert_array_equal(a, b)
        assert a.unsafe_buffer_pointer() != b.unsafe_buffer_pointer()  # the critic's step donates its own buffers


def test_critic_create_on_a_mesh_is_built_in_its_shards():
    from jax.sharding import NamedSharding

    from jaxrl_llm.parallel import make_mesh

    gd, params = init()
    params = commit(params)
    eager = Critic.create(CFG, optax.adam(1e-3), ValueObjective(), policy_params=params, seed=1)
    c = Critic.create(CFG, optax.adam(1e-3), ValueObjective(), policy_params=params, seed=1, mesh=make_mesh((1, 1, 1)))
    assert all(isinstance(x.sharding, NamedSharding) for x in jax.tree.leaves(c.state))
    pol, cri, ref = (nnx.to_pure_dict(p) for p in (params, c.state.params, eager.state.params))
    for a, b in zip(jax.tree.leaves(pol["blocks"]) + [pol["embed"]], jax.tree.leaves(cri["blocks"]) + [cri["embed"]]):
        np.testing.assert_array_equal(a, b)
        assert a.unsafe_buffer_pointer() != b.unsafe_buffer_pointer()
    # the fresh score head: the jitted sharded initialiser equals the eager one up to rounding
    np.testing.assert_allclose(cri["score"]["kernel"], ref["score"]["kernel"], atol=1e-7)
    n, length = 2, 6
    batch = {"tokens": np.ones((n, length), np.int32), "mask": np.ones((n, length), bool),
             "loss_mask": np.ones((n, length - 1), bool), "old_values": np.zeros((n, length - 1), np.float32),
             "returns": np.ones((n, length - 1), np.float32)}
    state, m = c.train_step(c.state, batch)
    assert int(state.step) == 1 and np.isfinite(float(m["loss"]))


def test_value_objective_is_exact_over_row_splits():
    """The critic's (sum, weight) pair is additive over rows, so the train step's micro-batches
    (exact global normalisation) see the same loss; the loss is verl's clipped value loss."""
    obj = ValueObjective(clip_range=0.2)
    gd, params = init("score")
    r = np.random.default_rng(0)
    n, length = 8, 7
    loss_mask = np.zeros((n, length - 1), bool)
    for i in range(n):
        loss_mask[i, 2:2 + r.integers(1, 5)] = True  # ragged responses
    batch = {"tokens": r.integers(0, 17, (n, length)).astype(np.int32), "mask": np.ones((n, length), bool),
             "loss_mask": loss_mask, "old_values": r.normal(size=(n, length - 1)).astype(np.float32),
             "returns": r.normal(size=(n, length - 1)).astype(np.float32)}

    @jax.jit
    def pair(p, b):
        model = nnx.merge(gd, p)
        s, m = obj.loss_sum(model, b, jax.random.key(0))
        return s, obj.weight(b), critic_values(model, b), m["vf_loss"]

    s, w, values, vf_loss = pair(params, batch)
    halves = [pair(params, {k: v[i::2] for k, v in batch.items()}) for i in (0, 1)]
    assert float(w) == loss_mask.sum() == sum(float(h[1]) for h in halves)
    np.testing.assert_allclose(float(s), sum(float(h[0]) for h in halves), rtol=1e-6)
    old, ret = batch["old_values"], batch["returns"]
    clipped = old + np.clip(values - old, -0.2, 0.2)
    want = 0.5 * np.maximum((values - ret) ** 2, (clipped - ret) ** 2)[loss_mask].mean()
    np.testing.assert_allclose([float(s / w), float(vf_loss)], [want, want], rtol=1e-5)


# ---------------------------------------------------------------------------------- dynamic sampling


def test_dynamic_sampling_fills_the_batch_with_varied_groups_and_respects_the_cap(compiles):
    c, v = True, False
    pattern = [c, v, c, v, c, v, c, v] + [c, c, c, c, c, c, c, v] + [c] * 8
    rows = [([1 + i % 15, 1 + i // 15, 3], k) for i, k in enumerate(pattern)]  # 24 distinct prompts
    tr = make("dapo", g=4, rows=rows, reward=varied_or_const, num_minibatches=1,
              group_filter={"max_rounds": 2}, shaping="none")

    # step 1: prompts 0-7 -> 2 rounds, the 4 varied groups (1, 3, 5, 7), no filler
    m = tr.step()
    n_compiled = compiles()
    assert (m["sampling/rounds"], m["sampling/generated_groups"], m["sampling/kept_groups"],
            m["sampling/filler_groups"]) == (2, 8, 4, 0)
    b = tr.last_batch
    assert b["valid"].all() and b["loss_mask"].any(1).all()
    for j, i in enumerate((1, 3, 5, 7)):
        assert b["tokens"][j * 4, P - len(rows[i][0]):P].tolist() == rows[i][0]
    spread = [np.ptp(b["scores"][b["group_ids"] == j]) for j in range(4)]
    assert min(spread) > 0

    # step 2: prompts 8-15 -> the cap (2 rounds) with 1 varied group: 3 filler groups out of the loss
    before = copy(tr.state)
    m = tr.step()
    assert compiles() == n_compiled  # fixed shapes: a partial batch compiles nothing new
    assert (m["sampling/rounds"], m["sampling/kept_groups"], m["sampling/filler_groups"]) == (2, 1, 3)
    b = tr.last_batch
    assert b["valid"].tolist() == [True] * 4 + [False] * 12
    assert not b["loss_mask"][4:].any() and not b["advantages"][4:].any()
    assert np.ptp(b["scores"][:4]) > 0 and np.ptp(b["scores"][4:8]) == 0  # a dropped (constant) group fills
    assert m["weight"] == b["loss_mask"][:4].sum()  # token-mean weight: kept tokens only
    samples = tr.last_samples(8)  # sample logs show trained rows only
    assert [x["prompt"] for x in samples] == [str(rows[15][0])] * 4
    assert samples[0]["completion"] == Tok().decode(b["tokens"][0, P:][b["completion_mask"][0]])
    # filler rows change nothing: the same step with garbage in them gives the same update, bit for bit
    clean = {k: b[k] for k in tr.recipe.objective.batch_keys()}
    garbage = {k: v.copy() for k, v in clean.items()}
    r = np.random.default_rng(0)
    garbage["tokens"][4:] = r.integers(0, 17, garbage["tokens"][4:].shape)
    garbage["advantages"][4:] = 100.0
    garbage["old_logp"][4:] = -3.0
    s_clean, _ = tr.train_step(jax.tree.map(jnp.asarray, before), clean)
    s_garbage, _ = tr.train_step(jax.tree.map(jnp.asarray, before), garbage)
    assert max_diff(s_clean.params, s_garbage.params) == 0.0
    # and the trainer's update is that one (its rows were shuffled: float summation order only)
    # Adam: |update| ~ lr = 3e-2
    assert max_diff(s_clean.params, tr.state.params) < 1e-5 < 1e-2 < max_diff(before.params, tr.state.params)

    # step 3: only constant groups -> nothing kept, no update
    before = copy(tr.state.params)
    m = tr.step()
    assert (m["sampling/rounds"], m["sampling/kept_groups"], m["sampling/filler_groups"]) == (2, 0, 4)
    assert "loss" not in m and m["step"] == 2
    assert max_diff(before, tr.state.params) == 0.0
    assert tr.data.pos == 24  # every round consumed a data batch


def test_dapo_raises_the_reward_with_overlong_shaping():
    tr = make("dapo", **DAPO_KW)
    rewards = []
    for it in range(12):
        m = tr.step()
        rewards.append(m["rewards/total/mean"])
        b = tr.last_batch
        if it == 0:  # shaped scores = task reward + DAPO's overlong penalty (max 6, buffer 3)
            lengths = b["completion_mask"].sum(1)
            comp = b["tokens"][:, P:]
            task = np.array([np.sum((comp[i] == TARGET) & b["completion_mask"][i]) / T for i in range(len(comp))])
            pen = np.minimum(-(lengths - (T - 3)) / 3 * 0.2, 0.0)
            assert pen.min() < 0 and (pen == 0).any()
            np.testing.assert_allclose(b["scores"], task + pen, atol=1e-6)
        assert m["sampling/kept_groups"] >= 4 or m["sampling/rounds"] == 10
    assert reward_rises(rewards), rewards


# --------------------------------------------------------------------------------------------- ReMax


def test_remax_uses_the_greedy_reward_as_baseline_and_raises_the_reward():
    tr = make("remax", g=8, stop=True, num_minibatches=2)
    greedy = tr.baseline_sampler  # the trainer's default: the sampler's config, greedy, one sample
    assert greedy.config == SamplingConfig(max_new_tokens=T, num_samples=1, greedy=True, stop_token_ids=(STOP,))
    rewards, nonzero = [], 0
    for it in range(12):
        params = copy(tr.state.params)
        pos = tr.data.pos
        m = tr.step()
        rewards.append(m["rewards/total/mean"])
        if it in (0, 6):
            b = tr.last_batch
            prompts = [PROMPTS[(pos + i) % 8] for i in range(4)]
            groll = greedy(params, prompts, jax.random.key(0))
            gscore = np.array(target_frac(None, None, [t[mk].tolist() for t, mk in zip(groll.tokens, groll.mask)]),
                              np.float32)
            np.testing.assert_array_equal(b["greedy_scores"], gscore[b["group_ids"]])
            adv = b["advantages"][:, P - 1:]
            want = (b["scores"] - gscore[b["group_ids"]])[:, None] * b["completion_mask"]
            np.testing.assert_allclose(adv, want, atol=1e-6)
            nonzero += int(np.abs(want).sum() > 0)
    assert nonzero == 2
    assert reward_rises(rewards), rewards


# ------------------------------------------------------------------------------------------------ PPO


def test_ppo_gae_on_critic_values_and_rewards_rise():
    tr = make("ppo", **PPO_KW)
    rewards, vf = [], []
    for it in range(12):
        cparams = copy(tr.critic.state.params)
        m = tr.step()
        rewards.append(m["rewards/target_frac/mean"])
        vf.append(m["critic/vf_loss"])
        if it == 1:  # the policy has moved from the reference: the KL term is not zero
            b = tr.last_batch
            gd = tr.critic.graphdef

            @jax.jit
            def scores(p, tokens, mask):
                model = nnx.merge(gd, p)
                return model.scores(model(tokens, mask)[0])

            cm = b["completion_mask"]
            values = np.asarray(scores(cparams, b["tokens"], b["mask"]))[:, P - 1:-1, 0] * cm
            last = cm.sum(1) - 1
            token_rewards = np.zeros(cm.shape, np.float32)
            token_rewards[np.arange(len(cm)), last] = b["scores"]
            kl = (b["old_logp"] - b["ref_logp"])[:, P - 1:] * cm
            assert np.abs(kl).max() > 1e-3
            adv, ret = core.gae_advantages(token_rewards - COEF * kl, values, cm, gamma=1.0, lam=0.95)
            np.testing.assert_allclose(b["advantages"][:, P - 1:], adv, atol=1e-5)
            np.testing.assert_allclose(b["returns"][:, P - 1:], ret, atol=1e-5)
            np.testing.assert_allclose(b["old_values"][:, P - 1:], values, atol=1e-5)
    assert np.mean(vf[-3:]) < 0.5 * vf[0], vf  # the critic learns the prompt offsets
    assert reward_rises(rewards), rewards


def test_reinforce_pp_raises_the_reward():
    tr = make("reinforce_pp", g=8, stop=True, num_minibatches=2)
    rewards = [tr.step()["rewards/total/mean"] for _ in range(12)]
    assert reward_rises(rewards), rewards


# --------------------------------------------------------------------------------------------- resume


def _digest(tree):
    return hashlib.sha256(b"".join(np.asarray(x).tobytes() for x in jax.tree.leaves(jax.device_get(tree)))).hexdigest()


def straight_and_resumed(build, total, split, ckpt):
    """``total`` steps of a fresh ``build()`` straight, and ``split`` steps, a checkpoint, then a
    fresh trainer restored and run to ``total``: ``(params digest, rewards, store)`` of each."""
    def run(tr, steps, restore=False):
        if restore is not None:
            tr.checkpointer = Checkpointer(ckpt, keep_last=1)
            if restore:
                tr.restore()
        tr.run(steps)
        return _digest(tr.state), [h["rewards/total/mean"] for h in tr.history], tr.store.state_dict()

    a = run(build(), total, None)
    run(build(), split)
    return a, run(build(), total, True)


@pytest.mark.parametrize("name", ["dapo", "ppo"])
def test_resume_is_bitwise(name, tmp_path):
    """3 steps straight == 2 steps, save, a fresh trainer restores and does 1 more; with
    dynamic sampling several data batches go into a step (DAPO), with PPO the critic is in the
    checkpoint."""
    if name == "dapo":  # half the groups are constant: every step draws 2 data batches
        rows = [(p, k) for p, k in zip(PROMPTS, [True, False, True, False, False, True, True, False])]
        kw = dict(DAPO_KW, rows=rows, reward=varied_or_const, group_filter={"max_rounds": 3})
    else:
        kw = PPO_KW
    straight = make(name, **kw)

    def run(tr, steps, ckpt=None):
        if ckpt is not None:
            tr.checkpointer = Checkpointer(ckpt, keep_last=1)
            tr.restore()
        tr.run(steps)
        state = tr.state if tr.critic is None else (tr.state, tr.critic.state)
        return _digest(state), [h["rewards/total/mean"] for h in tr.history], tr.data.pos

    a = run(straight, 3)
    run(make(name, **kw), 2, tmp_path)
    resumed = make(name, **kw)
    b = run(resumed, 3, tmp_path)
    assert resumed.history[0]["iteration"] == 1 and len(resumed.history) == 3
    assert a == b
    if name == "dapo":
        assert a[2] > 3 * 4  # more data batches than steps


# ------------------------------------------------------------------ parts that no preset uses, end to end


def test_truncated_is_and_icepop_weights_against_a_mismatched_sampler():
    """The sampler's log-probs differ from the recomputed ones (MismatchedSampler): the weights
    pi_train / pi_sampler are live, truncated at 2 (TIS) or zeroed outside the bounds (IcePop)."""
    tis = make("grpo", g=4, num_minibatches=1, mismatch=True, old_logp="recompute", is_weights="tis")
    m = tis.step()
    b = tis.last_batch
    w, lm = b["is_weights"], b["loss_mask"]
    ratio = np.exp(b["old_logp"] - b["rollout_logp"])
    np.testing.assert_allclose(w[lm], np.minimum(ratio[lm], 2.0), rtol=1e-5)
    assert (w[lm] < 0.999).any() and (w[lm] > 1.001).any() and np.all(w[~lm] == 0)
    assert 0 < m["correction/is_weight_mean"] and np.isfinite(m["loss"])
    ice = make("grpo", g=4, num_minibatches=1, mismatch=True, old_logp="recompute",
               is_weights={"name": "icepop", "lower": 0.8, "upper": 1.25})
    m = ice.step()
    b = ice.last_batch
    ratio = np.exp(b["old_logp"] - b["rollout_logp"])[b["loss_mask"]]
    w = b["is_weights"][b["loss_mask"]]
    out = (ratio < 0.8) | (ratio > 1.25)
    assert out.any() and (~out).any() and np.all(w[out] == 0)
    np.testing.assert_allclose(w[~out], ratio[~out], rtol=1e-5)
    assert m["correction/is_out_of_bounds_frac"] == pytest.approx(out.mean(), abs=1e-6)


def test_rejection_mask_removes_tokens_from_the_loss_and_its_weight():
    tr = make("grpo", g=4, num_minibatches=1, mismatch=True, old_logp="recompute",
              rejection={"name": "mask", "mode": "token_k1", "upper": 1.25, "lower": 0.8})
    m = tr.step()
    b = tr.last_batch
    cm = np.zeros_like(b["loss_mask"])
    cm[:, P - 1:] = b["mask"][:, P:]  # the sampled completion tokens
    ratio = np.exp(b["old_logp"] - b["rollout_logp"])
    keep = cm & (ratio >= 0.8) & (ratio <= 1.25)
    assert (cm & ~keep).any()
    np.testing.assert_array_equal(b["loss_mask"], keep)
    # rejected tokens leave the advantages too (verl masks the response before computing them)
    np.testing.assert_array_equal(b["completion_mask"], keep[:, P - 1:])
    assert not b["advantages"][~keep].any()
    assert m["policy/clip_frac"] >= 0 and m["correction/rejected_token_frac"] > 0
    assert m["weight"] == pytest.approx(float(tr.recipe.objective.weight({"loss_mask": keep})), rel=1e-6)


def test_adaptive_kl_controller_moves_the_coefficient_and_is_checkpointed(tmp_path):
    """A KL in the loss with Ziegler's controller: the coefficient enters the step as data (no
    recompile), moves by the rule after every iteration, and resumes from the checkpoint."""
    kw = dict(g=4, num_minibatches=1, ref=True, kl={"coef": 0.05, "controller": {"name": "adaptive", "target": 1e-4,
                                                                                 "horizon": 10.0}})
    tr = make("grpo", **kw)
    coefs = []
    for _ in range(3):
        before = float(tr.parts.get("recipe.kl.controller").state.coef)
        m = tr.step()
        coefs.append(m["kl/coef"])
        err = np.clip(m["policy/kl_ref"] / 1e-4 - 1, -0.2, 0.2)
        assert m["kl/coef"] == pytest.approx(before * (1 + err * 16 / 10.0), rel=1e-5)
        assert tr.last_batch["kl_coef"][0] == np.float32(before)  # this step trained with the previous value
    assert coefs[-1] > 0.05  # the policy moved beyond the tiny target: the coefficient grows
    tr.checkpointer = Checkpointer(tmp_path, keep_last=1)
    tr.save()
    tr.checkpointer.wait()
    fresh = make("grpo", **kw)
    fresh.checkpointer = Checkpointer(tmp_path, keep_last=1)
    assert fresh.restore() and float(fresh.parts.get("recipe.kl.controller").state.coef) == pytest.approx(coefs[-1])
    # the same controller on a KL in the reward (REINFORCE++): the coefficient is an argument of the estimate
    rp = make("reinforce_pp", g=1, ref=True, prompts_per_step=8, kl={"coef": 0.05, "controller": "adaptive"})
    m1, m2 = rp.step(), rp.step()
    assert m1["kl/coef"] != 0.05 and m2["kl/coef"] != m1["kl/coef"] and "kl_in_reward/mean" in m2


def test_pf_ppo_resamples_the_batch_by_reward():
    tr = make("grpo", g=4, num_minibatches=1, batch_filter={"name": "pf_ppo", "method": "max_min"})
    m = tr.step()
    b = tr.last_batch
    s = b["scores"]
    assert m["batch_filter/unique_rows"] < 16
    # max_min keeps only rows with the batch's extreme rewards (weight 1e-8 elsewhere)
    assert {round(float(x), 6) for x in s} <= {round(float(s.max()), 6), round(float(s.min()), 6)}


def test_kimi_length_shaping_on_a_named_reward_function():
    """A shaping part that reads one reward function's scores starts (its arguments are probed
    with the run's reward names) and adds its bonus."""
    tr = make("grpo", g=4, num_minibatches=1, shaping={"name": "kimi_length", "metric": "target_frac",
                                                        "threshold": 0.1, "weight": 0.5})
    m = tr.step()
    assert "rewards/shaped/mean" in m and np.isfinite(m["loss"])
    with pytest.raises(ValueError, match="reward function 'nope' not found; the rewards are \\['target_frac'\\]"):
        make("grpo", g=4, num_minibatches=1, shaping={"name": "kimi_length", "metric": "nope"})


def test_optimal_token_baseline_reads_the_policys_sum_pi_squared():
    """The ``sum_pi_squared`` provider (OTB's input) in the loop: sum_v pi(v)^2 of the sampling
    policy at every response position, equal to the softmax of the model's logits (regression:
    the provider's einsum once read the [D, V] head as [V, D])."""
    tr = make("grpo", g=4, advantage="optimal_token_baseline")
    params = copy(tr.state.params)
    tr.step()
    b = tr.last_batch
    model = nnx.merge(tr.graphdef, params, *tr.frozen)
    h, _ = model(jnp.asarray(b["tokens"]), jnp.asarray(b["mask"]))
    p = jax.nn.softmax(model.logits(h[:, :-1]), axis=-1)
    want = np.where(b["loss_mask"], np.asarray((p ** 2).sum(-1)), 0.0)
    np.testing.assert_allclose(b["sum_pi_squared"], want, rtol=1e-5, atol=1e-6)
    assert b["loss_mask"].any()
