"""Numerical parity of ``jaxrl_llm.core.preference`` with TRL 1.16's own loss code.

One oracle subprocess (``trl_oracle.py`` under the peer interpreter) evaluates every case in
float64 torch from the same float32 inputs; we compute in float32 JAX and compare per-pair
losses, rewards, TRL's logged metrics and the gradient of the mean loss w.r.t. the chosen and
rejected log-probs to ``atol = rtol = 1e-5``. Inputs: several seeds, ``B = 16``, pairs with a
zero margin (both log-ratios 0; equal non-zero log-ratios), large positive and negative
margins, length-1 completions, ORPO averages on both sides of ``-log 2`` and near 0, KTO
batches with one class only and with a negative KL estimate (clamped to 0).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.core import preference as P

pytestmark = pytest.mark.conformance

ROOT = Path(__file__).resolve().parents[2]
ORACLE = Path(__file__).with_name("trl_oracle.py")
TOL = dict(atol=1e-5, rtol=1e-5)
B = 16
SEEDS = (0, 1, 2)


def _peer_python() -> str:
    exe = os.environ.get("JAXRL_LLM_PEER_PYTHON", str(ROOT / ".venv-peers" / "bin" / "python"))
    if not Path(exe).exists():
        msg = f"peer interpreter {exe} not found (set JAXRL_LLM_PEER_PYTHON or run scripts/setup_peers.sh)"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return exe


# ------------------------------------------------------------------------------ inputs


def _dataset(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    f32 = np.float32
    c = -rng.uniform(1.0, 150.0, B)
    r = -rng.uniform(1.0, 150.0, B)
    rc = c + rng.normal(0.0, 3.0, B)
    rr = r + rng.normal(0.0, 3.0, B)
    # zero margin, both log-ratios zero
    rc[0], rr[0] = c[0], r[0]
    # zero margin with equal non-zero log-ratios (exact in float32, so no precision tie-break)
    c[1], rc[1], r[1], rr[1] = -40.5, -42.0, -60.25, -61.75
    # large margins: beta * (c - r) = +-30 at beta = 0.1
    rc[2], rr[2] = c[2] - 150.0, r[2] + 150.0
    rc[3], rr[3] = c[3] + 150.0, r[3] - 150.0
    lc = rng.integers(1, 65, B)
    lr = rng.integers(1, 65, B)
    lc[4], lr[4] = 1, 1
    # ORPO per-token averages in (-8, -1e-4), including both sides of -log 2
    ac = -np.exp(rng.uniform(np.log(1e-4), np.log(8.0), B))
    ar = -np.exp(rng.uniform(np.log(1e-4), np.log(8.0), B))
    ac[0], ar[0] = -np.log(2.0), -np.log(2.0) - 1e-3
    ac[1], ar[1] = -1e-4, -5.0
    ac[2], ar[2] = -6.0, -2e-4
    # KTO: labels, mismatched-completion log-probs (positive and negative KL estimates)
    label = rng.random(B) < 0.5
    label[0], label[1] = True, False
    klp = -rng.uniform(10.0, 100.0, B)
    klr = klp - rng.normal(0.5 if seed != 1 else -0.5, 1.0, B)
    d = dict(c=c, r=r, rc=rc, rr=rr, ac=ac, ar=ar, klp=klp, klr=klr)
    d = {k: np.asarray(v, f32) for k, v in d.items()}
    d.update(lc=lc.astype(np.int32), lr=lr.astype(np.int32), label=label,
             label_all=np.ones(B, bool))
    return d


DATA = {f"s{s}": _dataset(s) for s in SEEDS}
# log-ratios as the "logps" of a reference-free loss: TRL's CPO sigmoid with label smoothing
# on them is exactly conservative DPO (TRL 1.16's DPO 'sigmoid' ignores label_smoothing).
for _s in SEEDS:
    _d = DATA[f"s{_s}"]
    DATA[f"s{_s}lr"] = dict(c=_d["c"] - _d["rc"], r=_d["r"] - _d["rr"])


# ------------------------------------------------------------------------------ cases

CASES: list[dict] = []


def _case(cid: str, trainer: str, data: str, **settings) -> None:
    CASES.append(dict(id=cid, trainer=trainer, data=data, **settings))


DPO_SETTINGS = [
    ("sigmoid", dict(beta=0.1)),
    ("sigmoid", dict(beta=0.5)),
    ("robust", dict(beta=0.1, label_smoothing=0.0)),
    ("robust", dict(beta=0.1, label_smoothing=0.1)),
    ("ipo", dict(beta=0.1)),
    ("ipo", dict(beta=0.5)),
    ("hinge", dict(beta=0.1)),
    ("sppo_hard", dict(beta=0.1)),
    ("nca_pair", dict(beta=0.1)),
    ("exo_pair", dict(beta=0.1, label_smoothing=1e-3)),
    ("exo_pair", dict(beta=0.1, label_smoothing=0.2)),
    ("bco_pair", dict(beta=0.1)),
    ("apo_zero", dict(beta=0.1)),
    ("apo_down", dict(beta=0.1)),
    ("sigmoid_norm", dict(beta=0.1)),
    ("discopop", dict(beta=0.1, discopop_tau=0.05)),
]
CPO_SETTINGS = [
    ("sigmoid", dict(beta=0.1)),
    ("sigmoid", dict(beta=0.1, label_smoothing=0.1)),
    ("hinge", dict(beta=0.1)),
    ("ipo", dict(beta=0.1)),
    ("simpo", dict(beta=2.0, simpo_gamma=0.5)),
    ("simpo", dict(beta=0.1, simpo_gamma=0.5)),
    ("simpo", dict(beta=2.5, simpo_gamma=1.4, label_smoothing=0.1)),
    ("simpo", dict(beta=2.0, simpo_gamma=0.5, alpha=0.25)),  # AlphaPO
]
for _s in SEEDS:
    _k = f"s{_s}"
    for _i, (_lt, _st) in enumerate(DPO_SETTINGS):
        _case(f"dpo-{_lt}-{_i}-{_k}", "dpo", _k, loss_type=_lt, **_st)
    for _i, (_lt, _st) in enumerate(CPO_SETTINGS):
        _case(f"cpo-{_lt}-{_i}-{_k}", "cpo", _k, loss_type=_lt, **_st)
    for _eps in (0.1, 0.5):
        _case(f"cdpo-{_eps}-{_k}", "cpo", _k + "lr", loss_type="sigmoid", beta=0.1, label_smoothing=_eps)
    for _beta in (0.1, 1.0):
        _case(f"orpo-{_beta}-{_k}", "orpo", _k, beta=_beta)
    _case(f"kto-default-{_k}", "kto", _k, beta=0.1, label_key="label")
    _case(f"kto-weighted-{_k}", "kto", _k, beta=0.5, desirable_weight=1.0, undesirable_weight=1.33,
          label_key="label")
    _case(f"kto-alldesirable-{_k}", "kto", _k, beta=0.1, label_key="label_all")


# ------------------------------------------------------------------------------ ours


def _ours(case: dict):
    """Return ``(fn(chosen, rejected) -> PreferenceOutput, chosen, rejected)`` for a case."""
    d = DATA[case["data"]]
    t = case["trainer"]
    if t == "dpo":
        kw = {k: case[k] for k in ("beta", "label_smoothing", "discopop_tau") if k in case}

        def fn(c, r):
            return P.dpo_loss(c, r, d["rc"], d["rr"], d["lc"], d["lr"], loss_type=case["loss_type"], **kw)

        return fn, d["c"], d["r"]
    if t == "cpo":
        eps = case.get("label_smoothing", 0.0)
        alpha = case.get("alpha", 0.0)
        if case["loss_type"] == "simpo":
            def fn(c, r):
                return P.simpo_loss(c, r, d["lc"], d["lr"], beta=case["beta"], gamma=case["simpo_gamma"],
                                    label_smoothing=eps, alpha=alpha)
        elif case["id"].startswith("cdpo"):
            base = DATA[case["data"][:-2]]

            def fn(c, r):  # c, r are the policy logps; the oracle saw the log-ratios
                return P.dpo_loss(c, r, base["rc"], base["rr"], beta=case["beta"], label_smoothing=eps)

            return fn, base["c"], base["r"]
        else:
            lengths = (d["lc"], d["lr"]) if case["loss_type"] == "ipo" else (None, None)

            def fn(c, r):
                return P.cpo_loss(c, r, *lengths, beta=case["beta"], label_smoothing=eps,
                                  loss_type=case["loss_type"], alpha=alpha)
        return fn, d["c"], d["r"]
    if t == "orpo":
        return (lambda c, r: P.orpo_loss(c, r, beta=case["beta"])), d["ac"], d["ar"]
    if t == "kto":
        z0 = P.kto_kl_reference_point(d["klp"], d["klr"])
        lab = d[case["label_key"]]

        def fn(c, r):
            del r
            return P.kto_loss(c, d["rc"], lab, z0, beta=case["beta"],
                              desirable_weight=case.get("desirable_weight", 1.0),
                              undesirable_weight=case.get("undesirable_weight", 1.0))

        return fn, d["c"], jnp.zeros_like(d["c"])
    raise AssertionError(t)


TRL_METRICS = {
    "rewards/chosen": "chosen_rewards",
    "rewards/rejected": "rejected_rewards",
    "rewards/accuracies": "reward_accuracy",
    "rewards/margins": "reward_margin",
    "logps/chosen": "chosen_logps",
    "logps/rejected": "rejected_logps",
    "kl": "kl",
    "log_odds_ratio": "log_odds_ratio",
    "log_odds_chosen": "log_odds_chosen",
}


# ------------------------------------------------------------------------------ oracle run


@pytest.fixture(scope="module")
def trl(tmp_path_factory):
    exe = _peer_python()
    tmp = tmp_path_factory.mktemp("trl_pref")
    arrays = {f"{name}/{k}": v for name, d in DATA.items() for k, v in d.items()}
    arrays["cases"] = np.asarray(json.dumps(CASES))
    inp, out = tmp / "in.npz", tmp / "out.npz"
    np.savez(inp, **arrays)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run([exe, str(ORACLE), str(inp), str(out)], capture_output=True, text=True,
                          env=env, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"TRL oracle failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    with np.load(out) as f:
        return {k: f[k] for k in f.files}


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_matches_trl(case, trl):
    cid = case["id"]
    fn, c, r = _ours(case)
    out = fn(c, r)
    ref = lambda key: trl[f"{cid}/{key}"]  # noqa: E731

    assert out.losses.dtype == jnp.float32
    np.testing.assert_allclose(out.losses, ref("losses"), **TOL, err_msg=f"{cid} losses")
    np.testing.assert_allclose(jnp.mean(out.losses), ref("loss"), **TOL, err_msg=f"{cid} loss")
    np.testing.assert_allclose(out.chosen_rewards, ref("chosen_rewards"), **TOL, err_msg=f"{cid} chosen_rewards")
    np.testing.assert_allclose(out.rejected_rewards, ref("rejected_rewards"), **TOL,
                               err_msg=f"{cid} rejected_rewards")

    gc, gr = jax.grad(lambda a, b: jnp.mean(fn(a, b).losses), argnums=(0, 1))(jnp.asarray(c), jnp.asarray(r))
    np.testing.assert_allclose(gc, ref("grad_chosen"), **TOL, err_msg=f"{cid} grad chosen")
    np.testing.assert_allclose(gr, ref("grad_rejected"), **TOL, err_msg=f"{cid} grad rejected")

    prefix = f"{cid}/m/"
    seen = [k[len(prefix):] for k in trl if k.startswith(prefix)]
    if case["trainer"] in ("dpo", "kto", "orpo"):
        assert seen, f"{cid}: no metrics from TRL"
    for name in seen:
        if name not in TRL_METRICS:
            continue
        np.testing.assert_allclose(out.metrics[TRL_METRICS[name]], trl[prefix + name], **TOL,
                                   err_msg=f"{cid} metric {name}")


def test_every_oracle_case_ran(trl):
    missing = [c["id"] for c in CASES if f"{c['id']}/losses" not in trl]
    assert not missing, missing
