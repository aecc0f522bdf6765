"""TRL 1.16 oracle for the GRPO-family losses (run by the *peer* interpreter, .venv-peers).

Usage: ``python trl_grpo_oracle.py cases.pkl out.pkl`` (see ``peer.run_oracle``). ``cases.pkl``
holds a list of dicts ``{"id", "trainer", ...settings, ...numpy arrays}``; the output maps each
id to ``{"loss", "grad", "metrics"}`` (or ``{"error"}``). Only TRL's own code computes the
numbers; this file only adapts arguments.

Which TRL code is called:

* ``trainer="grpo"``: ``trl.trainer.grpo_trainer.GRPOTrainer._compute_loss(self, model, inputs)``
  called unbound with a ``types.SimpleNamespace`` standing in for the trainer. It holds the
  attributes the method reads (``beta``, ``epsilon_low``/``epsilon_high``, ``loss_type``,
  ``importance_sampling_level``, ``max_completion_length``, ``args.delta``/
  ``args.use_bias_correction_kl``/``args.sapo_temperature_*``/``args.steps_per_generation``,
  ``use_vllm``/``vllm_importance_sampling_correction``, ``off_policy_mask_threshold``, a
  single-process accelerator whose ``gather``/``reduce`` are the identity, ``_metrics``...).
  ``_get_per_token_logps_and_entropies`` is replaced by a function that returns the case's
  log-probs as a float64 leaf tensor with ``requires_grad=True`` (plus zero entropies) instead
  of running a model; ``get_off_policy_mask`` is TRL's own static method. The gradient is
  ``loss.backward()`` w.r.t. that leaf.
* ``trainer="gmpo"``: ``trl.experimental.gmpo.GMPOTrainer._compute_loss`` with the same stand-ins.

The trainer's logged metrics (``self._metrics["train"]``, last value of each) are returned too.
Tensors are float64, the completion / tool masks int64 as in TRL.
"""

from __future__ import annotations

import types
import warnings
from collections import defaultdict

import numpy as np
import torch
from oracle_io import serve

warnings.filterwarnings("ignore")

from trl.experimental.gmpo.gmpo_trainer import GMPOTrainer  # noqa: E402
from trl.trainer.grpo_trainer import GRPOTrainer  # noqa: E402

DT = torch.float64


def t(x, dtype=DT):
    return torch.tensor(np.asarray(x), dtype=dtype)


def _accelerator():
    ident = lambda x, *a, **k: x  # noqa: E731  (single process: gather / reduce are the identity)
    return types.SimpleNamespace(device=torch.device("cpu"), num_processes=1, gather=ident,
                                 gather_for_metrics=ident, reduce=ident, sync_gradients=True)


def _trainer(c, logp_leaf):
    b, n = logp_leaf.shape

    def per_token_logps(model, input_ids, attention_mask, logits_to_keep, compute_entropy=False, **kw):
        assert logits_to_keep == n and input_ids.shape[0] == b
        return logp_leaf, torch.zeros(b, n, dtype=DT), None

    args = types.SimpleNamespace(
        delta=c.get("delta"),
        use_bias_correction_kl=c.get("bias_kl", False),
        sapo_temperature_pos=c.get("tau_pos", 1.0),
        sapo_temperature_neg=c.get("tau_neg", 1.05),
        steps_per_generation=1,
    )
    return types.SimpleNamespace(
        args=args,
        model=types.SimpleNamespace(training=True),
        accelerator=_accelerator(),
        beta=c["beta"],
        epsilon_low=c["eps_low"],
        epsilon_high=c["eps_high"],
        loss_type=c.get("loss_type", "grpo"),
        importance_sampling_level=c.get("level", "token"),
        max_completion_length=c.get("max_completion_length", n),
        top_entropy_quantile=1.0,
        aux_loss_enabled=False,
        off_policy_mask_threshold=c.get("opsm"),
        get_off_policy_mask=GRPOTrainer.get_off_policy_mask,  # staticmethod: a plain function
        use_vllm=c.get("is_ratio") is not None,
        vllm_importance_sampling_correction=c.get("is_ratio") is not None,
        current_gradient_accumulation_steps=1,
        _entropy_bonus_enabled=False,
        _get_per_token_logps_and_entropies=per_token_logps,
        _metrics=defaultdict(lambda: defaultdict(list)),
    )


def run(c):
    lp = t(c["logp"]).requires_grad_(True)
    b, n = lp.shape
    cmask = t(c["completion_mask"], torch.long)
    inputs = {
        "prompt_ids": torch.zeros(b, 2, dtype=torch.long),
        "prompt_mask": torch.ones(b, 2, dtype=torch.long),
        "completion_ids": torch.zeros(b, n, dtype=torch.long),
        "completion_mask": cmask,
        "advantages": t(c["advantages"]),  # (B,) as TRL builds it, or (B, T) (subclass form)
        "num_items_in_batch": None,
    }
    mask = cmask
    if c.get("tool_mask") is not None:
        inputs["tool_mask"] = t(c["tool_mask"], torch.long)
        mask = cmask * inputs["tool_mask"]
    # dapo / cispo normalise by the token count of the (here single-process, single-step) batch,
    # which _generate_and_score_completions puts in the batch as ``num_items_in_batch``
    inputs["num_items_in_batch"] = mask.sum()
    if c.get("old") is not None:
        inputs["old_per_token_logps"] = t(c["old"])
    if c.get("ref") is not None:
        inputs["ref_per_token_logps"] = t(c["ref"])
    if c.get("is_ratio") is not None:
        inputs["importance_sampling_ratio"] = t(c["is_ratio"])
    ns = _trainer(c, lp)
    cls = {"grpo": GRPOTrainer, "gmpo": GMPOTrainer}[c["trainer"]]
    loss = cls._compute_loss(ns, None, inputs)
    loss.backward()
    grad = lp.grad if lp.grad is not None else torch.zeros_like(lp)
    metrics = {k: float(v[-1]) for k, v in ns._metrics["train"].items() if len(v)}
    return {"loss": float(loss.detach()), "grad": grad.numpy().astype(np.float64), "metrics": metrics}


def main():
    serve(run)


if __name__ == "__main__":
    main()
