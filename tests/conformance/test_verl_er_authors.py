"""VERL's effective-rank shaping (METHODS.md #166) against the authors' code: a transcription of
``hf618/VERL`` @3de68f1 --

* ``verl/trainer/metrics_utils.py``: ``compute_single_effective_rank`` (``method='full'``, the
  whole-response rank) and ``calculate_diffs_for_single_sample_optimized`` (the incremental Gram
  matrix of growing prefixes, its eigenvalues, the velocity and acceleration);
* ``verl/trainer/metrics_calculator.py``: ``calculate_metric_diff`` / ``_aggregate_diffs`` (each
  response's masked states, the mean of its per-checkpoint values, 0 without any);
* ``verl/trainer/reward_manager_versions.py``: ``RewardManager.__call__``'s ``PlanB`` signal with
  ``aux_fix=True``, the baseline ``mids`` moved after the signal with the previous step's means;
* ``verl/trainer/ppo/ray_trainer.py``: ``compute_advantage``'s ``add_adv`` shaping on the aux
  reward (the signal at the response's last token);

run on random hidden states and over several steps of the loop part's rule. The code computes in
float32 (and keeps the ranks and rewards in bfloat16); the transcription runs its arithmetic in
float64, so that both sides are compared with the rounding of neither.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import jaxrl_llm.core as C  # noqa: E402
from jaxrl_llm.training.parts.verl_er import VerlEffectiveRank  # noqa: E402

NAMES = ["Effective Rank diff 2", "Effective Rank diff", "Effective Rank"]


def their_effective_rank(hidden):  # compute_single_effective_rank(..., log_output=False, method='full')[0]
    if hidden.size(0) < 2:
        return 0.0
    centered = hidden - hidden.mean(dim=0, keepdim=True)
    s = torch.linalg.svdvals(centered)
    p = s / (s.sum() + 1e-8)
    return torch.exp(-torch.sum(p * torch.log(p + 1e-8))).item()


def their_diffs(valid_hidden, max_seq_len, stride):  # calculate_diffs_for_single_sample_optimized, ER only
    valid_len = valid_hidden.size(0)
    if valid_len > max_seq_len:
        valid_hidden = valid_hidden[-max_seq_len:]
        valid_len = max_seq_len
    d1, d2 = [], []
    if valid_len < 2 * stride:
        return d1, d2
    history_sum, history_count, prev_diff = 0.0, 0, None
    s = torch.zeros(1, valid_hidden.shape[1], dtype=valid_hidden.dtype)
    u, h_old = None, None
    for t in range(stride, valid_len, stride):
        window = valid_hidden[:t + 1]
        new_chunk = window[len(h_old) if h_old is not None else 0:]
        s = s + new_chunk.sum(dim=0, keepdim=True)
        if u is None:
            u = new_chunk @ new_chunk.T
        else:
            c12 = h_old @ new_chunk.T
            c22 = new_chunk @ new_chunk.T
            u = torch.cat([torch.cat([u, c12], dim=1), torch.cat([c12.T, c22], dim=1)], dim=0)
        k = window.shape[0]
        mean_vec = s / k
        hs_t = window @ s.T / k
        ones = torch.ones((k, 1), dtype=window.dtype)
        g = u - hs_t @ ones.T - ones @ hs_t.T + mean_vec @ mean_vec.T
        sv = torch.sqrt(torch.relu(torch.linalg.eigvalsh(g)))
        p = sv / (sv.sum() + 1e-8)
        current = torch.exp(-torch.sum(p * torch.log(p + 1e-8))).item()
        if history_count > 0:
            diff = current - history_sum / history_count
            d1.append(diff)
            if prev_diff is not None:
                d2.append(diff - prev_diff)
            prev_diff = diff
        history_sum += current
        history_count += 1
        h_old = window
    return d1, d2


def their_stats(hidden, mask, max_seq_len, stride):
    """[N, 3] (ER, ERV, ERA) as the calculator reports them per response."""
    out = []
    for i in range(hidden.shape[0]):
        vh = torch.tensor(hidden[i][mask[i]], dtype=torch.float64)
        d1, d2 = their_diffs(vh, max_seq_len, stride) if vh.size(0) >= 2 else ([], [])
        out.append([their_effective_rank(vh), float(np.mean(d1)) if d1 else 0.0, float(np.mean(d2)) if d2 else 0.0])
    return np.array(out)


class TheirRewardManager:
    """``RewardManager.__call__``'s aux signal (``PlanB``, ``aux_fix=True``), per step."""

    def __init__(self, ema_alpha, gain, weight):
        self.ema_alpha, self.gain, self.weight, self.eps = ema_alpha, gain, weight, 1e-8
        self.mids = {n: 0.0 for n in NAMES}
        self.w_explore, self.w_exploit = [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]

    def __call__(self, indicators, metrics_old):  # indicators: {name: [N]}
        n = len(indicators[NAMES[0]])
        aux = np.zeros(n)
        if not metrics_old:
            return aux
        for i in range(n):
            dev = np.clip((indicators[NAMES[0]][i] - self.mids[NAMES[0]]) / (abs(self.mids[NAMES[0]]) + self.eps), -5, 5)
            tendency = 1 / (1 + np.exp(-self.gain * dev))
            weights = [tendency * a + (1 - tendency) * b for a, b in zip(self.w_explore, self.w_exploit)]
            total = 0.0
            for name, w in zip(NAMES, weights):
                rel = np.clip((indicators[name][i] - self.mids[name]) / (abs(self.mids[name]) + self.eps), -5, 5)
                total += np.tanh(rel) * w
            aux[i] = total * self.weight
        for name in NAMES:
            key = f"cal/overall/layer_1/{name}/mean"
            if key in metrics_old:
                self.mids[name] = (1 - self.ema_alpha) * self.mids[name] + self.ema_alpha * metrics_old[key]
        return aux


def their_shaping(adv0, aux, mask, kappa):  # compute_advantage's add_adv branch
    aux_t = np.zeros_like(adv0)
    last = mask.shape[1] - 1 - np.argmax(mask[:, ::-1], axis=1)
    for i in range(len(aux)):
        if mask[i].any():
            aux_t[i, last[i]] = aux[i]
    bonus = np.maximum(aux_t, 0.0)
    return adv0 + np.minimum(bonus, np.abs(adv0) / kappa) * mask


@pytest.mark.parametrize("stride,max_len,offset", [(3, 512, 0.0), (2, 9, 4.0), (4, 30, -2.5)])
def test_rank_velocity_acceleration_equal_the_code(stride, max_len, offset):
    rng = np.random.default_rng(stride)
    n, t, d = 6, 21, 24
    hidden = (rng.normal(size=(n, t, d)) + offset).astype(np.float32)
    lengths = [21, 17, 2 * stride, 2 * stride + 1, 1, 0]
    mask = np.arange(t)[None] < np.array(lengths)[:, None]
    want = their_stats(hidden.astype(np.float64), mask, max_len, stride)
    er, erv, era = C.effective_rank_dynamics(hidden, mask, stride=stride, max_len=max_len)
    got = np.stack([er, erv, era], -1)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def test_long_padded_rows_with_a_decaying_spectrum_equal_the_code():
    """Realistic widths: 300 states of a spectrum falling as 1 / i (many small singular values)
    in a batch padded to 700 positions, the last 256 kept for the dynamics, the released stride."""
    rng = np.random.default_rng(11)
    n, t, d, k = 2, 700, 128, 300
    u, _ = np.linalg.qr(rng.normal(size=(k, k)))
    v, _ = np.linalg.qr(rng.normal(size=(d, d)))
    hidden = np.zeros((n, t, d), np.float32)
    mask = np.zeros((n, t), bool)
    for i, length in enumerate([k, 290]):
        states = (u[:, :d] * (3.0 / np.arange(1, d + 1))) @ v.T + 0.5
        hidden[i, :length] = states[:length]
        mask[i, :length] = True
    want = their_stats(hidden.astype(np.float64), mask, 256, 40)
    er, erv, era = C.effective_rank_dynamics(hidden, mask, stride=40, max_len=256)
    np.testing.assert_allclose(np.stack([er, erv, era], -1), want, rtol=2e-3, atol=2e-3)


def test_signal_baseline_and_shaping_over_steps_equal_the_code():
    rng = np.random.default_rng(7)
    part = VerlEffectiveRank(gain=2.0, weight=1.0, ema=0.3, kappa=2.0)
    theirs = TheirRewardManager(ema_alpha=0.3, gain=2.0, weight=1.0)
    metrics_old = {}
    for step in range(5):
        n, t = 8, 6
        stats = np.stack([rng.uniform(5, 15, n), rng.normal(1, 1, n), rng.normal(0, 0.5, n)], -1)
        mask = np.arange(t)[None] < rng.integers(1, t + 1, n)[:, None]
        adv0 = np.repeat(rng.normal(size=(n, 1)), t, 1) * mask
        indicators = {NAMES[0]: stats[:, 2], NAMES[1]: stats[:, 1], NAMES[2]: stats[:, 0]}
        aux = theirs(indicators, metrics_old)
        want = their_shaping(adv0, aux, mask, 2.0)
        got, metrics = part.advance(stats, np.ones(n, bool), adv0.astype(np.float32), mask)
        if step == 0:
            assert got is None and not aux.any()
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(metrics["verl_er/bonus"], aux.mean(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(part.baseline, [theirs.mids[k] for k in NAMES], rtol=1e-12)
        metrics_old = {f"cal/overall/layer_1/{name}/mean": float(np.mean(v)) for name, v in indicators.items()}
