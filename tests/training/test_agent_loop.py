"""The agent loop end to end on a tiny model: multi-turn episodes, observation tokens in the
context but not the loss, the sampler's log-probs equal the trainer's, a crashing environment
is contained, resume is bitwise, and turn-level inputs reach only agent runs."""

from __future__ import annotations

import hashlib

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from jaxrl_llm.agents import EnvSpec
from jaxrl_llm.agents.rollout import ChatFormat
from jaxrl_llm.data.char_tokenizer import char_tokenizer
from jaxrl_llm.models import Transformer, preset
from jaxrl_llm.rollout import SamplingConfig
from jaxrl_llm.rollout.multiturn import MultiTurnSampler
from jaxrl_llm.training import Checkpointer, init_train_state, make_train_step, recipe
from jaxrl_llm.training.agent_loop import AgentTrainer, SeedStream

TOK = char_tokenizer()
LETTERS = "abcd"


class Echo:
    """Shows a letter; the policy must answer with it; 3 turns; reward 1/3 per correct turn (plus
    0.01 per character of the action).
    Seed ``s`` starts at letter ``s % 4``; the state is the letter shown."""

    max_turns = 3

    def reset(self, seed):
        self.i, self.t = seed % 4, 0
        return f"say {LETTERS[self.i]}", {}

    def step(self, action):
        ok = action.strip()[:1] == LETTERS[self.i]
        self.t += 1
        self.i = (self.i + 1) % 4
        done = self.t >= 3
        reward = (1 / 3 if ok else 0.0) + 0.01 * len(action)  # the length part: varied rewards from a random policy
        return f"say {LETTERS[self.i]}", reward, done, False, {"success": done and ok}

    def state_key(self):
        return LETTERS[self.i]


class Crashing(Echo):
    def step(self, action):
        if self.t == 1 and len(action) % 2 == 0:  # the second turn of some episodes
            raise RuntimeError("environment bug")
        return super().step(action)


def spec(env=Echo):
    return EnvSpec("echo", env, lambda split, n, seed: [4 * k + (0 if split == "train" else 1) for k in range(n)])


_CACHE: dict = {}


def make(name="grpo", env=Echo, g=4, horizon=None, **fields):
    model = Transformer(preset("tiny", vocab_size=TOK.vocab_size, hidden_size=32, num_layers=2), rngs=nnx.Rngs(0))
    gd, params = nnx.split(model)
    rec = recipe(name, num_samples=g, **fields)
    opt = optax.adam(1e-2)
    key = ("step", rec.objective)
    if key not in _CACHE:
        _CACHE[key] = make_train_step(gd, opt, rec.objective)
    cfg = SamplingConfig(max_new_tokens=4, num_samples=g, stop_token_ids=(TOK.eos_token_id,),
                         pad_token_id=TOK.pad_token_id)
    skey = ("sampler", g)
    if skey not in _CACHE:
        _CACHE[skey] = MultiTurnSampler(gd, cfg, context_len=96, length_buckets=(8,), obs_buckets=(8,))
    fmt = ChatFormat(TOK, chat=False, end_token_id=TOK.eos_token_id)
    critic = None
    if rec.needs_critic:
        from jaxrl_llm.training import Critic

        critic = Critic.create(model.cfg, optax.adam(1e-2), rec.value_objective, policy_params=params, seed=0)
    progress = None
    if rec.needs_progress_model:
        from jaxrl_llm.training import Critic, ProgressObjective

        progress = Critic.create(model.cfg, optax.adam(1e-2), ProgressObjective(), policy_params=params, seed=1)
    return AgentTrainer(gd, init_train_state(params, opt, seed=0), _CACHE[key], _CACHE[skey], SeedStream(spec(env), 2),
                        spec(env), fmt, rec, TOK, seed=1, episode_buckets=(32, 64), critic=critic, progress=progress,
                        horizon=horizon)


def test_episodes_train_on_policy_tokens_only_with_the_sampler_logprobs():
    tr = make()
    m = tr.step()
    b, ep = tr.last_batch, tr.last_episodes
    p = b["tokens"].shape[1] - b["completion_mask"].shape[1]
    assert ep.turns.tolist() == [3] * 8 and m["episodes/turns_mean"] == 3
    for i in range(8):
        region = b["tokens"][i, p:][b["mask"][i, p:]]
        assert region.tolist() == ep.tokens[i]
        text = TOK.decode(ep.tokens[i])
        for k, obs in enumerate(ep.observations[i]):
            assert f"\n{obs}\n" in text  # observations are in the context ...
        cm = b["completion_mask"][i]
        assert cm.sum() == sum(ep.policy[i]) and cm.sum() < b["mask"][i, p:].sum()  # ... but not in the loss
    assert np.all(b["loss_mask"][:, p - 1:] == b["completion_mask"])
    # the sampler's log-probs (old_logp) equal a teacher-forced pass of the policy that sampled
    # (before the update: recompute with the initial params)
    fresh = make()
    lp = np.asarray(fresh.logp(fresh.state.params, fresh.frozen, b["tokens"], b["mask"]))
    lm = b["loss_mask"]
    np.testing.assert_allclose(b["old_logp"][lm], lp[lm], atol=2e-5)
    assert np.isfinite(m["loss"]) and m["episodes/env_errors"] == 0
    assert m["rewards/total/mean"] == pytest.approx(float(np.mean(ep.returns)))


def test_a_crashing_environment_ends_its_episode_and_the_run_goes_on():
    tr = make(env=Crashing)
    m = tr.step()
    ep = tr.last_episodes
    failed = [i for i, e in enumerate(ep.error) if e is not None]
    assert failed and m["episodes/env_errors"] == len(failed)
    for i in failed:
        assert "environment bug" in ep.error[i] and ep.returns[i] == 0.0 and ep.turns[i] == 2
    assert any(e is None for e in ep.error)
    assert np.isfinite(m["loss"])


def _digest(tree):
    return hashlib.sha256(b"".join(np.asarray(x).tobytes() for x in jax.tree.leaves(jax.device_get(tree)))).hexdigest()


@pytest.mark.parametrize("name", ["grpo", pytest.param("spa", marks=pytest.mark.slow)])
def test_resume_is_bitwise(tmp_path, name):
    """GRPO, and SPA-RL with its critic and progress estimator in the checkpoint."""
    def run(tr, steps, ckpt=None):
        if ckpt is not None:
            tr.checkpointer = Checkpointer(ckpt, keep_last=1)
            tr.restore()
        tr.run(steps)
        extra = (_digest(tr.critic.state), _digest(tr.progress.state)) if name == "spa" else ()
        return _digest(tr.state), [h["rewards/total/mean"] for h in tr.history], tr.data.position, extra

    a = run(make(name), 3)
    run(make(name), 2, tmp_path)
    resumed = make(name)
    b = run(resumed, 3, tmp_path)
    assert len(resumed.history) == 3 and a == b


def test_single_turn_loops_refuse_turn_level_inputs():
    from jaxrl_llm.rollout import Sampler
    from jaxrl_llm.training import RLTrainer

    tr = make()
    rec = tr.recipe
    # a recipe whose estimator reads turn rewards: fine in the agent loop, refused in the single-turn loop
    import dataclasses

    est = dataclasses.replace(rec.estimator, part=dataclasses.replace(rec.estimator.part,
                                                                      requires=frozenset({"turn_rewards"})))
    rec2 = dataclasses.replace(rec, estimator=est)
    with pytest.raises(ValueError, match="only an agent run provides"):
        RLTrainer(tr.graphdef, None, None, Sampler(tr.graphdef, tr.sampler.config), None, None, rec2, TOK)


@pytest.mark.parametrize("name", ["gigpo", "turn_baseline", "flow_grpo", "empg", "mars", "multiturn_gae", "poad",
                                  "eapo", "aspo"])
def test_turn_level_estimators_run_in_the_agent_loop(name):
    """One step each: advantages on policy tokens only, equal to the core function on the
    batch's own turn inputs; the turn inputs are what the episodes say."""
    import jax.numpy as jnp

    import jaxrl_llm.core as core

    critic = name in ("multiturn_gae", "poad")
    tr = make("ppo" if critic else "grpo", advantage={"name": name, **({"gamma": 0.9} if name == "eapo" else {})})
    m = tr.step()
    b, ep = tr.last_batch, tr.last_episodes
    p = b["tokens"].shape[1] - b["completion_mask"].shape[1]
    adv = b["advantages"][:, p - 1:]
    cm = b["completion_mask"]
    assert np.all(adv[~cm] == 0) and np.isfinite(adv).all() and np.abs(adv[cm]).sum() > 0
    assert np.isfinite(m["loss"])
    if critic:
        return
    tm = b["turn_mask"]
    assert tm.sum(1).tolist() == ep.turns.tolist()
    if "turn_rewards" in b:  # only the inputs the estimator requires are provided
        np.testing.assert_allclose(b["turn_rewards"][tm], np.concatenate([np.asarray(r) for r in ep.rewards]))
    if name == "gigpo":
        sid = b["state_ids"]
        for i in range(len(sid)):  # same id <=> same (group, letter shown)
            for k in range(int(tm[i].sum())):
                j, kk = np.nonzero(sid == sid[i, k])
                assert all(ep.state_keys[a][c] == ep.state_keys[i][k] and a // 4 == i // 4 for a, c in zip(j, kk))
        want = core.gigpo_advantages(jnp.asarray(b["scores"]), b["turn_rewards"], tm, sid, b["group_ids"], 2,
                                     sid.size, gamma=0.95)
        np.testing.assert_allclose(adv, np.asarray(core.broadcast_turns(want, b["turn_ids"], cm)), atol=1e-6)
    if name == "empg":
        assert b["turn_entropy"].shape == tm.shape and (b["turn_entropy"][tm] > 0).all()
    if name == "eapo":
        want = core.eapo_turn_advantages(jnp.asarray(b["scores"]), tm, b["group_ids"], 2, gamma=0.9)
        np.testing.assert_allclose(adv, np.asarray(core.broadcast_turns(want, b["turn_ids"], cm)), atol=1e-6)


class EchoWithAnswer(Echo):
    def reset(self, seed):
        obs, _ = super().reset(seed)
        return obs, {"answer": "abc"}


def test_igpo_scores_the_gold_answer_after_each_turn():
    tr = make("grpo", env=EchoWithAnswer, advantage="igpo")
    m = tr.step()
    b, ep = tr.last_batch, tr.last_episodes
    assert b["gt_logp"].shape == (8, 4) and np.isfinite(m["loss"])
    fresh = make("grpo", env=EchoWithAnswer, advantage="igpo")  # the params that sampled (before the update)
    gt = TOK("abc", add_special_tokens=False)["input_ids"]
    for i, j in ((0, 0), (0, 1), (5, 2)):
        cut = ([0] + ep.boundaries[i])[j]
        seq = ep.prompt_ids[i // 4] + ep.tokens[i][:cut] + gt
        toks, mask = np.array([seq], np.int32), np.ones((1, len(seq)), bool)
        lp = np.asarray(fresh.logp(fresh.state.params, fresh.frozen, toks, mask))[0]
        np.testing.assert_allclose(b["gt_logp"][i, j], lp[-len(gt):].mean(), atol=2e-5)
    with pytest.raises(ValueError, match="gives no gold answer"):
        make("grpo", advantage="igpo").step()


class EchoGrounded(Echo):
    """An action that does not start with a letter a-d is not executed (``info["invalid"]``)."""

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        return obs, r, term, trunc, {**info, "invalid": action.strip()[:1] not in LETTERS}


def test_spa_scores_turns_with_the_progress_estimator_and_fits_it():
    """SPA-RL: contributions are the progress estimator's scores at each turn's last policy
    token; the advantages are GAE over the fused reward alpha c + beta g with the critic's
    values; grounding is what the environment said; the estimator is trained each step."""
    import jax.numpy as jnp

    import jaxrl_llm.core as core

    tr = make("spa", env=EchoGrounded)
    p0 = jax.tree.map(np.array, jax.device_get(tr.progress.state.params))
    fresh = make("spa", env=EchoGrounded)  # the estimator before the update
    m = tr.step()
    b, ep = tr.last_batch, tr.last_episodes
    p = b["tokens"].shape[1] - b["completion_mask"].shape[1]
    tm, cm = b["turn_mask"], b["completion_mask"]
    # grounding: 1 exactly for the executed actions
    want_g = np.zeros(tm.shape, np.float32)
    for i, acts in enumerate(ep.actions):
        for k, a in enumerate(acts):
            want_g[i, k] = a.strip()[:1] in LETTERS
    np.testing.assert_array_equal(b["grounding"], want_g)
    assert 0 < want_g[tm].mean() < 1  # a random policy: some actions executed, some not
    # contributions: a forward pass of the estimator, read at each turn's last policy token
    est = nnx.merge(fresh.progress.graphdef, fresh.progress.state.params)
    hidden, _ = est(b["tokens"], b["mask"])
    scores = np.asarray(est.scores(hidden)[..., 0])
    for i in range(len(tm)):
        for k in range(int(tm[i].sum())):
            last = p + np.flatnonzero(b["turn_ids"][i] == k)[-1]
            np.testing.assert_allclose(b["progress"][i, k], scores[i, last], atol=1e-5)
    assert np.all(b["progress"][~tm] == 0)
    # advantages: the composition of the core functions on the batch's own inputs
    r = core.spa_turn_rewards(b["progress"], tm, b["grounding"], alpha=1.0, beta=0.5)
    adv, _ = core.multiturn_gae_advantages(core.place_turn_rewards(r, b["turn_ids"], cm), b["old_values"][:, p - 1:],
                                           cm, gamma=1.0, lam=1.0, whiten=True)
    np.testing.assert_allclose(b["advantages"][:, p - 1:], np.asarray(adv), atol=1e-5)
    # the estimator was fitted on this batch: its parameters moved, its loss was logged
    moved = jax.tree.leaves(jax.tree.map(lambda x, y: float(np.abs(np.asarray(x) - y).max()),
                                         jax.device_get(tr.progress.state.params), p0))
    assert max(moved) > 0 and np.isfinite(m["progress/progress_loss"]) and "critic/vf_loss" in m
    assert m["episodes/grounded_rate"] == pytest.approx(want_g[tm].mean())
    with pytest.raises(ValueError, match="reads a progress estimator"):
        AgentTrainer(tr.graphdef, tr.state, tr.train_step, tr.sampler, tr.data, tr.spec, tr.fmt, tr.recipe, TOK,
                     critic=tr.critic)


def test_progress_objective_fits_contributions_that_sum_to_the_outcome():
    """ProgressObjective's loss is mean_i (sum_k c_ik - R_i)^2 over episodes with a turn (a
    hand computation on the model's own scores), exact across micro-batches, and training
    drives it down."""
    from jaxrl_llm.training import Critic, ProgressObjective
    from jaxrl_llm.training.objectives import turn_contributions

    model = Transformer(preset("tiny", vocab_size=TOK.vocab_size, hidden_size=32, num_layers=2), rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    batch = {"tokens": rng.integers(3, TOK.vocab_size, (4, 12)).astype(np.int32), "mask": np.ones((4, 12), bool),
             "turn_end": np.array([[2, 6, 11], [3, 0, 0], [4, 9, 0], [0, 0, 0]], np.int32),
             "turn_mask": np.array([[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]], bool),
             "outcome": np.array([1.0, 0.0, 0.5, 7.0], np.float32)}
    crit = Critic.create(model.cfg, optax.adam(3e-3), ProgressObjective(), seed=0)
    crit2 = Critic.create(model.cfg, optax.adam(3e-3), ProgressObjective(), seed=0, num_microbatches=2)
    m_model = nnx.merge(crit.graphdef, crit.state.params)
    hidden, _ = m_model(batch["tokens"], batch["mask"])
    sc = np.asarray(m_model.scores(hidden)[..., 0])
    sums = [sc[0, 2] + sc[0, 6] + sc[0, 11], sc[1, 3], sc[2, 4] + sc[2, 9]]  # row 3 has no turn: left out
    want = np.mean([(sums[0] - 1.0) ** 2, (sums[1] - 0.0) ** 2, (sums[2] - 0.5) ** 2])
    c = np.asarray(turn_contributions(m_model, batch))
    assert c[1, 1] == 0 and c[3].tolist() == [0, 0, 0]
    s1, m1 = crit.train_step(crit.state, batch)
    s2, m2 = crit2.train_step(crit2.state, batch)
    np.testing.assert_allclose(float(m1["loss"]), want, rtol=1e-5)
    np.testing.assert_allclose(float(m2["loss"]), want, rtol=1e-5)
    np.testing.assert_allclose(float(m1["progress_loss"]), want, rtol=1e-5)
    st = s1
    for _ in range(60):
        st, m = crit.train_step(st, batch)
    assert float(m["loss"]) < 0.05 * want


def test_aspo_finds_the_first_tool_call_of_each_episode():
    """The estimator entry: the first policy token of the first turn whose step called a tool,
    the response length up to the last policy token, GRPO's outcome advantage, then the shaping."""
    import jax.numpy as jnp

    import jaxrl_llm.core as core
    from jaxrl_llm.algorithms import ESTIMATORS, EstimatorInputs

    # 4 episodes of one group; tokens: turn 0 = 2 tokens, an observation token, turn 1 = 2 tokens
    tid = np.array([[0, 0, -1, 1, 1]] * 4, np.int32)
    mask = tid >= 0
    calls = np.array([[1, 0], [0, 1], [0, 0], [1, 1]], np.float32)
    x = {"scores": np.array([1, 1, 0, 1], np.float32), "mask": mask, "group_ids": np.zeros(4, np.int32),
         "turn_ids": tid, "turn_mask": np.ones((4, 2), bool), "turn_tool_calls": calls}
    part = ESTIMATORS["aspo"]
    out = np.asarray(part.fn(EstimatorInputs(x, 1, allowed=part.requires)).advantages)
    base = np.asarray(core.grpo_advantages(x["scores"], mask, x["group_ids"], 1))[:, 0]
    want = core.aspo_advantages(base, np.array([1, 1, 0, 1], bool), np.array([0, 3, -1, 0]), np.full(4, 5.0),
                                mask, x["group_ids"], 1)
    np.testing.assert_allclose(out, np.asarray(want), atol=1e-6)
    assert out[1, 0] < base[1] < out[0, 0]  # the late caller loses, the early callers gain


class EchoInvalid(Echo):
    """Echo whose actions not starting with a letter of "abcd" are invalid (info["invalid"])."""

    def step(self, action):
        bad = action.strip()[:1] not in LETTERS
        obs, r, done, trunc, info = super().step(action)
        return obs, r, done, trunc, {**info, "invalid": bad}


def test_rlvmr_in_the_loop_reads_the_turns_grounding_tags_and_rewards():
    import jaxrl_llm.core as C

    tr = make("grpo", env=EchoInvalid, advantage={"name": "rlvmr", "weight": 0.5})
    tr.step()
    b, ep = tr.last_batch, tr.last_episodes
    k = max(ep.turns)
    from jaxrl_llm.training.agent_loop import rlvmr_turn_rewards

    r, tags = rlvmr_turn_rewards(ep, k)
    tm = np.zeros((len(ep.tokens), k), bool)
    gr = np.zeros((len(ep.tokens), k), np.float32)
    for i, g in enumerate(ep.grounded):
        tm[i, :len(g)], gr[i, :len(g)] = True, g
    assert (gr[tm] == 0).any() and (gr[tm] == 1).any()  # invalid and valid actions both occur
    turn_adv = C.rlvmr_advantages(ep.returns, r, tags, gr, tm, ep.group_ids, len(ep.seeds), weight=0.5)
    p = b["tokens"].shape[1] - b["completion_mask"].shape[1]
    tid = np.full(b["completion_mask"].shape, -1, np.int32)
    for i in range(len(ep.tokens)):
        pos = np.flatnonzero(b["completion_mask"][i])
        tid[i, pos] = [t for t in ep.turn_ids[i] if t >= 0][:len(pos)]
    want = np.asarray(C.broadcast_turns(turn_adv, tid, b["completion_mask"]))
    np.testing.assert_allclose(b["advantages"][:, p - 1:], want, atol=1e-5)
