"""TRL 1.16 oracle for the preference losses (run by the *peer* interpreter, .venv-peers).

Usage: ``python trl_oracle.py in.npz out.npz``

``in.npz`` holds float32 input arrays named ``<data>/<field>`` and, under the key ``cases``,
a JSON list of cases ``{"id", "trainer", "data", ...settings}``. For each case this script
calls TRL's own loss code on float64 torch tensors (built from the float32 inputs), with a
``types.SimpleNamespace`` standing in for the trainer (only the attributes the method reads)
and writes to ``out.npz``: ``<id>/losses``, ``<id>/chosen_rewards``, ``<id>/rejected_rewards``
(``[B]``), ``<id>/loss`` (the scalar TRL optimises, or the mean of the per-pair losses where
TRL's method returns per-pair values), ``<id>/grad_chosen`` and ``<id>/grad_rejected`` (the
gradient of that mean loss w.r.t. the summed chosen / rejected log-probs) and ``<id>/m/<name>``
for TRL's logged metrics.

Which TRL code is called:

* DPO (every ``loss_type``): TRL 1.16 has no separate DPO loss method; the loss is computed
  inline in ``DPOTrainer._compute_loss(self, model, inputs, return_outputs)``. We call that
  method unbound with a stand-in ``self`` and a stand-in ``model``: a plain function that
  returns, as a fused-LM-head output would, per-token log-probs whose row sums are the given
  sequence log-probs (the whole value on the first completion token, zeros after it), plus
  dummy ``entropy``/``mean_logits``/``is_top1`` used only for logging. Reference log-probs
  go in as precomputed (``precompute_ref_logps=True``). The completion mask has ``L`` ones per
  row so ``ipo``/``sigmoid_norm`` see the given lengths. ``_compute_loss`` returns only the
  batch mean, so the per-pair losses (local ``per_sequence_loss``) are read from the
  method's frame when it returns (``sys.setprofile``); rewards and metrics are read the same
  way / from ``self._metrics``.
* CPO (``sigmoid``/``hinge``/``ipo``/``simpo``, optional AlphaPO ``alpha``):
  ``experimental.cpo.CPOTrainer.cpo_loss(self, chosen, rejected)``. For ``ipo``/``simpo`` TRL's
  ``concatenated_forward`` averages the log-probs over the completion tokens
  (``get_batch_logps(average_log_prob=True)``, i.e. ``sum / mask.sum(-1)``); we do that
  division here, on the summed leaf tensors, so the gradient is w.r.t. the summed log-probs.
* ORPO: ``experimental.orpo.ORPOTrainer.odds_ratio_loss(self, chosen, rejected)`` on
  per-token averaged log-probs (leaves). TRL returns ``beta * logsigmoid(log_odds)`` and
  subtracts its mean; the oracle reports ``losses = -that`` (our sign convention).
* KTO: ``KTOTrainer._compute_loss`` unbound, same stand-ins as DPO (``calculate_KL=True``,
  ``precompute_ref_logps=True``, the mismatched-completion log-probs ``KL_logps`` come from
  the stand-in model, ``ref_KL_logps`` from the batch); ``_compute_kl_logps`` is bound to the
  stand-in ``self``. Per-example losses are reassembled in input order from the locals
  ``chosen_losses``/``rejected_losses`` (TRL concatenates desirable then undesirable).

Skipped: nothing among the cases the test builds. (A paired KTO has no TRL 1.16 code: the
``kto_pair`` DPO loss type was removed, so ``kto_paired_loss`` is tested only in
``tests/core``.)
"""

from __future__ import annotations

import json
import sys
import types
import warnings
from collections import defaultdict

import numpy as np
import torch

warnings.filterwarnings("ignore")

from trl.experimental.cpo.cpo_trainer import CPOTrainer  # noqa: E402
from trl.experimental.orpo.orpo_trainer import ORPOTrainer  # noqa: E402
from trl.trainer.dpo_trainer import DPOTrainer  # noqa: E402
from trl.trainer.kto_trainer import KTOTrainer  # noqa: E402

DT = torch.float64
DEVICE = torch.device("cpu")


def _accelerator():
    ident = lambda x: x  # noqa: E731  (single process: gather is the identity)
    return types.SimpleNamespace(device=DEVICE, gather=ident, gather_for_metrics=ident)


def _call_capturing(fn, *args):
    """Call ``fn(*args)`` and return ``(result, locals of fn's frame at its return)``."""
    code = fn.__code__
    captured: dict = {}

    def profiler(frame, event, arg):
        if event == "return" and frame.f_code is code:
            captured.update(frame.f_locals)

    old = sys.getprofile()
    sys.setprofile(profiler)
    try:
        out = fn(*args)
    finally:
        sys.setprofile(old)
    return out, captured


def _fake_outputs(log_probs):
    n, t = log_probs.shape
    return types.SimpleNamespace(
        log_probs=log_probs,
        entropy=torch.zeros(n, t, dtype=DT),
        mean_logits=torch.zeros(n, t, dtype=DT),
        is_top1=torch.zeros(n, t, dtype=torch.bool),
    )


def _per_token(seq_logps, width):
    """``[N, width]`` per-token log-probs: the sequence value on the first token, zeros after."""
    pad = torch.zeros(seq_logps.shape[0], width - 1, dtype=DT)
    return torch.cat([seq_logps[:, None], pad], dim=1)


def _metrics_of(self_ns, mode="train"):
    return {k: float(v[-1]) for k, v in self_ns._metrics[mode].items() if len(v) and k != "num_tokens"}


def _t(x):
    return torch.tensor(np.asarray(x, np.float64), dtype=DT)


def run_dpo(case, d):
    c, r = _t(d["c"]).requires_grad_(), _t(d["r"]).requires_grad_()
    lc = np.asarray(d["lc"]).astype(np.int64)
    lr = np.asarray(d["lr"]).astype(np.int64)
    b = c.shape[0]
    lengths = np.concatenate([lc, lr])
    width = int(max(lengths.max(), 1))
    completion_mask = torch.zeros(2 * b, width + 1, dtype=torch.long)
    for i, n in enumerate(lengths):
        completion_mask[i, 1:1 + n] = 1
    inputs = {
        "input_ids": torch.zeros(2 * b, width + 1, dtype=torch.long),
        "attention_mask": torch.ones(2 * b, width + 1, dtype=torch.long),
        "completion_mask": completion_mask,
        "ref_chosen_logps": _t(d["rc"]),
        "ref_rejected_logps": _t(d["rr"]),
    }
    log_probs = _per_token(torch.cat([c, r]), width)

    def model(**kw):
        assert kw["input_ids"].shape == (2 * b, width + 1)
        return _fake_outputs(log_probs)

    ns = types.SimpleNamespace(
        model=types.SimpleNamespace(training=True),
        accelerator=_accelerator(),
        aux_loss_enabled=False,
        ld_alpha=None,
        precompute_ref_logps=True,
        f_divergence_type="reverse_kl",
        f_alpha_divergence_coef=1.0,
        loss_types=[case["loss_type"]],
        loss_weights=[1.0],
        beta=case["beta"],
        label_smoothing=case.get("label_smoothing", 0.0),
        use_weighting=False,
        args=types.SimpleNamespace(discopop_tau=case.get("discopop_tau", 0.05),
                                   gradient_checkpointing_kwargs=None),
        _metrics=defaultdict(lambda: defaultdict(list)),
        _total_train_tokens=0,
        _tp_size=1,
    )
    loss, loc = _call_capturing(DPOTrainer._compute_loss, ns, model, inputs, False)
    loss.backward()
    return dict(
        loss=loss.detach(),
        losses=loc["per_sequence_loss"].detach(),
        chosen_rewards=loc["chosen_rewards"].detach(),
        rejected_rewards=loc["rejected_rewards"].detach(),
        grad_chosen=c.grad,
        grad_rejected=r.grad,
        metrics=_metrics_of(ns),
    )


def run_cpo(case, d):
    c, r = _t(d["c"]).requires_grad_(), _t(d["r"]).requires_grad_()
    cc, rr = c, r
    if case["loss_type"] in ("ipo", "simpo"):  # get_batch_logps(average_log_prob=True)
        cc, rr = c / _t(d["lc"]), r / _t(d["lr"])
    ns = types.SimpleNamespace(
        alpha=case.get("alpha", 0.0),
        beta=case["beta"],
        loss_type=case["loss_type"],
        simpo_gamma=case.get("simpo_gamma", 0.5),
        label_smoothing=case.get("label_smoothing", 0.0),
        accelerator=_accelerator(),
    )
    losses, cr, rw = CPOTrainer.cpo_loss(ns, cc, rr)
    loss = losses.mean()
    loss.backward()
    return dict(loss=loss.detach(), losses=losses.detach(), chosen_rewards=cr, rejected_rewards=rw,
                grad_chosen=c.grad, grad_rejected=r.grad, metrics={})


def run_orpo(case, d):
    c, r = _t(d["ac"]).requires_grad_(), _t(d["ar"]).requires_grad_()
    ns = types.SimpleNamespace(beta=case["beta"], accelerator=_accelerator())
    losses, cr, rw, log_odds_ratio, log_odds_chosen = ORPOTrainer.odds_ratio_loss(ns, c, r)
    ours_sign = -losses  # TRL's total is nll - losses.mean()
    loss = ours_sign.mean()
    loss.backward()
    return dict(loss=loss.detach(), losses=ours_sign.detach(), chosen_rewards=cr, rejected_rewards=rw,
                grad_chosen=c.grad, grad_rejected=r.grad,
                metrics={"log_odds_ratio": float(log_odds_ratio), "log_odds_chosen": float(log_odds_chosen)})


def run_kto(case, d):
    p = _t(d["c"]).requires_grad_()
    b = p.shape[0]
    label = torch.as_tensor(np.asarray(d[case["label_key"]]).astype(bool))
    inputs = {
        "input_ids": torch.zeros(b, 2, dtype=torch.long),
        "attention_mask": torch.ones(b, 2, dtype=torch.long),
        "completion_mask": torch.tensor([[0, 1]] * b, dtype=torch.long),
        "KL_input_ids": torch.zeros(b, 3, dtype=torch.long),
        "KL_attention_mask": torch.ones(b, 3, dtype=torch.long),
        "KL_completion_mask": torch.tensor([[0, 1, 1]] * b, dtype=torch.long),
        "label": label,
        "ref_logps": _t(d["rc"]),
        "ref_KL_logps": _t(d["klr"]),
    }
    kl_policy = _t(d["klp"])

    def model(**kw):
        if kw["input_ids"].shape[1] == 3:  # the mismatched (KL) completions
            return _fake_outputs(_per_token(kl_policy, 2))
        return _fake_outputs(_per_token(p, 1))

    ns = types.SimpleNamespace(
        model=types.SimpleNamespace(training=True),
        accelerator=_accelerator(),
        calculate_KL=True,
        precompute_ref_logps=True,
        aux_loss_enabled=False,
        loss_type="kto",
        beta=case["beta"],
        desirable_weight=case.get("desirable_weight", 1.0),
        undesirable_weight=case.get("undesirable_weight", 1.0),
        args=types.SimpleNamespace(gradient_checkpointing_kwargs=None),
        _metrics=defaultdict(lambda: defaultdict(list)),
        _total_train_tokens=0,
        _tp_size=1,
    )
    ns._compute_kl_logps = types.MethodType(KTOTrainer._compute_kl_logps, ns)
    loss, loc = _call_capturing(KTOTrainer._compute_loss, ns, model, inputs, False)
    loss.backward()
    losses = torch.zeros(b, dtype=DT)
    chosen_rewards = torch.zeros(b, dtype=DT)
    rejected_rewards = torch.zeros(b, dtype=DT)
    ci, ri = loc["chosen_idx"], loc["rejected_idx"]
    if len(ci):
        losses[ci] = ns.desirable_weight * loc["chosen_losses"].detach()
        chosen_rewards[ci] = loc["chosen_rewards"]
    if len(ri):
        losses[ri] = ns.undesirable_weight * loc["rejected_losses"].detach()
        rejected_rewards[ri] = loc["rejected_rewards"]
    metrics = _metrics_of(ns)
    return dict(loss=loss.detach(), losses=losses, chosen_rewards=chosen_rewards,
                rejected_rewards=rejected_rewards, grad_chosen=p.grad,
                grad_rejected=torch.zeros(b, dtype=DT), metrics=metrics)


RUNNERS = {"dpo": run_dpo, "cpo": run_cpo, "orpo": run_orpo, "kto": run_kto}


def main(inp: str, out: str) -> None:
    data = np.load(inp)
    cases = json.loads(str(data["cases"]))
    results: dict[str, np.ndarray] = {}
    for case in cases:
        prefix = case["data"] + "/"
        d = {k[len(prefix):]: data[k] for k in data.files if k.startswith(prefix)}
        res = RUNNERS[case["trainer"]](case, d)
        cid = case["id"]
        for key in ("loss", "losses", "chosen_rewards", "rejected_rewards", "grad_chosen", "grad_rejected"):
            v = res[key]
            results[f"{cid}/{key}"] = np.asarray(v.detach().numpy() if torch.is_tensor(v) else v, np.float64)
        for name, v in res["metrics"].items():
            results[f"{cid}/m/{name}"] = np.asarray(v, np.float64)
    np.savez(out, **results)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
