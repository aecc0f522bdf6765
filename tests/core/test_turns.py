"""Turn-level credit assignment (jaxrl_llm.core.turns): hand values, paper identities, masks, jit, gradients.

Every estimator is checked against values worked out by hand (in comments) or by plain numpy loops
written from the papers / the authors' code, never by calling the function under test.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.core import advantages as A
from jaxrl_llm.core import turns as TU

EPS = 1e-6
# test-only: compile without LLVM optimisations (about a third less compile time for these tiny programs)
FAST = {"xla_backend_optimization_level": 0}


class _Compiled:
    """The functions of a module, compiled per call: array arguments are traced, everything else is bound.

    One XLA compilation per call is much cheaper than eager dispatch, which compiles every primitive
    for every new shape (this keeps the file fast on a loaded 2-core machine). Eager calls are covered
    by tests/core/test_battery.py (jit == eager for every function) and by the input-check tests here
    (the concrete id-range checks only run eagerly).
    """

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        fn = getattr(self._module, name)

        def call(*args, **kw):
            dyn = [i for i, a in enumerate(args) if isinstance(a, (np.ndarray, jax.Array))]

            def f(*arrays):
                full = list(args)
                for i, a in zip(dyn, arrays):
                    full[i] = a
                return fn(*full, **kw)

            return jax.jit(f, compiler_options=FAST)(*[args[i] for i in dyn])

        return call


JT, JA = _Compiled(TU), _Compiled(A)


def _np(x):
    return np.asarray(x, np.float64)


# ------------------------------------------------------------------ the GiGPO example
# 2 groups of 3 episodes, up to 3 turns, gamma = 0.5.
#   group 0: e0 (3 turns) rewards 0, 0, 1   e1 (2 turns) 0, 1   e2 (3 turns) 0.5, 0, 0
#   group 1: e3 (1 turn)  reward 1          e4 (3 turns) 0, 0, 0   e5 (2 turns) 0, 1
# discounted returns G_k = r_k + 0.5 G_{k+1}:
#   e0: 0.25, 0.5, 1    e1: 0.5, 1    e2: 0.5, 0, 0    e3: 1    e4: 0, 0, 0    e5: 0.5, 1
# anchor states (global ids):
#   0: initial state of group 0 (e0k0, e1k0, e2k0)       4: initial state of group 1 (e3k0, e4k0, e5k0)
#   1: e0k1, e1k1 and e2k2 (e2 reaches it one turn later) 5: e4k1, e5k1
#   2: e2k1 only   3: e0k2 only   6: e4k2 only (singletons: step advantage 0)
R_EX = np.array([[0, 0, 1], [0, 1, 0], [0.5, 0, 0], [1, 0, 0], [0, 0, 0], [0, 1, 0]], np.float32)
M_EX = np.array([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 0]], bool)
S_EX = np.array([[0, 1, 3], [0, 1, 0], [0, 2, 1], [4, 0, 0], [4, 5, 6], [4, 5, 0]], np.int32)
G_EX = np.array([0, 0, 0, 1, 1, 1], np.int32)
EP_EX = R_EX.sum(1)  # episode returns 1, 1, 0.5, 1, 0, 1


def _gigpo_ex(**kw):
    return _np(JT.gigpo_advantages(EP_EX, R_EX, M_EX, S_EX, G_EX, 2, 7, gamma=0.5, **kw))


def test_turn_returns_hand_computed():
    out = _np(JT.turn_returns(R_EX, M_EX, 0.5))
    np.testing.assert_allclose(out, [[0.25, 0.5, 1], [0.5, 1, 0], [0.5, 0, 0], [1, 0, 0], [0, 0, 0], [0.5, 1, 0]])
    # a missing turn is skipped: no reward, no discount step (G_0 = 1 + 0.5 * 3)
    out = _np(JT.turn_returns(np.array([[1.0, 7.0, 3.0]], np.float32), np.array([[1, 0, 1]], bool), 0.5))
    np.testing.assert_allclose(out, [[2.5, 0, 3]])


def test_gigpo_hand_computed_mean_std_norm():
    out = _gigpo_ex(scale_by_std=True)
    # episode level: group 0 R = (1, 1, 0.5): mean 5/6, unbiased std sqrt(1/12); group 1 R = (1, 0, 1): mean 2/3,
    # std sqrt(1/3)
    s0, s1 = math.sqrt(1 / 12), math.sqrt(1 / 3)
    ep = [(1 - 5 / 6) / (s0 + EPS), (1 - 5 / 6) / (s0 + EPS), (0.5 - 5 / 6) / (s0 + EPS),
          (1 - 2 / 3) / (s1 + EPS), (0 - 2 / 3) / (s1 + EPS), (1 - 2 / 3) / (s1 + EPS)]
    # state 0: returns (0.25, 0.5, 0.5): mean 5/12, deviations (-1/6, 1/12, 1/12), var (1/24)/2 = 1/48
    st0 = math.sqrt(1 / 48)
    # state 1: (0.5, 1, 0): mean 0.5, std 0.5; state 4: (1, 0, 0.5): mean 0.5, std 0.5;
    # state 5: (0, 1): mean 0.5, std sqrt(0.5)
    st5 = math.sqrt(0.5)
    step = np.array([
        [(0.25 - 5 / 12) / (st0 + EPS), (0.5 - 0.5) / (0.5 + EPS), 0.0],  # e0k2: state 3 seen once
        [(0.5 - 5 / 12) / (st0 + EPS), (1 - 0.5) / (0.5 + EPS), 0.0],
        [(0.5 - 5 / 12) / (st0 + EPS), 0.0, (0 - 0.5) / (0.5 + EPS)],  # e2k1: state 2 once; e2k2 in state 1
        [(1 - 0.5) / (0.5 + EPS), 0.0, 0.0],
        [(0 - 0.5) / (0.5 + EPS), (0 - 0.5) / (st5 + EPS), 0.0],  # e4k2: state 6 once
        [(0.5 - 0.5) / (0.5 + EPS), (1 - 0.5) / (st5 + EPS), 0.0],
    ])
    expected = (np.array(ep)[:, None] + step) * M_EX
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    # omega weights the step part
    np.testing.assert_allclose(_gigpo_ex(omega=0.5), (np.array(ep)[:, None] + 0.5 * step) * M_EX, rtol=1e-5,
                               atol=1e-6)


def test_gigpo_hand_computed_mean_norm():
    out = _gigpo_ex(scale_by_std=False)
    ep = np.array([1 / 6, 1 / 6, -1 / 3, 1 / 3, -2 / 3, 1 / 3])
    step = np.array([[0.25 - 5 / 12, 0, 0], [0.5 - 5 / 12, 0.5, 0], [0.5 - 5 / 12, 0, -0.5],
                     [0.5, 0, 0], [-0.5, -0.5, 0], [0, 0.5, 0]])
    np.testing.assert_allclose(out, (ep[:, None] + step) * M_EX, atol=1e-6)


def _gigpo_reference(ep_ret, r, m, sid, gid, gamma, omega, scale, episode_stats):
    """verl-agent's GiGPO in numpy loops (one training row per (episode, turn), as verl-agent has it)."""
    n, k = m.shape
    rows = [(i, t) for i in range(n) for t in range(k) if m[i, t]]
    ret = {}
    for i in range(n):  # compute_step_discounted_returns
        run = 0.0
        for t in reversed(range(k)):
            if m[i, t]:
                run = r[i, t] + gamma * run
                ret[(i, t)] = run
    # episode_norm_reward: scores per group, once per episode or once per step row
    scores = {}
    for (i, t) in rows:
        if episode_stats == "turns" or not any(j == i for j, _ in scores.get(gid[i], [])):
            scores.setdefault(gid[i], []).append((i, ep_ret[i]))
    stats = {}
    for g, lst in scores.items():
        vals = np.array([x for _, x in lst])
        stats[g] = (0.0, 1.0) if len(vals) == 1 else (vals.mean(), vals.std(ddof=1))
    by_state = {}
    for (i, t) in rows:
        by_state.setdefault(sid[i, t], []).append(ret[(i, t)])
    out = np.zeros((n, k))
    for (i, t) in rows:
        mu, sd = stats[gid[i]]
        e = (ep_ret[i] - mu) / (sd + EPS) if scale else ep_ret[i] - mu
        vals = np.array(by_state[sid[i, t]])
        smu, ssd = (vals.mean(), 1.0) if len(vals) == 1 else (vals.mean(), vals.std(ddof=1))
        s = (ret[(i, t)] - smu) / (ssd + EPS) if scale else ret[(i, t)] - smu
        out[i, t] = e + omega * s
    return out


@pytest.mark.parametrize("scale", [True, False])
@pytest.mark.parametrize("episode_stats", ["episodes", "turns"])
def test_gigpo_matches_numpy_loops_on_random_batches(scale, episode_stats):
    rng = np.random.default_rng(0)
    n, k = 10, 5
    lengths = rng.integers(1, k + 1, n)
    m = np.arange(k)[None] < lengths[:, None]
    r = rng.normal(size=(n, k)).astype(np.float32)
    ep = rng.normal(size=n).astype(np.float32)
    gid = np.repeat([0, 1], 5).astype(np.int32)
    sid = (rng.integers(0, 4, (n, k)) + 4 * gid[:, None]).astype(np.int32)  # few states: many repeats
    out = _np(JT.gigpo_advantages(ep, r, m, sid, gid, 2, 8, gamma=0.9, omega=0.7, scale_by_std=scale,
                                  episode_stats=episode_stats))
    ref = _gigpo_reference(ep, r, m, sid, gid, 0.9, 0.7, scale, episode_stats)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


def test_gigpo_omega_zero_is_grpo_broadcast_and_distinct_states_add_nothing():
    # tokens: each turn gets 2 policy tokens followed by 1 observation token
    n, k = M_EX.shape
    tid = np.repeat(np.arange(k), 3)[None].repeat(n, 0).astype(np.int32)
    tok_mask = (np.arange(3 * k)[None] % 3 != 2) & np.repeat(M_EX, 3, axis=1)
    for scale in (True, False):
        adv0 = JT.gigpo_advantages(EP_EX, R_EX, M_EX, S_EX, G_EX, 2, 7, gamma=0.5, omega=0.0, scale_by_std=scale)
        grpo = JA.grpo_advantages(EP_EX, tok_mask, G_EX, 2, scale_by_std=scale)
        np.testing.assert_allclose(_np(JT.broadcast_turns(adv0, tid, tok_mask)), _np(grpo), atol=1e-6)
    # every (episode, turn) in its own state: the step part is 0 for any omega
    distinct = np.arange(n * k, dtype=np.int32).reshape(n, k)
    a1 = JT.gigpo_advantages(EP_EX, R_EX, M_EX, distinct, G_EX, 2, n * k, gamma=0.5, omega=1.0)
    a0 = JT.gigpo_advantages(EP_EX, R_EX, M_EX, distinct, G_EX, 2, n * k, gamma=0.5, omega=0.0)
    np.testing.assert_array_equal(_np(a1), _np(a0))


def test_gigpo_episode_stats_turns_weights_episodes_by_their_turns():
    # one group: e0 with 1 turn and R = 1, e1 with 3 turns and R = 0; omega = 0
    m = np.array([[1, 0, 0], [1, 1, 1]], bool)
    r = np.zeros((2, 3), np.float32)
    ep = np.array([1.0, 0.0], np.float32)
    s = np.array([[0, 0, 0], [1, 2, 3]], np.int32)
    g = np.zeros(2, np.int32)
    per_ep = _np(JT.gigpo_advantages(ep, r, m, s, g, 1, 4, gamma=1.0, omega=0.0))
    per_turn = _np(JT.gigpo_advantages(ep, r, m, s, g, 1, 4, gamma=1.0, omega=0.0, episode_stats="turns"))
    # episodes: values (1, 0): mean 0.5, std sqrt(0.5)
    np.testing.assert_allclose(per_ep[:, 0], [0.5 / (math.sqrt(0.5) + EPS), -0.5 / (math.sqrt(0.5) + EPS)], rtol=1e-6)
    # turns: values (1, 0, 0, 0): mean 0.25, std sqrt(0.75 / 3) = 0.5
    np.testing.assert_allclose(per_turn[:, 0], [0.75 / (0.5 + EPS), -0.25 / (0.5 + EPS)], rtol=1e-6)


# ------------------------------------------------------------------ per-turn group baseline
def test_turn_group_baseline_hand_computed():
    # one group of three: lengths 3, 2, 1; gamma = 1: returns e0 (2, 2, 1), e1 (1, 0), e2 (3,)
    r = np.array([[0, 1, 1], [1, 0, 9], [3, 9, 9]], np.float32)
    m = np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0]], bool)
    g = np.zeros(3, np.int32)
    out = _np(JT.turn_group_baseline_advantages(r, m, g, 1, gamma=1.0))
    # turn 0: mean(2, 1, 3) = 2; turn 1: mean(2, 0) = 1; turn 2: only e0 reaches it -> baseline 0
    np.testing.assert_allclose(out, [[0, 1, 1], [-1, -1, 0], [1, 0, 0]], atol=1e-6)
    out = _np(JT.turn_group_baseline_advantages(r, m, g, 1, gamma=1.0, scale_by_std=True))
    # turn 0 std = 1, turn 1 std = sqrt(2); the lone turn 2 keeps its raw return / (1 + eps)
    np.testing.assert_allclose(out, [[0, 1 / (math.sqrt(2) + EPS), 1 / (1 + EPS)],
                                     [-1 / (1 + EPS), -1 / (math.sqrt(2) + EPS), 0], [1 / (1 + EPS), 0, 0]],
                               rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------ Flow-GRPO
def test_flow_grpo_hand_and_equals_grpo_on_tokens():
    out = _np(JT.flow_grpo_advantages(EP_EX, M_EX, G_EX, 2, scale_by_std=False))
    np.testing.assert_allclose(out, np.array([1 / 6, 1 / 6, -1 / 3, 1 / 3, -2 / 3, 1 / 3])[:, None] * M_EX,
                               atol=1e-6)
    n, k = M_EX.shape
    tid = np.repeat(np.arange(k), 2)[None].repeat(n, 0).astype(np.int32)
    tok_mask = np.repeat(M_EX, 2, axis=1) & (np.arange(2 * k)[None] % 2 == 0)  # observation token after each
    for scale in (True, False):
        flow = JT.flow_grpo_advantages(EP_EX, M_EX, G_EX, 2, scale_by_std=scale)
        grpo = JA.grpo_advantages(EP_EX, tok_mask, G_EX, 2, scale_by_std=scale)
        np.testing.assert_allclose(_np(JT.broadcast_turns(flow, tid, tok_mask)), _np(grpo), atol=1e-6)


def test_flow_grpo_turn_stats_equal_grpo_over_one_row_per_turn():
    """The authors' layout: one training row per turn, each carrying its episode's outcome."""
    out = _np(JT.flow_grpo_advantages(EP_EX, M_EX, G_EX, 2, episode_stats="turns"))
    rows = np.argwhere(M_EX)
    grpo = _np(JA.grpo_advantages(EP_EX[rows[:, 0]], np.ones((len(rows), 1)), G_EX[rows[:, 0]], 2))[:, 0]
    np.testing.assert_allclose(out[rows[:, 0], rows[:, 1]], grpo, rtol=1e-6)


# ------------------------------------------------------------------ EMPG
def test_empg_hand_computed():
    m = np.array([[1, 1, 1], [1, 1, 0]], bool)
    h = np.array([[0.2, 1.0, 0.6], [0.2, 0.4, 123.0]], np.float32)  # 123: not a turn, ignored
    a = np.array([1.0, -1.0], np.float32)
    out = _np(JT.empg_advantages(a, h, m, k=1.0, k_prime=2.0, zeta=0.1))
    # min 0.2, max 1.0: H~ = [[0, 1, 0.5], [0, 0.25]]
    hn = [[0.0, 1.0, 0.5], [0.0, 0.25]]
    e = [[math.exp(-x) for x in row] for row in hn]
    mean_e = (sum(e[0]) + sum(e[1])) / 5
    g = [[x / mean_e for x in row] for row in e]
    f = [[math.exp(-2 * x) for x in row] for row in hn]
    # bonus from the next turn of the same episode; last turns get none
    mod = [[g[0][0] * 1 + 0.1 * f[0][1], g[0][1] * 1 + 0.1 * f[0][2], g[0][2] * 1],
           [g[1][0] * -1 + 0.1 * f[1][1], g[1][1] * -1]]
    mu = (sum(mod[0]) + sum(mod[1])) / 5
    expected = [[x - mu for x in mod[0]], [mod[1][0] - mu, mod[1][1] - mu, 0.0]]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_empg_scaling_has_mean_one_and_k_zero_is_identity():
    rng = np.random.default_rng(1)
    m = np.arange(4)[None] < rng.integers(1, 5, 6)[:, None]
    h = rng.uniform(0, 3, (6, 4)).astype(np.float32)
    ones = np.ones(6, np.float32)
    g = _np(JT.empg_advantages(ones, h, m, zeta=0.0, final_norm="none"))  # = g(H) itself
    assert abs(g[m].mean() - 1) < 1e-5
    assert g[m][np.argmin(h[m])] == g[m].max() and g[m][np.argmax(h[m])] == g[m].min()  # confident steps amplified
    adv = rng.normal(size=(6, 4)).astype(np.float32)
    out = _np(JT.empg_advantages(adv, h, m, k=0.0, zeta=0.0))
    np.testing.assert_allclose(out, (adv - adv[m].mean()) * m, atol=1e-5)
    out = _np(JT.empg_advantages(adv, h, m, k=0.0, zeta=0.0, final_norm="mean_std"))
    assert abs(out[m].mean()) < 1e-5 and abs(out[m].std(ddof=1) - 1) < 1e-3


# ------------------------------------------------------------------ IGPO
# two episodes of one group, K = 3: e0 answers at turn 2 (outcome 1), e1 answers at turn 1 (outcome 0)
# probability of the ground truth: e0 0.1 -> 0.3 -> 0.6 (0.9 unused), e1 0.2 -> 0.1 (unused after its answer)
P_IG = np.array([[0.1, 0.3, 0.6, 0.9], [0.2, 0.1, 0.5, 0.5]])
M_IG = np.array([[1, 1, 1], [1, 1, 0]], bool)
O_IG = np.array([1.0, 0.0], np.float32)


def test_igpo_turn_rewards_hand_computed():
    lp = np.log(P_IG).astype(np.float32)
    out = _np(JT.igpo_turn_rewards(lp, M_IG, O_IG))
    # probability differences, the answer turn gets the outcome
    np.testing.assert_allclose(out, [[0.3 - 0.1, 0.6 - 0.3, 1.0], [0.1 - 0.2, 0.0, 0.0]], atol=1e-6)
    out = _np(JT.igpo_turn_rewards(lp, M_IG, O_IG, gain="log_prob"))
    np.testing.assert_allclose(out, [[math.log(3), math.log(2), 1.0], [math.log(0.5), 0.0, 0.0]], rtol=1e-5)
    # columns after the answer are never read (even NaN)
    lp2 = lp.copy()
    lp2[0, 3] = lp2[1, 2:] = np.nan
    np.testing.assert_allclose(_np(JT.igpo_turn_rewards(lp2, M_IG, O_IG)), _np(JT.igpo_turn_rewards(lp, M_IG, O_IG)))


def test_igpo_advantages_hand_computed():
    r = np.array([[0.2, 0.3, 1.0], [-0.1, 0.0, 0.0]], np.float32)
    g = np.zeros(2, np.int32)
    out = _np(JT.igpo_advantages(r, M_IG, g, 1, gamma=1.0))
    # joint pool (0.2, 0.3, 1.0, -0.1, 0.0): mean 0.28, population variance
    vals = [0.2, 0.3, 1.0, -0.1, 0.0]
    var = sum((x - 0.28) ** 2 for x in vals) / 5
    z = [(x - 0.28) / (math.sqrt(var + 1e-8) + EPS) for x in vals]
    expected = [[z[0] + z[1] + z[2], z[1] + z[2], z[2]], [z[3] + z[4], z[4], 0.0]]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    out = _np(JT.igpo_advantages(r, M_IG, g, 1, gamma=0.5, norm_mode="separate", scale_by_std=False))
    # outcomes (1.0, 0.0): mean 0.5; information gains (0.2, 0.3, -0.1): mean 0.4 / 3
    ig = 0.4 / 3
    a = [[0.2 - ig, 0.3 - ig, 0.5], [-0.1 - ig, -0.5]]
    expected = [[a[0][0] + 0.5 * a[0][1] + 0.25 * a[0][2], a[0][1] + 0.5 * a[0][2], a[0][2]],
                [a[1][0] + 0.5 * a[1][1], a[1][1], 0.0]]
    np.testing.assert_allclose(out, expected, atol=1e-6)


# ------------------------------------------------------------------ MARS
def test_mars_hand_computed():
    # one game group, rows interleave two agents. e0: agents 0,1,0,1; agent 0 wins at its turn 2 (+1), agent 1
    # gets -1 at its last turn. e1: agents 0,1,0; agent 1 gets 0.5 at turn 1.
    r = np.array([[0, 0, 1, -1], [0, 0.5, 0, 0]], np.float32)
    m = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], bool)
    ag = np.array([[0, 1, 0, 1], [0, 1, 0, 0]], np.int32)
    g = np.zeros(2, np.int32)
    out = _np(JT.mars_advantages(r, m, ag, g, 1, 2))
    # gamma 1, returns over the agent's own turns: agent 0: e0 (1, 1), e1 (0, 0) -> mean 0.5;
    # agent 1: e0 (-1, -1), e1 (0.5) -> mean -0.5
    np.testing.assert_allclose(out, [[0.5, -0.5, 0.5, -0.5], [-0.5, 1.0, -0.5, 0]], atol=1e-6)
    out = _np(JT.mars_advantages(r, m, ag, g, 1, 2, gamma=0.5))
    # agent 0 in e0: R = (0 + 0.5 * 1, 1) = (0.5, 1): the discount counts agent 0's own turns only
    r0 = [0.5, 1.0, 0.0, 0.0]
    r1 = [-0.5, -1.0, 0.5]  # agent 1: e0 (0 + 0.5 * -1, -1), e1 (0.5)
    mu0, mu1 = np.mean(r0), np.mean(r1)
    np.testing.assert_allclose(out, [[r0[0] - mu0, r1[0] - mu1, r0[1] - mu0, r1[1] - mu1],
                                     [r0[2] - mu0, r1[2] - mu1, r0[3] - mu0, 0]], atol=1e-6)
    # two groups are normalised separately; the std option divides by the unbiased std of each (group, agent)
    out = _np(JT.mars_advantages(np.concatenate([r, r + 1]), np.concatenate([m, m]), np.concatenate([ag, ag]),
                                 np.array([0, 0, 1, 1], np.int32), 2, 2, scale_by_std=True))
    sd0, sd1 = np.std([1, 1, 0, 0], ddof=1), np.std([-1, -1, 0.5], ddof=1)
    first = np.array([[0.5 / (sd0 + EPS), -0.5 / (sd1 + EPS), 0.5 / (sd0 + EPS), -0.5 / (sd1 + EPS)],
                      [-0.5 / (sd0 + EPS), 1 / (sd1 + EPS), -0.5 / (sd0 + EPS), 0]])
    np.testing.assert_allclose(out[:2], first, rtol=1e-5)
    # group 1 has rewards + 1 on every turn: returns shift by the agent's number of later turns
    r0b, r1b = [3, 2, 2, 1], [1, 0, 1.5]
    np.testing.assert_allclose(out[2, [0, 2]], (np.array(r0b[:2]) - np.mean(r0b)) / (np.std(r0b, ddof=1) + EPS),
                               rtol=1e-5)
    np.testing.assert_allclose(out[3, 1], (r1b[2] - np.mean(r1b)) / (np.std(r1b, ddof=1) + EPS), rtol=1e-5)


# ------------------------------------------------------------------ SPA-RL
def test_spa_progress_loss_zero_when_contributions_sum_to_outcome_and_hand_values():
    c = np.array([[0.2, 0.3, 0.5], [0.1, -0.1, 77.0]], np.float32)  # 77: not a turn
    m = np.array([[1, 1, 1], [1, 1, 0]], bool)
    assert float(JT.spa_progress_loss(c, m, np.array([1.0, 0.0], np.float32))) == pytest.approx(0.0, abs=1e-12)
    out = JT.spa_progress_loss(c, m, np.array([0.0, 0.5], np.float32))
    assert float(out) == pytest.approx((1.0 ** 2 + 0.5 ** 2) / 2, rel=1e-6)  # errors 1.0 and -0.5
    grad = _np(jax.jit(jax.grad(lambda x: TU.spa_progress_loss(x, m, np.array([0.0, 0.5], np.float32))),
                       compiler_options=FAST)(c))
    np.testing.assert_allclose(grad, [[1.0, 1.0, 1.0], [-0.5, -0.5, 0.0]], rtol=1e-6)  # 2 err / N on each turn


def test_spa_turn_rewards_hand_computed():
    c = np.array([[0.2, 0.3, 0.5], [0.1, -0.1, 0.0]], np.float32)
    m = np.array([[1, 1, 1], [1, 1, 0]], bool)
    grounded = np.array([[1, 0, 1], [1, 1, 1]], bool)
    out = _np(JT.spa_turn_rewards(c, m, grounded))  # alpha 1, beta 0.5
    np.testing.assert_allclose(out, [[0.7, 0.3, 1.0], [0.6, 0.4, 0.0]], atol=1e-6)
    out = _np(JT.spa_turn_rewards(c, m, grounded, alpha=2.0, beta=0.1))
    np.testing.assert_allclose(out, [[0.5, 0.6, 1.1], [0.3, -0.1, 0.0]], atol=1e-6)
    np.testing.assert_allclose(_np(JT.spa_turn_rewards(c, m)), c * m, atol=1e-7)


# ------------------------------------------------------------------ multi-turn GAE
def test_multiturn_gae_hand_computed_skips_observation_tokens():
    r = np.array([[0.0, 9.0, 1.0]], np.float32)
    v = np.array([[0.5, 7.0, 0.1]], np.float32)
    m = np.array([[1, 0, 1]], np.float32)  # token 1 is an observation token
    adv, ret = JT.multiturn_gae_advantages(r, v, m, gamma=0.9, lam=0.8, whiten=False)
    a2 = 1.0 - 0.1  # last policy token: next value 0
    a0 = (0.0 + 0.9 * 0.1 - 0.5) + 0.9 * 0.8 * a2  # next value = V at the next POLICY token
    np.testing.assert_allclose(_np(adv), [[a0, 0, a2]], rtol=1e-6)
    np.testing.assert_allclose(_np(ret), [[a0 + 0.5, 0, a2 + 0.1]], rtol=1e-6)


def _token_batch(seed, holes):
    rng = np.random.default_rng(seed)
    n, t = 6, 9
    m = (np.arange(t)[None] < rng.integers(1, t + 1, n)[:, None]).astype(np.float32)
    if holes:
        m = m * (rng.uniform(size=(n, t)) > 0.3)
        m[:, 0] = 1.0
    return rng.normal(size=(n, t)).astype(np.float32), rng.normal(size=(n, t)).astype(np.float32), m


@pytest.mark.parametrize("whiten", [True, False])
@pytest.mark.parametrize("holes", [False, True])
def test_multiturn_gae_equals_gae_prefix_masks_and_verl_skipping(holes, whiten):
    """Contiguous masks: ordinary GAE. With holes: the numbers of verl's masked recursion (gae_advantages)."""
    r, v, m = _token_batch(3 + holes, holes)
    got = JT.multiturn_gae_advantages(r, v, m, gamma=0.9, lam=0.95, whiten=whiten)
    ref = JA.gae_advantages(r, v, m, 0.9, 0.95, whiten=whiten)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(_np(a), _np(b), rtol=1e-5, atol=1e-6)


def test_multiturn_gae_equals_plain_gae_on_the_policy_tokens_alone():
    """numpy loop: drop the observation tokens, run textbook GAE on what is left, put the results back."""
    r, v, m = _token_batch(5, True)
    adv, ret = JT.multiturn_gae_advantages(r, v, m, gamma=0.8, lam=0.7, whiten=False)
    for i in range(m.shape[0]):
        keep = np.flatnonzero(m[i] > 0)
        rr, vv = r[i, keep].astype(np.float64), v[i, keep].astype(np.float64)
        a, nxt_v, nxt_a = np.zeros(len(keep)), 0.0, 0.0
        for j in reversed(range(len(keep))):
            nxt_a = rr[j] + 0.8 * nxt_v - vv[j] + 0.8 * 0.7 * nxt_a
            a[j], nxt_v = nxt_a, vv[j]
        np.testing.assert_allclose(_np(adv)[i, keep], a, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(_np(ret)[i, keep], a + vv, rtol=1e-5, atol=1e-6)
        assert np.all(_np(adv)[i, m[i] == 0] == 0)


# ------------------------------------------------------------------ token <-> turn
def test_broadcast_and_place_hand_computed():
    m = np.array([[1, 1, 0, 0, 1, 1, 0], [1, 0, 1, 1, 1, 0, 0]], np.float32)
    tid = np.array([[0, 0, -1, -1, 1, 1, -1], [0, -1, 1, 1, 1, -1, -1]], np.int32)
    vals = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    np.testing.assert_array_equal(_np(JT.broadcast_turns(vals, tid, m)),
                                  [[1, 1, 0, 0, 2, 2, 0], [3, 0, 4, 4, 4, 0, 0]])
    np.testing.assert_array_equal(_np(JT.place_turn_rewards(vals, tid, m)),
                                  [[0, 1, 0, 0, 0, 2, 0], [3, 0, 0, 0, 4, 0, 0]])
    with pytest.raises(ValueError, match="'turn_ids'"):
        TU.broadcast_turns(vals, tid + 1, m)  # turn 2 does not exist (a concrete check: eager)


# ------------------------------------------------------------------ generic: jit, masks, padding, gradients
N, K = 6, 4
RNG = np.random.default_rng(42)
LEN = np.array([4, 2, 3, 1, 4, 3])
TM = np.arange(K)[None] < LEN[:, None]
GID = np.array([0, 0, 0, 1, 1, 1], np.int32)
TR = RNG.normal(size=(N, K)).astype(np.float32)
EPR = RNG.normal(size=N).astype(np.float32)
# per-turn side inputs have one spare row, for the padding-row test (row N belongs to group 0)
SIDS = (RNG.integers(0, 3, (N + 1, K)) + 3 * np.append(GID, 0)[:, None]).astype(np.int32)
AIDS = np.broadcast_to(np.arange(K) % 2, (N + 1, K)).astype(np.int32)
ENT = RNG.uniform(0.1, 2.0, (N + 1, K)).astype(np.float32)
GTLP = np.log(RNG.uniform(0.05, 0.95, (N + 1, K + 1))).astype(np.float32)
GROUNDED = RNG.uniform(size=(N + 1, K)) > 0.3

# name -> f(turn_rewards-like [N, K] float, episode-level [N] float, turn_mask, group_ids, valid)
CASES = {
    "turn_returns": lambda x, e, m, g, v: TU.turn_returns(x, m, 0.9, valid=v),
    "gigpo": lambda x, e, m, g, v: TU.gigpo_advantages(e, x, m, SIDS[:len(g)], g, 2, 6, gamma=0.9, valid=v),
    "gigpo_turns": lambda x, e, m, g, v: TU.gigpo_advantages(e, x, m, SIDS[:len(g)], g, 2, 6, gamma=0.9,
                                                             scale_by_std=False, episode_stats="turns", valid=v),
    "turn_baseline": lambda x, e, m, g, v: TU.turn_group_baseline_advantages(x, m, g, 2, gamma=0.9,
                                                                              scale_by_std=True, valid=v),
    "flow_grpo": lambda x, e, m, g, v: TU.flow_grpo_advantages(e, m, g, 2, valid=v),
    "empg": lambda x, e, m, g, v: TU.empg_advantages(e, x * x, m, valid=v),
    "empg_turn_adv": lambda x, e, m, g, v: TU.empg_advantages(x, ENT[:len(g)], m, final_norm="mean_std", valid=v),
    "igpo_rewards": lambda x, e, m, g, v: TU.igpo_turn_rewards(GTLP[:len(g)], m, e, valid=v),
    "igpo": lambda x, e, m, g, v: TU.igpo_advantages(x, m, g, 2, gamma=0.9, valid=v),
    "igpo_separate": lambda x, e, m, g, v: TU.igpo_advantages(x, m, g, 2, norm_mode="separate", valid=v),
    "mars": lambda x, e, m, g, v: TU.mars_advantages(x, m, AIDS[:len(g)], g, 2, 2, scale_by_std=True, valid=v),
    "spa_rewards": lambda x, e, m, g, v: TU.spa_turn_rewards(x, m, GROUNDED[:len(g)], valid=v),
    "spa_loss": lambda x, e, m, g, v: TU.spa_progress_loss(x, m, e, valid=v),
}
ADVANTAGE_CASES = sorted(set(CASES) - {"spa_loss"})
JCASES = {name: jax.jit(f, compiler_options=FAST) for name, f in CASES.items()}  # valid: a pytree argument


ALL = np.ones(N, bool)  # every generic call passes a valid array, so one compilation per case serves all tests


@pytest.mark.parametrize("name", sorted(CASES))
def test_jits_float32_finite_and_zero_outside_the_turns(name):
    """(jit == eager for every function is checked by tests/core/test_battery.py.)"""
    out = JCASES[name](TR, EPR, TM, GID, ALL)
    assert out.dtype == jnp.float32
    if name != "spa_loss":
        assert out.shape == (N, K) and np.all(_np(out)[~TM] == 0)
        assert np.all(np.isfinite(_np(out)))
        assert np.any(_np(out)[TM] != 0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_padding_row_equals_filtered(name):
    """An invalid row (NaN everywhere, every turn set) changes nothing for the others and gets 0."""
    f = JCASES[name]
    ref = _np(f(TR, EPR, TM, GID, ALL))
    x = np.concatenate([TR, np.full((1, K), np.nan, np.float32)])
    e = np.concatenate([EPR, [np.nan]]).astype(np.float32)
    m = np.concatenate([TM, np.ones((1, K), bool)])
    g = np.concatenate([GID, [0]]).astype(np.int32)
    valid = np.array([True] * N + [False])
    out = _np(f(x, e, m, g, valid))
    if name == "spa_loss":
        np.testing.assert_allclose(out, ref, rtol=1e-6)
    else:
        np.testing.assert_allclose(out[:N], ref, rtol=1e-5, atol=1e-6)
        assert np.all(out[N] == 0)


@pytest.mark.parametrize("name", ADVANTAGE_CASES)
def test_no_gradient_flows_through_advantages(name):
    f = CASES[name]
    gx, ge = jax.jit(jax.grad(lambda x, e: jnp.sum(f(x, e, TM, GID, ALL)), argnums=(0, 1)),
                     compiler_options=FAST)(TR, EPR)
    assert np.all(_np(gx) == 0) and np.all(_np(ge) == 0)
    if name.startswith("empg"):
        gh = jax.jit(jax.grad(lambda h: jnp.sum(TU.empg_advantages(EPR, h, TM))), compiler_options=FAST)(ENT[:N])
        assert np.all(_np(gh) == 0)


def test_no_gradient_through_token_level_outputs():
    r, v, m = _token_batch(1, True)
    g = jax.jit(jax.grad(lambda a, b: sum(jnp.sum(o) for o in TU.multiturn_gae_advantages(a, b, m)),
                         argnums=(0, 1)), compiler_options=FAST)(r, v)
    assert all(np.all(_np(x) == 0) for x in g)
    tid = np.zeros(m.shape, np.int32)
    g = jax.jit(jax.grad(lambda x: jnp.sum(TU.place_turn_rewards(x, tid, m))), compiler_options=FAST)(
        np.ones((m.shape[0], 2), np.float32))
    assert np.all(_np(g) == 0)


def test_garbage_under_the_turn_mask_changes_nothing():
    for name, f in JCASES.items():
        ref = _np(f(TR, EPR, TM, GID, ALL))
        bad = np.where(TM, TR, np.inf).astype(np.float32)
        out = _np(f(bad, EPR, TM, GID, ALL))
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6, err_msg=name)


def test_all_invalid_batch_is_zero_and_finite():
    for name, f in JCASES.items():
        out = _np(f(TR, EPR, TM, GID, np.zeros(N, bool)))
        assert np.all(out == 0), name


# ------------------------------------------------------------------ input checks
S6 = SIDS[:N]
BAD = {
    "turn_rewards rank": (lambda: TU.turn_returns(TR[:, 0], TM), "turn_rewards"),
    "turn_rewards shape": (lambda: TU.turn_returns(TR[:, :3], TM), "turn_rewards"),
    "turn_mask rank": (lambda: TU.turn_returns(TR, TM[0]), "turn_mask"),
    "gamma range": (lambda: TU.turn_returns(TR, TM, 1.5), "gamma"),
    "gigpo episode_returns": (lambda: TU.gigpo_advantages(EPR[:3], TR, TM, S6, GID, 2, 6, gamma=1.0),
                              "episode_returns"),
    "gigpo state_ids shape": (lambda: TU.gigpo_advantages(EPR, TR, TM, S6[:, :2], GID, 2, 6, gamma=1.0),
                              "state_ids"),
    "gigpo state_ids float": (lambda: TU.gigpo_advantages(EPR, TR, TM, S6 * 1.0, GID, 2, 6, gamma=1.0),
                              "state_ids"),
    "gigpo state_ids range": (lambda: TU.gigpo_advantages(EPR, TR, TM, S6, GID, 2, 3, gamma=1.0), "state_ids"),
    "gigpo num_states": (lambda: TU.gigpo_advantages(EPR, TR, TM, S6, GID, 2, 0, gamma=1.0), "num_states"),
    "gigpo group_ids": (lambda: TU.gigpo_advantages(EPR, TR, TM, S6, GID[:4], 2, 6, gamma=1.0), "group_ids"),
    "gigpo episode_stats": (lambda: TU.gigpo_advantages(EPR, TR, TM, S6, GID, 2, 6, gamma=1.0,
                                                        episode_stats="steps"), "episode_stats"),
    "baseline valid": (lambda: TU.turn_group_baseline_advantages(TR, TM, GID, 2, gamma=1.0, valid=np.ones(3)),
                       "valid"),
    "flow scores": (lambda: TU.flow_grpo_advantages(TR, TM, GID, 2), "scores"),
    "empg entropy shape": (lambda: TU.empg_advantages(EPR, ENT[:N, :2], TM), "turn_entropy"),
    "empg advantages": (lambda: TU.empg_advantages(EPR[:2], ENT[:N], TM), "advantages"),
    "empg final_norm": (lambda: TU.empg_advantages(EPR, ENT[:N], TM, final_norm="std"), "final_norm"),
    "igpo gt_logp": (lambda: TU.igpo_turn_rewards(GTLP[:N, :K], TM, EPR), "gt_logp"),
    "igpo outcome": (lambda: TU.igpo_turn_rewards(GTLP[:N], TM, EPR[:2]), "outcome"),
    "igpo gain": (lambda: TU.igpo_turn_rewards(GTLP[:N], TM, EPR, gain="ratio"), "gain"),
    "igpo norm_mode": (lambda: TU.igpo_advantages(TR, TM, GID, 2, norm_mode="turn"), "norm_mode"),
    "mars agent_ids range": (lambda: TU.mars_advantages(TR, TM, AIDS[:N] + 1, GID, 2, 2), "agent_ids"),
    "mars agent_ids shape": (lambda: TU.mars_advantages(TR, TM, AIDS[:3], GID, 2, 2), "agent_ids"),
    "spa outcome": (lambda: TU.spa_progress_loss(TR, TM, EPR[:1]), "outcome"),
    "spa grounding": (lambda: TU.spa_turn_rewards(TR, TM, GROUNDED[:N, :1]), "grounding"),
    "gae values": (lambda: TU.multiturn_gae_advantages(TR, TR[:, :2], TM), "values"),
    "broadcast turn_ids": (lambda: TU.broadcast_turns(TR, np.zeros((N, 3), np.int32), TM), "turn_ids"),
    "broadcast rows": (lambda: TU.broadcast_turns(TR[:2], np.zeros((N, K), np.int32), TM), "turn_values"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_names_the_argument(case):
    fn, name = BAD[case]
    with pytest.raises((ValueError, TypeError), match=f"'{name}'"):
        fn()


# --------------------------------------------------------------------------------------- POAD, EAPO


def test_poad_hand_values_and_one_token_actions():
    import jaxrl_llm.core as C

    v = np.array([[.3, .35, .4, .5, .7]], np.float32)
    m = np.ones((1, 5), np.float32)
    tid = np.array([[0, 0, 0, 1, 1]], np.int32)
    r = np.array([[0, 0, 0, 0, 1.]], np.float32)
    adv, ret = C.poad_advantages(r, v, m, tid, gamma=0.99, lam=0.95, whiten=False)
    a1 = [0.2 + 0.95 * 0.3, 0.3]  # action 1: inner delta .7 - .5 = .2, last delta 1 - .7 = .3
    a0_last = 0.99 * 0.5 - 0.4 + 0.99 * 0.95 * a1[0]
    a0_mid = 0.05 + 0.95 * a0_last
    a0_first = 0.05 + 0.95 * a0_mid
    np.testing.assert_allclose(adv[0], [a0_first, a0_mid, a0_last, *a1], atol=1e-6)
    np.testing.assert_allclose(adv[0], [0.594906, 0.573585, 0.551142, 0.485, 0.3], atol=1e-5)
    np.testing.assert_allclose(ret, adv + v, atol=1e-6)
    one = C.poad_advantages(r, v, m, np.arange(5)[None].astype(np.int32), gamma=0.9, lam=0.8, whiten=False)[0]
    np.testing.assert_allclose(one, C.multiturn_gae_advantages(r, v, m, gamma=0.9, lam=0.8, whiten=False)[0],
                               atol=1e-6)
    # an observation token between the actions changes nothing
    m2 = np.array([[1, 1, 1, 0, 1, 1]], np.float32)
    v2, r2 = np.insert(v, 3, 9.0, 1), np.insert(r, 3, 5.0, 1)
    t2 = np.array([[0, 0, 0, -1, 1, 1]], np.int32)
    out = C.poad_advantages(r2, v2, m2, t2, gamma=0.99, lam=0.95, whiten=False)[0]
    np.testing.assert_allclose(np.delete(np.asarray(out), 3, 1), adv, atol=1e-6)


def test_eapo_hand_values_and_gamma_one():
    import jaxrl_llm.core as C

    tm = np.array([[1, 1, 1], [1, 0, 0], [1, 1, 0]], bool)
    out = np.asarray(C.eapo_turn_advantages(np.array([1., 1., 0.]), tm, np.zeros(3, np.int32), 1, gamma=0.9,
                                            scale_by_std=False))
    r = np.array([0.81, 0.9, 1.0, 1.0, 0.0, 0.0])
    np.testing.assert_allclose(out[tm], r - r.mean(), atol=1e-6)
    assert np.all(out[~tm] == 0)
    # gamma = 1: every round carries the outcome, normalised over the group's rounds
    one = np.asarray(C.eapo_turn_advantages(np.array([1., 1., 0.]), tm, np.zeros(3, np.int32), 1, gamma=1.0))
    x = np.array([1, 1, 1, 1, 0, 0.])
    np.testing.assert_allclose(one[tm], (x - x.mean()) / (x.std(ddof=1) + 1e-6), atol=1e-5)


def test_matchtir_hand_values_and_identity():
    # one group of two episodes: turn rewards [0.5, 1.0] (two turns) and [0.0] (one turn)
    r = np.array([[0.5, 1.0], [0.0, 0.0]], np.float32)
    m = np.array([[1, 1], [1, 0]], bool)
    g = np.zeros(2, np.int32)
    out = np.asarray(TU.matchtir_advantages(r, m, g, 1, gamma=0.9))
    # R = [1.5, 0]: unbiased std 1.0607 -> A_traj = +-0.7071; turn 0 returns [0.5 + 0.9, 0] -> +-0.7071;
    # turn 1 only episode 0 has it: mean 0, std 1 -> its return 1.0
    a = 1.5 / 2 / (np.std([1.5, 0.0], ddof=1) + 1e-6)
    t0 = 1.4 / 2 / (np.std([1.4, 0.0], ddof=1) + 1e-6)
    np.testing.assert_allclose(out, [[(a + t0) / 2, (a + 1.0) / 2], [(-a - t0) / 2, 0.0]], rtol=1e-5)
    # traj_weight = 1: GRPO on the summed turn rewards, on every turn
    np.testing.assert_allclose(np.asarray(TU.matchtir_advantages(r, m, g, 1, traj_weight=1.0)),
                               np.asarray(TU.flow_grpo_advantages(r.sum(1) * np.array([1, 1]), m, g, 1)), rtol=1e-6)
    with pytest.raises(ValueError, match="traj_weight"):
        TU.matchtir_advantages(r, m, g, 1, traj_weight=1.5)


def test_rlvmr_advantages_by_hand():
    import jaxrl_llm.core as C

    # one group of two episodes, two turns each; episode 0 succeeded (return 1), episode 1 not
    scores = np.array([1.0, 0.0], np.float32)
    mr = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    tags = np.array([[2, 0], [2, 3]], np.int32)  # explore, none / explore, reflection
    ground = np.array([[1.0, 1.0], [0.0, 1.0]], np.float32)  # episode 1's first action invalid
    tm = np.ones((2, 2), bool)
    got = np.asarray(C.rlvmr_advantages(scores, mr, tags, ground, tm, np.zeros(2, np.int32), 1, weight=0.5,
                                        scale_by_std=False))
    step = np.array([[1.0, 1.0], [-0.1, 0.0]])  # the return minus 0.1 for the invalid action
    out = step - step.mean()
    # explore turns (1.0 and 0.0) share a mean of 0.5; the none and reflection turns are alone (mean 0)
    mr_adv = np.array([[0.5, 0.0], [-0.5, 1.0]])
    np.testing.assert_allclose(got, out + 0.5 * mr_adv, rtol=1e-6, atol=1e-6)
    # identity: weight 0 and no penalty is GRPO on the returns with every turn a row
    base = np.asarray(C.rlvmr_advantages(scores, mr, tags, ground, tm, np.zeros(2, np.int32), 1, weight=0.0,
                                         invalid_penalty=0.0))
    x = np.array([1.0, 1.0, 0.0, 0.0])
    np.testing.assert_allclose(base.ravel(), (x - x.mean()) / (x.std(ddof=1) + 1e-6), rtol=1e-5)
