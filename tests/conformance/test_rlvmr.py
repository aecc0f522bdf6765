"""RLVMR (METHODS.md #239) against the authors' code: transcriptions of
``process_trajectory_rlvmr_rewards``, ``episode_norm_reward`` and ``step_norm_reward_by_tag``
(``RLVMR/code/rlvmr/core_rlvmr.py``) and of the invalid-action penalty of ``ray_trainer.py``
(``Tencent/DigitalHuman``, read at the mirror ``zzjweb/digitalhuman`` @789ccd6), run on random
tagged episodes with every turn a step row; against our turn rewards, tags and advantages."""

import re
import types
from collections import defaultdict

import numpy as np
import pytest

import jaxrl_llm.core as C
from jaxrl_llm.training.agent_loop import rlvmr_turn_rewards

TAGS = {"none": 0, "<planning>": 1, "<explore>": 2, "<reflection>": 3}


def their_rule_rewards(trajectory, success, planning=1.0, exploration=1.0, reflection=1.0):
    for step_idx, step in enumerate(trajectory):
        out, ok = step["full_output"], step["is_action_valid"]
        step["tag"], step["r"] = "none", 0.0
        if not ok:
            continue
        if "<planning>" in out:
            step["tag"], step["r"] = "<planning>", planning if success else 0.0
        elif "<explore>" in out:
            cur = re.findall(r"<action>(.*?)</action>", out)
            repeated = any(re.findall(r"<action>(.*?)</action>", trajectory[j]["full_output"]) == cur
                           and trajectory[j]["is_action_valid"] for j in range(step_idx))
            step["tag"], step["r"] = "<explore>", 0.0 if repeated else exploration
        elif "<reflection>" in out:
            cur = re.findall(r"<action>(.*?)</action>", out)
            if step_idx > 0:
                prev_valid = trajectory[step_idx - 1]["is_action_valid"]
                prev = re.findall(r"<action>(.*?)</action>", trajectory[step_idx - 1]["full_output"])
            else:
                prev, prev_valid = "", False
            step["tag"], step["r"] = "<reflection>", reflection if (not prev_valid and not prev == cur) else 0.0


def their_norm(values, keys, epsilon=1e-6):
    by = defaultdict(list)
    for v, k in zip(values, keys):
        by[k].append(v)
    stats = {k: (0.0, 1.0) if len(v) == 1 else (np.mean(v), np.std(v, ddof=1)) for k, v in by.items()}
    return [(v - stats[k][0]) / (stats[k][1] + epsilon) for v, k in zip(values, keys)]


def episode(rng):
    turns = rng.integers(1, 6)
    texts = []
    for _ in range(turns):
        tag = rng.choice(["<planning>", "<explore>", "<reflection>", ""])
        texts.append(f"{tag} think <action>{rng.choice(['go a', 'go b', 'take c'])}</action>")
    return texts, [bool(rng.random() < 0.75) for _ in range(turns)], float(rng.choice([0.0, 10.0]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rlvmr_rewards_and_advantages_equal_the_authors_code(seed):
    rng = np.random.default_rng(seed)
    g, groups = 4, 3
    eps = [episode(rng) for _ in range(g * groups)]
    k = max(len(e[0]) for e in eps)
    ep = types.SimpleNamespace(tokens=[[0]] * len(eps), actions=[e[0] for e in eps], grounded=[e[1] for e in eps],
                               rewards=[[0.0] * (len(e[0]) - 1) + [e[2]] for e in eps])
    r, tags = rlvmr_turn_rewards(ep, k)
    rows = []  # the authors' step rows: (group, episode, turn, score, rule reward, tag)
    for i, (texts, ok, ret) in enumerate(eps):
        traj = [{"full_output": t, "is_action_valid": v} for t, v in zip(texts, ok)]
        their_rule_rewards(traj, ret > 0)
        for t, step in enumerate(traj):
            rows.append((i // g, i, t, ret - 0.1 * (not step["is_action_valid"]), step["r"], step["tag"]))
            assert r[i, t] == step["r"] and tags[i, t] == TAGS[step["tag"]], (i, t)
    out = their_norm([x[3] for x in rows], [x[0] for x in rows])
    mr = their_norm([x[4] for x in rows], [(x[0], x[5]) for x in rows])
    turn_mask = np.zeros((len(eps), k), bool)
    for i, e in enumerate(eps):
        turn_mask[i, :len(e[0])] = True
    grounding = np.zeros((len(eps), k), np.float32)
    for i, e in enumerate(eps):
        grounding[i, :len(e[1])] = e[1]
    adv = np.asarray(C.rlvmr_advantages(np.array([e[2] for e in eps], np.float32), r, tags, grounding, turn_mask,
                                        np.repeat(np.arange(groups), g), groups, weight=1.0))
    for (grp, i, t, *_), a, b in zip(rows, out, mr):
        np.testing.assert_allclose(adv[i, t], a + b, rtol=1e-4, atol=1e-4)  # float32 stats of returns near 10
