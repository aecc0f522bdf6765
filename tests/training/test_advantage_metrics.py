"""The per-step advantage metrics of the RL loop: lengths of the responses pushed down / up and the
fraction of responses with no advantage (hand-computed)."""

from types import SimpleNamespace

import numpy as np
import pytest

from jaxrl_llm.training.loop import RLTrainer


def test_advantage_metrics_by_hand():
    # prompt of 2 tokens: advantages are target-aligned, the response's start at column prompt_len - 1
    adv = np.zeros((4, 6), np.float32)
    adv[0, 1:4] = -1.0   # 3 tokens, pushed down
    adv[1, 1:3] = 2.0    # 2 tokens, pushed up
    adv[2, 1:5] = 0.0    # 4 tokens, no advantage (a group without a spread)
    adv[3, 1:2] = 5.0    # an invalid (padding) row
    cmask = np.zeros((4, 5), bool)
    cmask[0, :3] = cmask[1, :2] = cmask[2, :4] = True
    step = SimpleNamespace(arrays={"advantages": adv}, prompt_len=2, completion_mask=cmask)
    m = RLTrainer.advantage_metrics(step)
    assert m["response/length_mean_neg_adv"] == 3.0
    assert m["response/length_mean_pos_adv"] == 2.0
    assert m["advantages/zero_frac"] == pytest.approx(1 / 3)
    assert m["advantages/mean"] == pytest.approx((-3 + 4) / 9)


def test_advantage_metrics_leave_out_an_empty_side():
    adv = np.ones((2, 4), np.float32)
    cmask = np.ones((2, 3), bool)
    m = RLTrainer.advantage_metrics(SimpleNamespace(arrays={"advantages": adv}, prompt_len=2, completion_mask=cmask))
    assert "response/length_mean_neg_adv" not in m and m["response/length_mean_pos_adv"] == 3.0
    assert m["advantages/zero_frac"] == 0.0
