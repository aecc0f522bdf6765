"""Reference outputs from verl 0.9.1, run by the peer interpreter (.venv-peers).

Usage: ``python verl_oracle.py cases.pkl out.pkl``. ``cases.pkl`` holds a list of dicts
``{"id", "kind", ...}`` with numpy arrays; the output maps each id to a dict of numpy
arrays. Only verl's own functions compute the numbers; this file only adapts arguments.
Torch runs in float64 so that differences measure our float32 implementation.
"""

from __future__ import annotations

import types

import numpy as np
import torch
from oracle_io import serve

from verl.trainer.ppo import core_algos as ca
from verl.trainer.ppo import rollout_corr_helper as rc
from verl.utils import torch_functional as vf
from verl.workers.config import ActorConfig
from verl.workers.config.actor import PolicyLossConfig
from verl.trainer.config.algorithm import RolloutCorrectionConfig


def t(x, grad=False):
    x = torch.tensor(np.asarray(x), dtype=torch.float64)
    return x.requires_grad_(grad)


def npy(x):
    return x.detach().cpu().numpy().astype(np.float64) if torch.is_tensor(x) else np.asarray(x)


def actor_config(c):
    plk = dict(c.get("policy_loss", {}))
    if "rollout_correction" in plk:
        plk["rollout_correction"] = RolloutCorrectionConfig(**plk["rollout_correction"])
    pl = PolicyLossConfig(loss_mode=c.get("loss_mode", "vanilla"), **plk)
    b = c["log_prob"].shape[0]
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_mini_batch_size=b, ppo_micro_batch_size_per_gpu=b,
                       policy_loss=pl, **c.get("actor", {}))


def run(c):
    kind = c["kind"]
    if kind == "adv":
        fn = getattr(ca, c["fn"])
        args = {}
        for k, v in c["tensors"].items():
            args[k] = t(v)
        if "index" in c:
            args["index"] = np.asarray(c["index"])
        for k, v in c.get("kwargs", {}).items():
            args[k] = v
        if "config" in c:
            cfg = c["config"]
            args["config"] = types.SimpleNamespace(**cfg, get=lambda key, default=None, _c=cfg: _c.get(key, default))
        if c["fn"] == "compute_gdpo_outcome_advantage" and "gdpo_scores" in c:
            mask = args["response_mask"]
            p = 3
            args["batch"] = {"prompts": torch.zeros(mask.shape[0], p),
                             "attention_mask": torch.cat([torch.ones(mask.shape[0], p), mask], 1).long()}
            args["non_tensor_batch"] = {f"r{j}": c["gdpo_scores"][:, j] for j in range(c["gdpo_scores"].shape[1])}
            cfg = {"gdpo_reward_keys": [f"r{j}" for j in range(c["gdpo_scores"].shape[1])],
                   "gdpo_reward_weights": c.get("gdpo_weights")}
            args["config"] = types.SimpleNamespace(get=lambda key, default=None, _c=cfg: _c.get(key, default))
        adv, ret = fn(**args)
        return {"adv": npy(adv), "ret": npy(ret)}
    if kind == "policy_loss":
        cfg = actor_config(c)
        fn = ca.get_policy_loss_fn(c["loss_mode"])
        lp = t(c["log_prob"], grad=True)
        kw = dict(old_log_prob=t(c["old_log_prob"]), log_prob=lp, advantages=t(c["advantages"]),
                  response_mask=t(c["response_mask"]), loss_agg_mode=c["agg"], config=cfg)
        if c.get("rollout_is_weights") is not None:
            kw["rollout_is_weights"] = t(c["rollout_is_weights"])
        if c["loss_mode"] == "clip_cov":
            torch.manual_seed(0)
        loss, metrics = fn(**kw)
        loss.backward()
        out = {"loss": npy(loss), "grad": npy(lp.grad)}
        for k, v in metrics.items():
            out["m:" + k] = np.asarray(v, dtype=np.float64)
        return out
    if kind == "reinforce":
        cfg = actor_config(c)
        lp = t(c["log_prob"], grad=True)
        w = c.get("rollout_is_weights")
        loss, metrics = ca.compute_policy_loss_reinforce(
            rollout_log_prob=t(c["old_log_prob"]), log_prob=lp, advantages=t(c["advantages"]),
            response_mask=t(c["response_mask"]), loss_agg_mode=c["agg"], config=cfg,
            rollout_is_weights=None if w is None else t(w))
        loss.backward()
        return {"loss": npy(loss), "grad": npy(lp.grad)}
    if kind == "kl":
        lp = t(c["logprob"], grad=True)
        v = ca.kl_penalty(lp, t(c["ref_logprob"]), c["penalty"])
        total = (v * t(c["weights"])).sum()
        total.backward()
        return {"value": npy(total), "tokens": npy(v), "grad": npy(lp.grad)}
    if kind == "agg":
        x = t(c["loss_mat"], grad=True)
        v = ca.agg_loss(x, t(c["mask"]), c["mode"], **c.get("kwargs", {}))
        v.backward()
        return {"value": npy(v), "grad": npy(x.grad)}
    if kind == "value":
        vp = t(c["vpreds"], grad=True)
        loss, frac = ca.compute_value_loss(vp, t(c["returns"]), t(c["values"]), t(c["mask"]),
                                           c["cliprange_value"], c["agg"])
        loss.backward()
        return {"loss": npy(loss), "frac": npy(frac), "grad": npy(vp.grad)}
    if kind == "entropy":
        return {"value": npy(vf.entropy_from_logits(t(c["logits"])))}
    if kind == "sum_pi_sq":  # verl's engine divides the logits by the temperature first
        return {"value": npy(vf.calculate_sum_pi_squared_from_logits(t(c["logits"]) / c["temperature"]))}
    if kind == "compute_rewards":
        return {"value": npy(ca.compute_rewards(t(c["scores"]), t(c["old"]), t(c["ref"]), c["coef"]))}
    if kind == "pf_ppo":  # capture the weights verl hands to torch.multinomial
        from verl import DataProto
        seen = {}
        real = torch.multinomial

        def spy(w, n, replacement=False, **kw):
            seen["w"] = w.clone()
            return real(w, n, replacement=replacement, **kw)
        torch.multinomial = spy
        try:
            data = DataProto.from_dict(tensors={"token_level_scores": t(c["token_scores"])})
            ca.compute_pf_ppo_reweight_data(data, c["method"], c["power"])
        finally:
            torch.multinomial = real
        return {"weights": npy(seen["w"])}
    if kind == "dapo_overlong":  # DAPO reward manager with a zero task score: only the penalty
        from verl import DataProto
        from verl.workers.reward_manager.dapo import DAPORewardManager
        tok = types.SimpleNamespace(decode=lambda ids, skip_special_tokens=True: "", eos_token="</s>")
        cfg = types.SimpleNamespace(enable=True, len=c["buffer"], penalty_factor=c["factor"], log=False)
        mgr = DAPORewardManager(tok, num_examine=0, compute_score=lambda **kw: 0.0, max_resp_len=c["max_len"],
                                overlong_buffer_cfg=cfg)
        b, r = len(c["lengths"]), c["max_len"]
        attn = np.zeros((b, 2 + r), np.int64)
        attn[:, :2] = 1
        for i, n in enumerate(c["lengths"]):
            attn[i, 2:2 + n] = 1
        data = DataProto.from_dict(
            tensors={"prompts": torch.ones(b, 2, dtype=torch.long), "responses": torch.ones(b, r, dtype=torch.long),
                     "attention_mask": torch.tensor(attn)},
            non_tensors={"reward_model": np.array([{"ground_truth": ""}] * b, dtype=object),
                         "data_source": np.array(["x"] * b, dtype=object)})
        return {"value": npy(mgr(data).sum(-1))}
    if kind == "entropy_loss":
        return {"value": npy(ca.compute_entropy_loss(t(c["logits"]), t(c["mask"]), c["agg"]))}
    if kind == "rollout_is":
        w, _ = rc.compute_rollout_correction_weights(t(c["log_ratio"]), t(c["mask"]), c["level"],
                                                      c["threshold"], c.get("normalize", False))
        return {"weights": npy(w)}
    if kind == "rollout_rs":
        m, _ = rc.compute_rollout_rejection_mask(t(c["log_ratio"]), t(c["mask"]), c["mode"], c["threshold"])
        return {"mask": npy(m)}
    if kind == "bypass":
        cfg = actor_config(c)
        lp = t(c["log_prob"], grad=True)
        loss, _ = ca.compute_policy_loss_bypass_mode(
            old_log_prob=t(c["old_log_prob"]), log_prob=lp, advantages=t(c["advantages"]),
            response_mask=t(c["response_mask"]), loss_agg_mode=c["agg"], config=cfg)
        loss.backward()
        return {"loss": npy(loss), "grad": npy(lp.grad)}
    if kind == "kl_ctrl":
        ctl = ca.AdaptiveKLController(c["init"], c["target"], c["horizon"])
        vals = []
        for kl, n in zip(c["kls"], c["ns"]):
            ctl.update(float(kl), int(n))
            vals.append(ctl.value)
        return {"coefs": np.asarray(vals, dtype=np.float64)}
    raise ValueError(f"unknown kind {kind}")


def main():
    torch.set_default_dtype(torch.float64)
    serve(run)


if __name__ == "__main__":
    main()
