"""VERL's effective-rank shaping in the loop (recipe.loop_part=verl_er, METHODS.md #166): the
ranks come from the policy's hidden states at the positions that sampled each response token, the
first step only records, later steps add the capped bonus on each row's last token, and the
state round-trips."""

import jax
import numpy as np
import pytest
from flax import nnx

from test_rl_recipes_extra import make, target_frac

from jaxrl_llm.config import ConfigError
from jaxrl_llm.training.parts.verl_er import VerlEffectiveRank


def _ranks_by_hand(tr, params, batch):
    """ER of each row's response states, from a plain forward pass and numpy's SVD."""
    model = nnx.merge(tr.graphdef, params, *tr.frozen)
    hidden, _ = model(batch["tokens"], batch["mask"])
    cm = np.asarray(batch["completion_mask"], bool)
    c0 = batch["tokens"].shape[1] - 1 - cm.shape[1]
    h = np.asarray(hidden, np.float64)[:, c0:c0 + cm.shape[1]]
    out = []
    for i in range(len(cm)):
        x = h[i][cm[i]]
        if len(x) < 2:
            out.append(0.0)
            continue
        s = np.linalg.svd(x - x.mean(0), compute_uv=False)
        p = s / (s.sum() + 1e-8)
        out.append(float(np.exp(-np.sum(p * np.log(p + 1e-8)))))
    return np.array(out)


def test_ranks_first_step_records_later_steps_shape_the_last_token():
    tr = make("grpo", g=4, reward=[target_frac], loop_part={"name": "verl_er", "stride": 1})
    part = tr.parts.get("recipe.loop_part=verl_er")
    before = jax.device_get(tr.state.params)
    m1 = tr.step()
    b1 = tr.last_batch
    # the ranks are those of the sampling policy's states at the positions that sampled each token
    want = _ranks_by_hand(tr, before, b1)
    assert abs(m1["verl_er/er"] - want[np.asarray(b1["valid"], bool)].mean()) < 1e-3
    # step 1: nothing to compare with yet
    assert m1["verl_er/shaped"] == 0.0 and m1["verl_er/bonus"] == 0.0 and part.previous is not None
    assert part.baseline == [0.0, 0.0, 0.0]
    m2 = tr.step()
    b2 = tr.last_batch
    assert m2["verl_er/shaped"] > 0
    # the baseline moved to 0.3 x step 1's means
    np.testing.assert_allclose(part.baseline, [0.3 * m1["verl_er/era"], 0.3 * m1["verl_er/erv"],
                                               0.3 * m1["verl_er/er"]], rtol=1e-9)
    # GRPO's advantage is constant over a row; only the last trained token moved, up, by <= |A| / 2
    lm, adv = np.asarray(b2["loss_mask"], bool), np.asarray(b2["advantages"])
    moved = 0
    for i in range(len(lm)):
        cols = np.flatnonzero(lm[i])
        if len(cols) < 2:
            continue
        base, last = adv[i, cols[0]], adv[i, cols[-1]]
        assert np.all(adv[i, cols[:-1]] == base)
        assert 0.0 <= last - base <= abs(base) / 2 + 1e-6
        moved += last != base
    assert moved > 0


def test_state_round_trips_and_continues_identically():
    rng = np.random.default_rng(0)
    a = VerlEffectiveRank(ema=0.5, kappa=3.0)
    mask = np.ones((4, 3), bool)
    adv = rng.normal(size=(4, 3)).astype(np.float32)
    for _ in range(2):
        a.advance(rng.uniform(1, 5, (4, 3)), np.ones(4, bool), adv, mask)
    b = VerlEffectiveRank(ema=0.5, kappa=3.0)
    b.load_state_dict(a.state_dict())
    stats = rng.uniform(1, 5, (4, 3))
    ga, ma = a.advance(stats, np.ones(4, bool), adv, mask)
    gb, mb = b.advance(stats, np.ones(4, bool), adv, mask)
    np.testing.assert_array_equal(ga, gb)
    assert ma == mb and a.state_dict() == b.state_dict()
    # rows that do not take part are never shaped and leave the means alone
    c = VerlEffectiveRank()
    c.load_state_dict(a.state_dict())
    valid = np.array([True, True, False, False])
    out, m = c.advance(stats, valid, adv, mask)
    np.testing.assert_array_equal(out[2:], adv[2:])
    assert m["verl_er/er"] == pytest.approx(stats[:2, 0].mean())


@pytest.mark.parametrize("kw,msg", [({"stride": 0}, "stride must be an int >= 1"),
                                    ({"max_len": 1}, "max_len must be an int >= 2"),
                                    ({"ema": 1.5}, "ema must be in"), ({"kappa": 0}, "kappa must be a number > 0"),
                                    ({"at": "first"}, "at must be 'last'"), ({"gain": -1}, "gain must be")])
def test_bad_settings_are_refused(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        VerlEffectiveRank(**kw)
