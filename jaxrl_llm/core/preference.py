"""Preference-optimisation losses on sequence log-probabilities (DPO family, SimPO, CPO, ORPO, KTO).

Conventions: every sequence-level input is a ``[B]`` float array holding the *summed*
log-probability of a completion (``sum_t log pi(y_t | x, y_<t)`` over its response tokens)
unless a docstring says otherwise (ORPO takes per-token averages). ``B`` is the number of
preference pairs (or, for unpaired KTO, of examples). Length arrays are ``[B]`` int or float
token counts. bf16 / f16 inputs are computed in float32. Hyper-parameters are static Python
keyword arguments (they are validated at trace time), so every function is jit- and vmap-able.

Every function returns a :class:`PreferenceOutput`: per-pair ``losses [B]`` (the caller
aggregates, usually with ``mean``; weights such as WPO's go on these), the per-pair implicit
rewards ``chosen_rewards [B]`` and ``rejected_rewards [B]`` (no gradient, as in TRL, which
detaches them), and a flat dict of scalar ``metrics`` (means over the batch) named like TRL's
logs: ``chosen_rewards``, ``rejected_rewards``, ``reward_accuracy`` (fraction of pairs with
chosen reward > rejected reward), ``reward_margin`` (mean of chosen - rejected reward),
``chosen_logps``, ``rejected_logps``; some losses add their own.

Parity: the formulas are those of TRL 1.16 (``DPOTrainer._compute_loss``,
``experimental.cpo.CPOTrainer.cpo_loss``, ``experimental.orpo.ORPOTrainer.odds_ratio_loss``,
``KTOTrainer._compute_loss``); ``tests/conformance/test_trl_preference.py`` checks values and
gradients. Deliberate differences are listed in each docstring. Equation numbers are the
ones TRL cites.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.core import _checks
from jaxrl_llm.core.stats import safe_divide

__all__ = [
    "mpo_easy_pairs",
    "rationale_dpo_loss",
    "c3po_loss",
    "tgdpo_token_weights",
    "tgdpo_loss",
    "PreferenceOutput",
    "DPO_LOSS_TYPES",
    "CPO_LOSS_TYPES",
    "dpo_loss",
    "DPO_LOSSES",
    "sigmoid_dpo_loss",
    "robust_dpo_loss",
    "ipo_loss",
    "sigmoid_norm_loss",
    "hinge_loss",
    "sppo_hard_loss",
    "nca_pair_loss",
    "exo_pair_loss",
    "bco_pair_loss",
    "apo_zero_loss",
    "apo_down_loss",
    "discopop_loss",
    "simpo_loss",
    "cpo_loss",
    "orpo_loss",
    "kto_loss",
    "kto_paired_loss",
    "kto_kl_reference_point",
]

DPO_LOSS_TYPES: tuple[str, ...] = (
    "sigmoid",
    "robust",
    "ipo",
    "hinge",
    "sppo_hard",
    "nca_pair",
    "exo_pair",
    "bco_pair",
    "apo_zero",
    "apo_down",
    "sigmoid_norm",
    "discopop",
)
CPO_LOSS_TYPES: tuple[str, ...] = ("sigmoid", "hinge", "ipo")

_log_sigmoid = jax.nn.log_sigmoid
_sigmoid = jax.nn.sigmoid
_sg = jax.lax.stop_gradient


class PreferenceOutput(NamedTuple):
    """Result of a preference loss (a pytree, so it passes through ``jit`` and ``vmap``)."""

    losses: jnp.ndarray  # [B] per-pair (per-example for unpaired KTO) loss
    chosen_rewards: jnp.ndarray  # [B] implicit reward of the chosen completion, no gradient
    rejected_rewards: jnp.ndarray  # [B] implicit reward of the rejected completion, no gradient
    metrics: dict[str, jnp.ndarray]  # flat dict of scalars, no gradient


# ------------------------------------------------------------------------------ helpers


def _check_seq_floats(**arrays: Any) -> int:
    """All arrays are float ``[B]`` with the batch size of the first one; returns ``B``."""
    for name, x in arrays.items():
        _checks.check_rank(name, x, 1)  # also rejects None
    name0, x0 = next(iter(arrays.items()))
    b = int(np.shape(x0)[0])
    _checks.check_seq_args(b, **arrays)
    for name, x in arrays.items():
        _checks.check_float(name, x)
    return b


def _lengths(batch: int, chosen_lengths: Any, rejected_lengths: Any, *, required: bool = False):
    """Validate optional ``[B]`` token counts; return them as floats clamped at >= 1 (or None)."""
    if chosen_lengths is None and rejected_lengths is None:
        if required:
            raise ValueError("arguments 'chosen_lengths' and 'rejected_lengths' are required")
        return None, None
    if chosen_lengths is None or rejected_lengths is None:
        missing = "chosen_lengths" if chosen_lengths is None else "rejected_lengths"
        raise ValueError(f"argument '{missing}' must be given together with the other length array")
    _checks.check_seq_args(batch, chosen_lengths=chosen_lengths, rejected_lengths=rejected_lengths)
    out = []
    for name, x in (("chosen_lengths", chosen_lengths), ("rejected_lengths", rejected_lengths)):
        dt = x.dtype if hasattr(x, "dtype") else jnp.asarray(x).dtype
        if not (jnp.issubdtype(dt, jnp.integer) or jnp.issubdtype(dt, jnp.floating)):
            raise TypeError(f"argument '{name}' must be an integer or float array of token counts")
        # TRL clamps the token count at 1 (``mask.sum(1).clamp(min=1.0)``).
        out.append(jnp.maximum(_checks.as_float(x), 1.0))
    return out[0], out[1]


def _check_label_smoothing(label_smoothing: Any, loss_type: str, low: float, high: float,
                           *, open_low: bool = False, open_high: bool = False) -> float:
    ls = float(label_smoothing)
    ok_low = ls > low if open_low else ls >= low
    ok_high = ls < high if open_high else ls <= high
    if not (np.isfinite(ls) and ok_low and ok_high):
        lo, hi = ("(" if open_low else "["), (")" if open_high else "]")
        raise ValueError(
            f"argument 'label_smoothing' must lie in {lo}{low}, {high}{hi} for loss_type "
            f"'{loss_type}', got {label_smoothing!r}"
        )
    return ls


def _no_label_smoothing(label_smoothing: Any, loss_type: str) -> None:
    if float(label_smoothing) != 0.0:
        raise ValueError(
            f"argument 'label_smoothing' is not used by loss_type '{loss_type}' and must be 0.0, "
            f"got {label_smoothing!r} (TRL silently ignores it there)"
        )


def _pair_metrics(chosen_rewards, rejected_rewards, chosen_logps, rejected_logps) -> dict:
    margin = chosen_rewards - rejected_rewards
    return _sg({
        "chosen_rewards": jnp.mean(chosen_rewards),
        "rejected_rewards": jnp.mean(rejected_rewards),
        "reward_accuracy": jnp.mean((chosen_rewards > rejected_rewards).astype(chosen_rewards.dtype)),
        "reward_margin": jnp.mean(margin),
        "chosen_logps": jnp.mean(chosen_logps),
        "rejected_logps": jnp.mean(rejected_logps),
    })


def _smoothed_sigmoid_loss(h: jnp.ndarray, eps: float) -> jnp.ndarray:
    """``-(1 - eps) log sigma(h) - eps log sigma(-h)`` (``eps = 0`` gives ``-log sigma(h)``)."""
    loss = -_log_sigmoid(h)
    if eps != 0.0:
        loss = (1.0 - eps) * loss - eps * _log_sigmoid(-h)
    return loss


def _log1mexp(x: jnp.ndarray) -> jnp.ndarray:
    """``log(1 - exp(x))`` for ``x <= 0``, stable on both sides of ``-log 2`` and NaN-free in grad.

    ``log1p(-exp(x))`` is accurate for ``x < -log 2`` and ``log(-expm1(x))`` above it (Maechler,
    "Accurately computing log(1 - exp(-|a|))"). Each branch gets an input clipped into its own
    domain so that the branch ``jnp.where`` discards cannot put inf/NaN into the gradient.
    """
    t = -math.log(2.0)
    x = jnp.minimum(x, -1e-7)  # log(1 - e^x) -> -inf at x = 0 (probability 1): cap at log(1e-7)
    small = x < t
    x_small = jnp.where(small, x, t)
    x_large = jnp.where(small, t, x)
    return jnp.where(small, jnp.log1p(-jnp.exp(x_small)), jnp.log(-jnp.expm1(x_large)))


def _alphapo_reward(logps: jnp.ndarray, alpha: float) -> jnp.ndarray:
    """AlphaPO reward ``(1 - p^(-alpha)) / alpha`` with ``p = exp(logps)``; ``logps`` when alpha = 0."""
    if alpha == 0.0:
        return logps
    return -jnp.expm1(-alpha * logps) / alpha


# ------------------------------------------------------------------------------ DPO family


def _dpo_inputs(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths,
                rejected_lengths, beta):
    """Checked float inputs: ``(beta, pc, pr, c, r, len_c, len_r)`` with the log-ratios ``c, r``."""
    _checks.check_positive("beta", beta)
    b = _check_seq_floats(chosen_logps=chosen_logps, rejected_logps=rejected_logps,
                          ref_chosen_logps=ref_chosen_logps, ref_rejected_logps=ref_rejected_logps)
    len_c, len_r = _lengths(b, chosen_lengths, rejected_lengths)
    pc, pr = _checks.as_float(chosen_logps), _checks.as_float(rejected_logps)
    rc, rr = _checks.as_float(ref_chosen_logps), _checks.as_float(ref_rejected_logps)
    return float(beta), pc, pr, pc - rc, pr - rr, len_c, len_r


def _dpo_output(losses, beta, c, r, pc, pr) -> PreferenceOutput:
    chosen_rewards = _sg(beta * c)
    rejected_rewards = _sg(beta * r)
    metrics = _pair_metrics(chosen_rewards, rejected_rewards, pc, pr)
    return PreferenceOutput(losses, chosen_rewards, rejected_rewards, metrics)


def sigmoid_dpo_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths=None,
                     rejected_lengths=None, *, beta: float = 0.1, label_smoothing: float = 0.0) -> PreferenceOutput:
    """DPO: ``-(1-eps) log s(h) - eps log s(-h)``, ``h = beta (c - r)`` (``eps > 0``: cDPO, in
    ``[0, 0.5]``).

    Papers: Rafailov et al., "Direct Preference Optimization", arXiv:2305.18290; cDPO: Mitchell,
    "A note on DPO with noisy preferences & relationship to IPO" (2023). TRL 1.16 ignores
    ``label_smoothing`` here; at the default 0 the two agree."""
    eps = _check_label_smoothing(label_smoothing, "sigmoid", 0.0, 0.5)
    beta, pc, pr, c, r, _, _ = _dpo_inputs(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps,
                                           chosen_lengths, rejected_lengths, beta)
    return _dpo_output(_smoothed_sigmoid_loss(beta * (c - r), eps), beta, c, r, pc, pr)


#: C3PO's prompt scopes (the ``scope`` column): the feedback applies; a near-scope prompt it must
#: not change; an unrelated prompt
C3PO_SCOPES = ("in", "near", "out")


def mpo_easy_pairs(chosen_scores, rejected_scores, *, threshold: float) -> jnp.ndarray:
    """MPO's data split: a pair is *easy* when a reward model scores its chosen response at least
    ``threshold`` above its rejected one, ``r(x, y_w) - r(x, y_l) >= threshold``, and *hard*
    otherwise (a small gap, or one the reward model reverses).

    MPO trains DPO on the easy pairs first, then RL (PPO) on the hard ones from the DPO model, which
    is also the RL stage's reference policy (in a run config: ``pairs.split=easy`` in the
    preference run, then ``model.init_params=<its final_params>`` in the RL run).

    Paper: Gou and Nguyen, "Mixed Preference Optimization: Reinforcement Learning with Data
    Selection and Better Reference Model" (MPO), arXiv:2403.19443. The signed gap (a pair the
    reward model ranks the other way round is hard) is our reading; ``threshold`` has no default.
    Identity: ``threshold = -inf`` keeps every pair easy (plain DPO on all the data; a run's
    ``pairs.margin`` must be finite: leave ``pairs.split`` unset for that).

    Args:
      chosen_scores, rejected_scores: ``[B]`` reward-model scores of the two responses.
      threshold: the gap at and above which a pair is easy.

    Returns:
      ``[B]`` bool, True for the easy pairs.
    """
    _check_seq_floats(chosen_scores=chosen_scores, rejected_scores=rejected_scores)
    gap = jnp.asarray(chosen_scores, jnp.float32) - jnp.asarray(rejected_scores, jnp.float32)
    return _sg(gap >= jnp.float32(threshold))


def rationale_dpo_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, rationale_logps, *,
                       beta: float = 0.1, gamma: float = 0.1) -> PreferenceOutput:
    """Rationale-enriched DPO (RDPO): DPO's logistic loss plus a term that raises the likelihood of
    the pair's rationale (a text saying why the chosen answer is better).

    ``L = -log sigmoid(beta ((c - c_ref) - (r - r_ref))) - log sigmoid(gamma log pi(rationale |
    x_rat))``, ``x_rat`` a prompt showing the question and both answers
    (:data:`jaxrl_llm.data.pipeline.RATIONALE_TEMPLATE`), ``log pi(rationale | x_rat)`` the summed
    log-likelihood of the rationale (``rationale_logps``). The rationale term has no reference
    model; for a long rationale (large negative sum) it is close to ``-gamma log pi``, a weighted
    NLL, and it saturates as the likelihood approaches 1.

    Paper: Just et al., "Data-Centric Human Preference Optimization with Rationales",
    arXiv:2407.14477; code ``reds-lab/preference-learning-with-rationales`` @16111a1
    (``trainers.py``, ``RDPOTrainer.loss``; ``config/loss/rdpo.yaml``: ``beta`` 0.1, ``gamma`` 0.1;
    the README's example run uses ``gamma`` 0.001). Identity: ``gamma = 0`` gives DPO plus the
    constant ``log 2``.

    Args:
      chosen_logps ... ref_rejected_logps: ``[B]`` summed log-likelihoods. rationale_logps: ``[B]``.

    Returns:
      :class:`PreferenceOutput`; metrics add ``rationale_logps`` and ``rationale_loss`` (means).
    """
    _checks.check_positive("gamma", gamma, allow_zero=True)
    beta, pc, pr, c, r, _, _ = _dpo_inputs(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps,
                                           None, None, beta)
    _check_seq_floats(chosen_logps=chosen_logps, rationale_logps=rationale_logps)
    why = jnp.asarray(rationale_logps, jnp.float32)
    term = -_log_sigmoid(gamma * why)
    res = _dpo_output(-_log_sigmoid(beta * (c - r)) + term, beta, c, r, pc, pr)
    res.metrics.update({"rationale_logps": _sg(jnp.mean(why)), "rationale_loss": _sg(jnp.mean(term))})
    return res


def c3po_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths, scope, *,
              beta: float = 0.1, near_coef: float = 1.0, out_coef: float = 1.0) -> PreferenceOutput:
    """C3PO (RLVF): learn a verbal feedback where it applies, and nowhere else.

    Each pair carries a ``scope``: 0 (*in-scope*: the feedback applies; chosen = the response
    revised to follow it, rejected = the original response), 1 (*near-scope*: a related prompt the
    feedback must not touch) or 2 (*out-of-scope*: an unrelated prompt). The per-pair loss is

    - in-scope: DPO's logistic loss ``-log sigmoid(beta (c - r))``;
    - near-scope: ``near_coef`` times the per-token negative log-likelihood of the chosen
      completion, which is the *original* model's own response there;
    - out-of-scope: the same with ``out_coef``;

    so the policy moves on in-scope prompts and is held to the original model's behaviour on
    the others (the overgeneralisation the paper measures). The batch mean of these losses is
    ``E[in] L_DPO + near_coef E[near] L_SFT + out_coef E[out] L_SFT`` under the data mixture:
    the paper's ``L_DPO + lambda_1 L_near + lambda_2 L_out`` with per-subset means corresponds
    to ``near_coef = lambda_1 n_in / n_near`` (and likewise for ``out``) at the mixture's counts.
    The rejected completion of a near- or out-of-scope pair is not used (give it any text).

    Paper: Stephan, Zhu, Chen et al., "RLVF: Learning from Verbal Feedback without
    Overgeneralization" (C3PO), arXiv:2402.10893. Its synthetic data (GPT-4 writing in-, near-
    and out-of-scope prompts and revised responses) is not reproduced; the coefficients'
    defaults are ours (the paper's values were not available to us). Identity: with every pair
    in scope this is DPO's sigmoid loss (TRL's ``loss_type="sigmoid"``).

    Args:
      chosen_logps ... ref_rejected_logps: ``[B]`` summed log-likelihoods.
      chosen_lengths: ``[B]`` token counts of the chosen completions.
      scope: ``[B]`` int in ``{0, 1, 2}``.

    Returns:
      :class:`PreferenceOutput`; metrics add ``c3po_in_loss``, ``c3po_near_nll``,
      ``c3po_out_nll`` (means over their pairs, 0 without any).
    """
    for name, v in (("near_coef", near_coef), ("out_coef", out_coef)):
        _checks.check_positive(name, v, allow_zero=True)
    beta, pc, pr, c, r, len_c, _ = _dpo_inputs(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps,
                                               chosen_lengths, chosen_lengths, beta)
    _checks.check_rank("scope", scope, 1)
    _checks.check_int("scope", scope)
    sc = jnp.asarray(scope, jnp.int32)
    dpo = -_log_sigmoid(beta * (c - r))
    nll = -pc / jnp.maximum(len_c, 1.0)
    inn, near, out = sc == 0, sc == 1, sc == 2
    losses = jnp.where(inn, dpo, jnp.where(near, near_coef * nll, jnp.where(out, out_coef * nll, 0.0)))
    res = _dpo_output(losses, beta, c, r, pc, pr)

    def mean(x, sel):
        sel = sel.astype(jnp.float32)
        return _sg(jnp.sum(jnp.where(sel > 0, x, 0.0)) / jnp.maximum(jnp.sum(sel), 1.0))

    res.metrics.update({"c3po_in_loss": mean(dpo, inn), "c3po_near_nll": mean(nll, near),
                        "c3po_out_nll": mean(nll, out)})
    return res


def robust_dpo_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths=None,
                    rejected_lengths=None, *, beta: float = 0.1, label_smoothing: float = 0.0) -> PreferenceOutput:
    """Robust DPO: ``(-(1-eps) log s(h) + eps log s(-h)) / (1 - 2 eps)``, ``eps`` in ``[0, 0.5)``
    (the paper suggests 0.1).

    Paper: Chowdhury et al., "Provably Robust DPO", arXiv:2403.00409."""
    eps = _check_label_smoothing(label_smoothing, "robust", 0.0, 0.5, open_high=True)
    beta, pc, pr, c, r, _, _ = _dpo_inputs(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps,
                                           chosen_lengths, rejected_lengths, beta)
    h = beta * (c - r)
    losses = (-(1.0 - eps) * _log_sigmoid(h) + eps * _log_sigmoid(-h)) / (1.0 - 2.0 * eps)
    return _dpo_output(losses, beta, c, r, pc, pr)


def _length_normalised(c, r, len_c, len_r):
    return (c / len_c - r / len_r) if len_c is not None else (c - r)


def ipo_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths=None,
             rejected_lengths=None, *, beta: float = 0.1) -> PreferenceOutput:
    """IPO: ``(c/Lc - r/Lr - 1/(2 beta))^2`` (``beta`` is the paper's tau); with the lengths the
    summed log-ratios are divided by them (TRL 1.16), without them they are used as given.

    Paper: Azar et al., "A General Theoretical Paradigm to Understand Learning from Human
    Preferences", arXiv:2310.12036 (Eq. 17)."""
    beta, pc, pr, c, r, len_c, len_r = _dpo_inputs(chosen_logps, rejected_logps, ref_chosen_logps,
                                                   ref_rejected_logps, chosen_lengths, rejected_lengths, beta)
    d = _length_normalised(c, r, len_c, len_r)
    return _dpo_output(jnp.square(d - 1.0 / (2.0 * beta)), beta, c, r, pc, pr)


def sigmoid_norm_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths=None,
                      rejected_lengths=None, *, beta: float = 0.1) -> PreferenceOutput:
    """Length-normalised DPO: ``-log s(beta (c/Lc - r/Lr))``.

    Paper: Lambert et al., "Tulu 3: Pushing Frontiers in Open Language Model Post-Training",
    arXiv:2411.15124."""
    beta, pc, pr, c, r, len_c, len_r = _dpo_inputs(chosen_logps, rejected_logps, ref_chosen_logps,
                                                   ref_rejected_logps, chosen_lengths, rejected_lengths, beta)
    return _dpo_output(-_log_sigmoid(beta * _length_normalised(c, r, len_c, len_r)), beta, c, r, pc, pr)


def hinge_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths=None,
               rejected_lengths=None, *, beta: float = 0.1) -> PreferenceOutput:
    """SLiC hinge: ``relu(1 - beta (c - r))`` (``1/beta`` is the margin).

    Paper: Zhao et al., "SLiC-HF: Sequence Likelihood Calibration with Human Feedback",
    arXiv:2305.10425."""
    beta, pc, pr, c, r, _, _ = _dpo_inputs(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps,
                                           chosen_lengths, rejected_lengths, beta)
    return _dpo_output(jax.nn.relu(1.0 - beta * (c - r)), beta, c, r, pc, pr)


def sppo_hard_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths=None,
                   rejected_lengths=None, *, beta: float = 0.1) -> PreferenceOutput:
    """SPPO with hard labels: ``(c - 1/(2 beta))^2 + (r + 1/(2 beta))^2``.

    Paper: Wu et al., "Self-Play Preference Optimization for Language Model Alignment",
    arXiv:2405.00675 (the hard-label version of Eq. 4.7)."""
    beta, pc, pr, c, r, _, _ = _dpo_inputs(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps,
                                           chosen_lengths, rejected_lengths, beta)
    return _dpo_output(jnp.square(c - 0.5 / beta) + jnp.square(r + 0.5 / beta), beta, c, r, pc, pr)


def nca_pair_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths=None,
                  rejected_lengths=None, *, beta: float = 0.1) -> PreferenceOutput:
    """NCA (pairwise): ``-log s(beta c) - 0.5 log s(-beta c) - 0.5 log s(-beta r)``.

    Paper: Chen et al., "Noise Contrastive Alignment of Language Models with Explicit Rewards",
    arXiv:2402.05369."""
    beta, pc, pr, c, r, _, _ = _dpo_inputs(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps,
                                           chosen_lengths, rejected_lengths, beta)
    losses = -_log_sigmoid(beta * c) - 0.5 * _log_sigmoid(-beta * c) - 0.5 * _log_sigmoid(-beta * r)
    return _dpo_output(losses, beta, c, r, pc, pr)


def exo_pair_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths=None,
                  rejected_lengths=None, *, beta: float = 0.1, label_smoothing: float = 1e-3) -> PreferenceOutput:
    """EXO (pairwise): ``s(h) (log s(h) - log(1-eps)) + s(-h) (log s(-h) - log eps)``, ``eps`` in
    ``(0, 1)`` (the paper recommends 1e-3, the default here; TRL's ``label_smoothing``).

    Paper: Ji et al., "Towards Efficient Exact Optimization of Language Model Alignment",
    arXiv:2402.00856 (EXO-pref, Eq. 16 with K = 2)."""
    eps = _check_label_smoothing(label_smoothing, "exo_pair", 0.0, 1.0, open_low=True, open_high=True)
    beta, pc, pr, c, r, _, _ = _dpo_inputs(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps,
                                           chosen_lengths, rejected_lengths, beta)
    h = beta * (c - r)
    losses = (_sigmoid(h) * (_log_sigmoid(h) - math.log1p(-eps))
              + _sigmoid(-h) * (_log_sigmoid(-h) - math.log(eps)))
    return _dpo_output(losses, beta, c, r, pc, pr)


def bco_pair_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths=None,
                  rejected_lengths=None, *, beta: float = 0.1) -> PreferenceOutput:
    """BCO (pairwise, TRL 1.16's form without the reward shift): ``-log s(beta c) - log s(-beta r)``.

    Paper: Jung et al., "Binary Classifier Optimization for Large Language Model Alignment",
    arXiv:2404.04656."""
    beta, pc, pr, c, r, _, _ = _dpo_inputs(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps,
                                           chosen_lengths, rejected_lengths, beta)
    return _dpo_output(-_log_sigmoid(beta * c) - _log_sigmoid(-beta * r), beta, c, r, pc, pr)


def apo_zero_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths=None,
                  rejected_lengths=None, *, beta: float = 0.1) -> PreferenceOutput:
    """APO-zero: ``(1 - s(beta c)) + s(beta r)``.

    Paper: D'Oosterlinck et al., "Anchored Preference Optimization and Contrastive Revisions",
    arXiv:2408.06266 (Eq. 7)."""
    beta, pc, pr, c, r, _, _ = _dpo_inputs(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps,
                                           chosen_lengths, rejected_lengths, beta)
    return _dpo_output(_sigmoid(-beta * c) + _sigmoid(beta * r), beta, c, r, pc, pr)


def apo_down_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths=None,
                  rejected_lengths=None, *, beta: float = 0.1) -> PreferenceOutput:
    """APO-down: ``s(beta c) + (1 - s(beta (c - r)))``.

    Paper: D'Oosterlinck et al., "Anchored Preference Optimization and Contrastive Revisions",
    arXiv:2408.06266 (Eq. 8)."""
    beta, pc, pr, c, r, _, _ = _dpo_inputs(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps,
                                           chosen_lengths, rejected_lengths, beta)
    return _dpo_output(_sigmoid(beta * c) + _sigmoid(-beta * (c - r)), beta, c, r, pc, pr)


def discopop_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths=None,
                  rejected_lengths=None, *, beta: float = 0.1, discopop_tau: float = 0.05) -> PreferenceOutput:
    """DiscoPOP: ``(1 - m) (-log s(h)) + m exp(-h)``, ``m = s(h / tau)`` (``m exp(-h)`` is computed
    as ``exp(-h + log s(h/tau))``: finite where TRL's product is ``inf * 0``).

    Paper: Lu et al., "Discovering Preference Optimization Algorithms with and for Large
    Language Models", arXiv:2406.08414 (Eq. 5; tau 0.05)."""
    _checks.check_positive("discopop_tau", discopop_tau)
    beta, pc, pr, c, r, _, _ = _dpo_inputs(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps,
                                           chosen_lengths, rejected_lengths, beta)
    h = beta * (c - r)
    tau = float(discopop_tau)
    mod = _sigmoid(h / tau)
    losses = -_log_sigmoid(h) * (1.0 - mod) + jnp.exp(-h + _log_sigmoid(h / tau))
    return _dpo_output(losses, beta, c, r, pc, pr)


#: ``loss_type`` (TRL's names) -> the function
DPO_LOSSES: dict[str, Any] = {
    "sigmoid": sigmoid_dpo_loss, "robust": robust_dpo_loss, "ipo": ipo_loss, "hinge": hinge_loss,
    "sppo_hard": sppo_hard_loss, "nca_pair": nca_pair_loss, "exo_pair": exo_pair_loss, "bco_pair": bco_pair_loss,
    "apo_zero": apo_zero_loss, "apo_down": apo_down_loss, "sigmoid_norm": sigmoid_norm_loss,
    "discopop": discopop_loss,
}
_SMOOTHED = ("sigmoid", "robust", "exo_pair")


def dpo_loss(chosen_logps: jnp.ndarray, rejected_logps: jnp.ndarray,
             ref_chosen_logps: jnp.ndarray, ref_rejected_logps: jnp.ndarray,
             chosen_lengths: jnp.ndarray | None = None, rejected_lengths: jnp.ndarray | None = None,
             *, beta: float = 0.1, loss_type: str = "sigmoid", label_smoothing: float = 0.0,
             discopop_tau: float = 0.05) -> PreferenceOutput:
    r"""Direct Preference Optimization and its paired variants by TRL 1.16's ``loss_type`` name.

    Each variant is its own function (:data:`DPO_LOSSES`); this one looks ``loss_type`` up.

    With log-ratios ``c = chosen_logps - ref_chosen_logps``, ``r = rejected_logps -
    ref_rejected_logps``, ``h = beta (c - r)`` and label smoothing ``eps``, the per-pair loss is

    ================ ======================================================================
    ``sigmoid``      ``-(1-eps) log s(h) - eps log s(-h)``  (DPO; ``eps > 0``: conservative DPO)
    ``robust``       ``(-(1-eps) log s(h) + eps log s(-h)) / (1 - 2 eps)``  (rDPO)
    ``ipo``          ``(c/Lc - r/Lr - 1/(2 beta))^2``  (``beta`` is the paper's tau)
    ``hinge``        ``relu(1 - h)``  (SLiC; ``1/beta`` is the margin)
    ``sppo_hard``    ``(c - 1/(2 beta))^2 + (r + 1/(2 beta))^2``
    ``nca_pair``     ``-log s(beta c) - 0.5 log s(-beta c) - 0.5 log s(-beta r)``
    ``exo_pair``     ``s(h) (log s(h) - log(1-eps)) + s(-h) (log s(-h) - log eps)``
    ``bco_pair``     ``-log s(beta c) - log s(-beta r)``
    ``apo_zero``     ``(1 - s(beta c)) + s(beta r)``
    ``apo_down``     ``s(beta c) + (1 - s(beta (c - r)))``
    ``sigmoid_norm`` ``-log s(beta (c/Lc - r/Lr))``  (length-normalised DPO)
    ``discopop``     ``(1 - m) (-log s(h)) + m exp(-h)``, ``m = s(h / discopop_tau)``
    ================ ======================================================================

    where ``s`` is the logistic sigmoid and ``Lc, Lr`` the completion token counts (clamped
    at 1). Implicit rewards are ``beta c`` and ``beta r`` for every loss type (TRL's
    definition, also for ``ipo``/``sigmoid_norm`` where they stay on the summed log-ratios).

    Papers: Rafailov et al., "Direct Preference Optimization: Your Language Model is Secretly
    a Reward Model", arXiv:2305.18290 (sigmoid); Mitchell, "A note on DPO with noisy
    preferences & relationship to IPO" (2023, no arXiv id; cDPO); Chowdhury et al., "Provably
    Robust DPO: Aligning Language Models with Noisy Feedback", arXiv:2403.00409 (robust); Azar
    et al., "A General Theoretical Paradigm to Understand Learning from Human Preferences",
    arXiv:2310.12036 (ipo, Eq. 17); Zhao et al., "SLiC-HF: Sequence Likelihood Calibration with
    Human Feedback", arXiv:2305.10425 (hinge); Wu et al., "Self-Play Preference Optimization for
    Language Model Alignment", arXiv:2405.00675 (sppo_hard: the hard-label version of their
    Eq. 4.7, winner probability 1 and loser 0); Chen et al., "Noise Contrastive Alignment of
    Language Models with Explicit Rewards", arXiv:2402.05369 (nca_pair); Ji et al., "Towards
    Efficient Exact Optimization of Language Model Alignment", arXiv:2402.00856 (exo_pair,
    EXO-pref Eq. 16 with K = 2); Jung et al., "Binary Classifier Optimization for Large
    Language Model Alignment", arXiv:2404.04656 (bco_pair); D'Oosterlinck et al., "Anchored
    Preference Optimization and Contrastive Revisions", arXiv:2408.06266 (apo_zero Eq. 7,
    apo_down Eq. 8); Lambert et al., "Tulu 3: Pushing Frontiers in Open
    Language Model Post-Training", arXiv:2411.15124 (length-normalised DPO);
    Lu et al., "Discovering Preference Optimization Algorithms with and for Large
    Language Models", arXiv:2406.08414 (discopop, Eq. 5).

    Args:
      chosen_logps, rejected_logps: ``[B]`` summed policy log-probs of the completions.
      ref_chosen_logps, ref_rejected_logps: ``[B]`` summed reference log-probs (data; they are
        not stop-gradiented here, pass constants).
      chosen_lengths, rejected_lengths: optional ``[B]`` completion token counts, used only by
        ``ipo`` and ``sigmoid_norm`` (ignored by the other types, so a caller may always pass
        them). TRL 1.16 divides the *summed* log-ratios by these counts inside the loss (for
        ``ipo`` it states the IPO authors confirmed this normalisation). Passing summed logps
        with lengths reproduces TRL 1.16 exactly. If they are omitted the log-ratios are used
        as given, so a caller who wants the per-token IPO of older TRL releases (which
        averaged the logps before the loss) passes per-token-averaged policy and reference
        logps instead; the loss is then identical to TRL 1.16's, only the reported rewards are
        ``beta`` times the averaged log-ratios.
      beta: inverse temperature / KL strength (TRL default 0.1; IPO's tau).
      loss_type: one of :data:`DPO_LOSS_TYPES` (default ``"sigmoid"``, as TRL).
      label_smoothing: ``eps``; used by ``sigmoid`` (cDPO, ``[0, 0.5]``), ``robust``
        (``[0, 0.5)``, the Robust-DPO paper suggests 0.1) and ``exo_pair`` (``(0, 1)``, the EXO
        paper recommends 1e-3); any other loss type requires 0.0.
      discopop_tau: DiscoPOP temperature (TRL and paper default 0.05).

    Returns:
      :class:`PreferenceOutput` with ``losses [B]``, ``chosen_rewards = beta c``,
      ``rejected_rewards = beta r`` (``[B]``, no gradient) and the pair metrics.

    Deliberate differences from TRL 1.16:
      * ``sigmoid`` applies ``label_smoothing`` as conservative DPO (cDPO); TRL 1.16 ignores
        ``label_smoothing`` for ``sigmoid`` (earlier TRL releases applied cDPO). At the
        default 0.0 the two agree.
      * A non-zero ``label_smoothing`` with a loss type that does not use it raises, where TRL
        ignores it; ``robust`` with ``eps >= 0.5`` raises where TRL only warns.
      * ``discopop`` computes ``m exp(-h)`` as ``exp(-h + log s(h/tau))``: equal in exact
        arithmetic, but finite where TRL's product is ``inf * 0 = NaN`` (very negative ``h``).
      * ``bco_pair`` is TRL 1.16's form, without BCO's reward shift ``delta`` (the paper
        subtracts a running mean of the rewards; TRL 1.16 does not).
      * Not implemented: TRL's batch-sorting ``aot``/``aot_unpaired``, the ``sft`` term (an
        NLL the caller adds), ``f_divergence_type`` other than reverse KL, ``ld_alpha`` and
        WPO weighting (the last two act on how the caller builds ``logps`` / weights
        ``losses``), and loss-type mixtures (sum the outputs with weights).
    """
    _checks.check_choice("loss_type", loss_type, DPO_LOSS_TYPES)
    kw: dict[str, Any] = {"beta": beta}
    if loss_type in _SMOOTHED:
        kw["label_smoothing"] = label_smoothing
    else:
        _no_label_smoothing(label_smoothing, loss_type)
    if loss_type == "discopop":
        kw["discopop_tau"] = discopop_tau
    return DPO_LOSSES[loss_type](chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps,
                                 chosen_lengths, rejected_lengths, **kw)


# ------------------------------------------------------------------------------ reference-free


def _cpo_family(avg_or_sum_c, avg_or_sum_r, *, beta, eps, loss_type, alpha, gamma=0.0):
    """Shared core of :func:`cpo_loss` and :func:`simpo_loss` (TRL's ``CPOTrainer.cpo_loss``)."""
    rew_c = _alphapo_reward(avg_or_sum_c, alpha)
    rew_r = _alphapo_reward(avg_or_sum_r, alpha)
    logits = rew_c - rew_r
    if loss_type == "simpo":
        logits = logits - gamma / beta
    if loss_type in ("sigmoid", "simpo"):
        losses = _smoothed_sigmoid_loss(beta * logits, eps)
    elif loss_type == "hinge":
        losses = jax.nn.relu(1.0 - beta * logits)
    else:  # ipo
        losses = jnp.square(logits - 1.0 / (2.0 * beta))
    chosen_rewards = _sg(beta * rew_c)
    rejected_rewards = _sg(beta * rew_r)
    return losses, chosen_rewards, rejected_rewards


def simpo_loss(chosen_logps: jnp.ndarray, rejected_logps: jnp.ndarray,
               chosen_lengths: jnp.ndarray, rejected_lengths: jnp.ndarray,
               *, beta: float = 2.0, gamma: float = 0.5, label_smoothing: float = 0.0,
               alpha: float = 0.0) -> PreferenceOutput:
    r"""SimPO: reference-free, length-normalised preference loss with a target margin.

    With per-token averages ``a_c = chosen_logps / Lc``, ``a_r = rejected_logps / Lr``
    (``L`` clamped at 1) and ``z = beta (a_c - a_r - gamma / beta) = beta (a_c - a_r) - gamma``:

    ``loss = -(1 - eps) log s(z) - eps log s(-z)``  (``eps = label_smoothing``; 0 in the paper)

    Rewards are ``beta a_c`` and ``beta a_r``. With ``alpha != 0`` (AlphaPO) the averages are
    first mapped through ``a -> (1 - exp(-alpha a)) / alpha`` (``(1 - p^(-alpha)) / alpha``
    with ``p = exp(a)``), in the loss and in the rewards.

    This is TRL 1.16's ``CPOTrainer`` with ``loss_type="simpo"`` and ``cpo_alpha=0`` (its
    ``get_batch_logps(..., average_log_prob=True)`` averages over the completion tokens). For
    CPO-SimPO add ``cpo_alpha * nll(chosen)`` yourself.

    Papers: Meng, Xia and Chen, "SimPO: Simple Preference Optimization with a Reference-Free
    Reward", arXiv:2405.14734; Gupta et al., "AlphaPO: Reward Shape Matters for LLM
    Alignment", arXiv:2501.03884.

    Args:
      chosen_logps, rejected_logps: ``[B]`` *summed* policy log-probs of the completions.
      chosen_lengths, rejected_lengths: ``[B]`` completion token counts (int or float).
      beta: reward scale. Default 2.0, the low end of the SimPO authors' recommended range
        (their released configs use about 2 to 2.5, up to 10 for Gemma-2). TRL's default is
        0.1 because ``CPOConfig.beta`` is shared with CPO; pass ``beta=0.1`` to match a TRL
        run with default settings.
      gamma: target reward margin. Default 0.5 = TRL's ``simpo_gamma`` default. The SimPO
        authors tune it via the ratio ``gamma / beta`` (typically 0.3 to 0.8, e.g. 0.5 ->
        ``gamma = 1.0`` at ``beta = 2``).
      label_smoothing: ``eps`` in ``[0, 0.5]`` (TRL's conservative form; default 0).
      alpha: AlphaPO shape parameter (TRL ``CPOConfig.alpha``, default 0 = SimPO).

    Returns:
      :class:`PreferenceOutput` (``[B]`` losses and rewards, pair metrics).

    Deliberate difference from TRL: a zero token count is clamped to 1 (TRL divides by it and
    returns inf/NaN). The AlphaPO map is computed as ``-expm1(-alpha a) / alpha`` instead of
    TRL's ``(1 - exp(a) ** -alpha) / alpha``: equal in exact arithmetic, finite where
    ``exp(a)`` underflows.
    """
    _checks.check_positive("beta", beta)
    beta = float(beta)
    gamma = float(gamma)
    if not np.isfinite(gamma):
        raise ValueError(f"argument 'gamma' must be finite, got {gamma!r}")
    alpha = float(alpha)
    eps = _check_label_smoothing(label_smoothing, "simpo", 0.0, 0.5)
    b = _check_seq_floats(chosen_logps=chosen_logps, rejected_logps=rejected_logps)
    len_c, len_r = _lengths(b, chosen_lengths, rejected_lengths, required=True)
    pc, pr = _checks.as_float(chosen_logps), _checks.as_float(rejected_logps)
    avg_c, avg_r = pc / len_c, pr / len_r
    losses, cr, rr = _cpo_family(avg_c, avg_r, beta=beta, eps=eps, loss_type="simpo", alpha=alpha,
                                 gamma=gamma)
    metrics = _pair_metrics(cr, rr, avg_c, avg_r)
    return PreferenceOutput(losses, cr, rr, metrics)


def cpo_loss(chosen_logps: jnp.ndarray, rejected_logps: jnp.ndarray,
             chosen_lengths: jnp.ndarray | None = None, rejected_lengths: jnp.ndarray | None = None,
             *, beta: float = 0.1, label_smoothing: float = 0.0, loss_type: str = "sigmoid",
             alpha: float = 0.0) -> PreferenceOutput:
    r"""Contrastive Preference Optimization, preference part (reference-free DPO).

    With ``d = chosen_logps - rejected_logps`` (after the optional length averaging and
    AlphaPO map described below):

    ============ =========================================================
    ``sigmoid``  ``-(1 - eps) log s(beta d) - eps log s(-beta d)``  (CPO Eq. 3 at eps = 0)
    ``hinge``    ``relu(1 - beta d)``
    ``ipo``      ``(d - 1 / (2 beta))^2``
    ============ =========================================================

    Rewards are ``beta * chosen_logps`` and ``beta * rejected_logps``. The full CPO objective
    is ``mean(losses) + cpo_alpha * nll``, where ``nll`` is the token-mean cross-entropy of the
    chosen completions (TRL ``CPOConfig.cpo_alpha``, default 1.0): the caller adds it; this
    function returns only the preference part. For SimPO use :func:`simpo_loss`.

    Paper: Xu et al., "Contrastive Preference Optimization: Pushing the Boundaries of LLM
    Performance in Machine Translation", arXiv:2401.08417; AlphaPO arXiv:2501.03884.

    Args:
      chosen_logps, rejected_logps: ``[B]`` policy log-probs as TRL's ``CPOTrainer`` passes
        them: summed for ``sigmoid``/``hinge``, per-token averaged for ``ipo``.
      chosen_lengths, rejected_lengths: optional ``[B]`` token counts. If given, the logps
        are divided by them (clamped at 1) before everything else, rewards included, which is
        what TRL does for ``ipo``: pass summed logps plus lengths for ``ipo`` and omit
        lengths for ``sigmoid``/``hinge`` to reproduce TRL.
      beta: TRL default 0.1. label_smoothing: ``eps`` in ``[0, 0.5]``, ``sigmoid`` only.
      loss_type: one of :data:`CPO_LOSS_TYPES` (default ``"sigmoid"``).
      alpha: AlphaPO reward shape (default 0: plain log-probs), as :func:`simpo_loss`.

    Returns:
      :class:`PreferenceOutput` (``[B]`` losses and rewards, pair metrics).

    Deliberate differences from TRL: ``label_smoothing != 0`` with ``hinge``/``ipo`` raises
    (TRL ignores it); a zero token count is clamped to 1; the AlphaPO map as in
    :func:`simpo_loss`.
    """
    _checks.check_choice("loss_type", loss_type, CPO_LOSS_TYPES)
    _checks.check_positive("beta", beta)
    beta = float(beta)
    alpha = float(alpha)
    if loss_type == "sigmoid":
        eps = _check_label_smoothing(label_smoothing, loss_type, 0.0, 0.5)
    else:
        _no_label_smoothing(label_smoothing, loss_type)
        eps = 0.0
    b = _check_seq_floats(chosen_logps=chosen_logps, rejected_logps=rejected_logps)
    len_c, len_r = _lengths(b, chosen_lengths, rejected_lengths)
    pc, pr = _checks.as_float(chosen_logps), _checks.as_float(rejected_logps)
    if len_c is not None:
        pc, pr = pc / len_c, pr / len_r
    losses, cr, rr = _cpo_family(pc, pr, beta=beta, eps=eps, loss_type=loss_type, alpha=alpha)
    metrics = _pair_metrics(cr, rr, pc, pr)
    return PreferenceOutput(losses, cr, rr, metrics)


def orpo_loss(chosen_logps: jnp.ndarray, rejected_logps: jnp.ndarray, *, beta: float = 0.1
              ) -> PreferenceOutput:
    r"""ORPO odds-ratio loss (the part added to the SFT NLL).

    With *per-token averaged* log-probs ``a_c, a_r`` (each ``< 0``) and
    ``log odds(a) = a - log(1 - exp(a))``:

    ``log_odds = (a_c - a_r) - (log(1 - exp(a_c)) - log(1 - exp(a_r)))``,
    ``loss = -beta log s(log_odds)``.

    The full ORPO objective is ``nll(chosen) + mean(losses)`` (TRL: ``policy_nll_loss -
    losses.mean()`` with its ``losses = beta log s(log_odds)``): the caller adds the NLL.
    ``log(1 - exp(a))`` is computed with the two-branch ``log1mexp`` (``log1p(-exp(a))`` below
    ``-log 2``, ``log(-expm1(a))`` above), with NaN-free gradients; ``a`` is capped at
    ``-1e-7`` first, so a completion of probability 1 in float32 (``a = 0``, where the odds
    are infinite and TRL returns inf/NaN) gets a finite loss.

    Paper: Hong, Lee and Thorne, "ORPO: Monolithic Preference Optimization without Reference
    Model", arXiv:2403.07691 (Eqs. 4 and 7). ``beta`` is the paper's lambda (TRL default 0.1).

    Args:
      chosen_logps, rejected_logps: ``[B]`` per-token *averaged* policy log-probs of the
        completions, as TRL's ORPO ``get_batch_logps(..., average_log_prob=True)``.
      beta: weight of the odds-ratio term (TRL default 0.1).

    Returns:
      :class:`PreferenceOutput` with rewards ``beta a_c``, ``beta a_r`` and, besides the pair
      metrics, TRL's two extra logs with TRL's names: ``log_odds_ratio`` = mean of
      ``log s(log_odds)`` and ``log_odds_chosen`` = mean of ``log_odds``.

    Deliberate difference from TRL: the sign. TRL's ``odds_ratio_loss`` returns
    ``beta log s(log_odds)`` and *subtracts* its mean; we return the loss itself,
    ``-beta log s(log_odds)``, so that every function here is minimised. Values are computed
    in the input precision (float32 for bf16), where TRL casts to float32.
    """
    _checks.check_positive("beta", beta)
    beta = float(beta)
    _check_seq_floats(chosen_logps=chosen_logps, rejected_logps=rejected_logps)
    a_c, a_r = _checks.as_float(chosen_logps), _checks.as_float(rejected_logps)
    log_odds = (a_c - a_r) - (_log1mexp(a_c) - _log1mexp(a_r))
    ratio = _log_sigmoid(log_odds)
    losses = -beta * ratio
    cr, rr = _sg(beta * a_c), _sg(beta * a_r)
    metrics = _pair_metrics(cr, rr, a_c, a_r)
    metrics["log_odds_ratio"] = _sg(jnp.mean(ratio))
    metrics["log_odds_chosen"] = _sg(jnp.mean(log_odds))
    return PreferenceOutput(losses, cr, rr, metrics)


# ------------------------------------------------------------------------------ KTO


def kto_kl_reference_point(policy_kl_logps: jnp.ndarray, ref_kl_logps: jnp.ndarray, *,
                           axis_name: str | None = None) -> jnp.ndarray:
    r"""KTO reference point ``z0 = max(0, mean_i(policy_kl_logps_i - ref_kl_logps_i))``, no gradient.

    The inputs are summed log-probs of *mismatched* completions ``y'`` for each prompt (TRL
    pairs prompt ``i`` with the completion of example ``i - 1``), which makes the mean an
    estimate of ``KL(pi(.|x) || pi_ref(.|x))`` (Ethayarajh et al., "KTO: Model Alignment as
    Prospect Theoretic Optimization", arXiv:2402.01306). As in TRL 1.16
    (``KTOTrainer._compute_loss``) the mean is detached and clamped at 0.

    Args:
      policy_kl_logps, ref_kl_logps: ``[B]`` summed log-probs of the mismatched completions.
      axis_name: optional mapped axis (``pmap``/``shard_map``/``vmap``) over which the
        per-device means are averaged before the clamp, like TRL's ``gather_for_metrics(kl)
        .mean()`` across processes.

    Returns:
      scalar ``z0`` (float32 for bf16 inputs).
    """
    _check_seq_floats(policy_kl_logps=policy_kl_logps, ref_kl_logps=ref_kl_logps)
    diff = _checks.as_float(policy_kl_logps) - _checks.as_float(ref_kl_logps)
    kl = jnp.mean(diff)
    if axis_name is not None:
        kl = jax.lax.pmean(kl, axis_name)
    return _sg(jnp.maximum(kl, 0.0))


def _check_kto_settings(beta, desirable_weight, undesirable_weight) -> tuple[float, float, float]:
    _checks.check_positive("beta", beta)
    _checks.check_positive("desirable_weight", desirable_weight, allow_zero=True)
    _checks.check_positive("undesirable_weight", undesirable_weight, allow_zero=True)
    return float(beta), float(desirable_weight), float(undesirable_weight)


def _check_scalar(name: str, x: Any) -> jnp.ndarray:
    if np.ndim(x) != 0:
        raise ValueError(f"argument '{name}' must be a scalar (rank 0), got shape {tuple(np.shape(x))}")
    _checks.check_float(name, x)
    return _checks.as_float(x)


def kto_loss(policy_logps: jnp.ndarray, ref_logps: jnp.ndarray, is_desirable: jnp.ndarray,
             kl_ref_point: jnp.ndarray, *, beta: float = 0.1, desirable_weight: float = 1.0,
             undesirable_weight: float = 1.0) -> PreferenceOutput:
    r"""Kahneman-Tversky Optimization on unpaired examples, as TRL 1.16's ``KTOTrainer``.

    With ``rho_i = policy_logps_i - ref_logps_i`` and the (detached) reference point ``z0``:

    * desirable ``i``:   ``loss_i = desirable_weight * (1 - s(beta (rho_i - z0)))``
    * undesirable ``i``: ``loss_i = undesirable_weight * (1 - s(beta (z0 - rho_i)))``

    TRL's scalar loss is ``mean_i(loss_i)`` over all ``B`` examples (``losses.nanmean()``).
    ``1 - s(x)`` is computed as ``s(-x)``.

    Paper: Ethayarajh et al., "KTO: Model Alignment as Prospect Theoretic Optimization",
    arXiv:2402.01306 (Eq. 7; lambda_D, lambda_U are the class weights; TRL's documentation
    recommends keeping ``lambda_D n_D / (lambda_U n_U)`` in ``[1, 4/3]``).

    Args:
      policy_logps, ref_logps: ``[B]`` summed log-probs of the examples' completions.
      is_desirable: ``[B]`` bool (or {0, 1}) label: True for a desirable completion.
      kl_ref_point: scalar ``z0``, usually :func:`kto_kl_reference_point`; a gradient is never
        taken through it (stop-gradient applied here too).
      beta: TRL default 0.1. desirable_weight, undesirable_weight: lambda_D, lambda_U
        (TRL defaults 1.0, 1.0).

    Returns:
      :class:`PreferenceOutput`: ``losses [B]`` in input order (TRL concatenates the
      desirable then the undesirable losses; the mean is the same); ``chosen_rewards[i] =
      beta rho_i`` on desirable rows and 0 elsewhere, ``rejected_rewards[i] = beta rho_i`` on
      undesirable rows and 0 elsewhere. Metrics: ``chosen_rewards`` / ``rejected_rewards`` /
      ``chosen_logps`` / ``rejected_logps`` are means over the desirable / undesirable rows (0
      when a class is empty, where TRL skips the log), ``reward_margin`` is their difference
      (TRL's ``rewards/margins``), ``kl`` is ``z0``, ``desirable_fraction`` the fraction of
      desirable rows. There is no ``reward_accuracy``: the examples are not paired.

    Deliberate difference from TRL: only the ``"kto"`` loss type (not
    ``"apo_zero_unpaired"``); ``z0`` is an input, so a caller can compute it from mismatched
    completions, from another micro-batch, or set it to 0 (TRL's ``calculate_KL=False``).
    """
    beta, wd, wu = _check_kto_settings(beta, desirable_weight, undesirable_weight)
    b = _check_seq_floats(policy_logps=policy_logps, ref_logps=ref_logps)
    _checks.check_seq_args(b, is_desirable=is_desirable)
    z0 = _sg(_check_scalar("kl_ref_point", kl_ref_point))
    p, ref = _checks.as_float(policy_logps), _checks.as_float(ref_logps)
    desirable = _checks.as_mask(is_desirable, p.dtype) > 0
    rho = p - ref
    loss_d = wd * _sigmoid(-beta * (rho - z0))
    loss_u = wu * _sigmoid(-beta * (z0 - rho))
    losses = jnp.where(desirable, loss_d, loss_u)

    rewards = _sg(beta * rho)
    zero = jnp.zeros_like(rewards)
    chosen_rewards = jnp.where(desirable, rewards, zero)
    rejected_rewards = jnp.where(desirable, zero, rewards)
    wd_mask = desirable.astype(p.dtype)
    wu_mask = 1.0 - wd_mask
    n_d, n_u = jnp.sum(wd_mask), jnp.sum(wu_mask)
    mean_cr = safe_divide(jnp.sum(chosen_rewards), n_d)
    mean_rr = safe_divide(jnp.sum(rejected_rewards), n_u)
    metrics = _sg({
        "chosen_rewards": mean_cr,
        "rejected_rewards": mean_rr,
        "reward_margin": mean_cr - mean_rr,
        "chosen_logps": safe_divide(jnp.sum(jnp.where(desirable, p, 0.0)), n_d),
        "rejected_logps": safe_divide(jnp.sum(jnp.where(desirable, 0.0, p)), n_u),
        "kl": z0 + jnp.zeros((), p.dtype),
        "desirable_fraction": jnp.mean(wd_mask),
    })
    return PreferenceOutput(losses, chosen_rewards, rejected_rewards, metrics)


def kto_paired_loss(chosen_logps: jnp.ndarray, rejected_logps: jnp.ndarray,
                    ref_chosen_logps: jnp.ndarray, ref_rejected_logps: jnp.ndarray,
                    kl_ref_point: jnp.ndarray | None = None, *, beta: float = 0.1,
                    desirable_weight: float = 1.0, undesirable_weight: float = 1.0
                    ) -> PreferenceOutput:
    r"""KTO on preference pairs: the chosen completion is desirable, the rejected one undesirable.

    With ``c = chosen_logps - ref_chosen_logps`` and ``r = rejected_logps - ref_rejected_logps``:

    ``loss_i = 0.5 * (desirable_weight (1 - s(beta (c_i - z_c))) + undesirable_weight (1 - s(beta (z_r - r_i))))``

    The factor 0.5 makes ``mean(losses)`` equal to the unpaired KTO loss (:func:`kto_loss`)
    over the ``2B`` completions with the same reference points.

    Reference point: if ``kl_ref_point`` is given it is used for both halves (``z_c = z_r =
    z0``, detached); compute it with :func:`kto_kl_reference_point` on mismatched completions
    to follow the paper. Otherwise the in-batch estimate of TRL's former DPO ``loss_type
    "kto_pair"`` is used, where each half's reference point comes from the *other* half:
    ``z_c = max(0, mean(r))`` and ``z_r = max(0, mean(c))``.

    Paper: Ethayarajh et al., "KTO: Model Alignment as Prospect Theoretic Optimization",
    arXiv:2402.01306 (Eq. 7).

    Args:
      chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps: ``[B]`` summed
        log-probs.
      kl_ref_point: optional scalar ``z0``.
      beta, desirable_weight, undesirable_weight: as :func:`kto_loss` (defaults 0.1, 1, 1).

    Returns:
      :class:`PreferenceOutput` with rewards ``beta c``, ``beta r``, the pair metrics, plus
      ``kl_chosen`` (``z_c``) and ``kl_rejected`` (``z_r``).

    What TRL does: TRL 1.16 no longer has a paired KTO (``kto_pair`` was removed from
    ``DPOTrainer``); this function therefore has no TRL oracle. Differences from the removed
    ``kto_pair``: the in-batch reference points are detached here, as the KTO paper prescribes
    and TRL's unpaired ``KTOTrainer`` does (``kto_pair`` back-propagated through them); it had
    no class weights (the defaults 1, 1 reproduce it); its mean over ``2B`` concatenated losses
    equals ``mean(losses)`` here.
    """
    beta, wd, wu = _check_kto_settings(beta, desirable_weight, undesirable_weight)
    _check_seq_floats(chosen_logps=chosen_logps, rejected_logps=rejected_logps,
                      ref_chosen_logps=ref_chosen_logps, ref_rejected_logps=ref_rejected_logps)
    pc, pr = _checks.as_float(chosen_logps), _checks.as_float(rejected_logps)
    c = pc - _checks.as_float(ref_chosen_logps)
    r = pr - _checks.as_float(ref_rejected_logps)
    if kl_ref_point is not None:
        z0 = _sg(_check_scalar("kl_ref_point", kl_ref_point))
        z_c = z_r = z0
    else:
        z_c = _sg(jnp.maximum(jnp.mean(r), 0.0))
        z_r = _sg(jnp.maximum(jnp.mean(c), 0.0))
    losses = 0.5 * (wd * _sigmoid(-beta * (c - z_c)) + wu * _sigmoid(-beta * (z_r - r)))
    cr, rr = _sg(beta * c), _sg(beta * r)
    metrics = _pair_metrics(cr, rr, pc, pr)
    metrics["kl_chosen"] = z_c + jnp.zeros((), c.dtype)
    metrics["kl_rejected"] = z_r + jnp.zeros((), c.dtype)
    return PreferenceOutput(losses, cr, rr, metrics)



# ------------------------------------------------------------------------------------------------ TGDPO


def tgdpo_token_weights(aux_logp_chosen: jnp.ndarray, ref_logp_chosen: jnp.ndarray, aux_logp_rejected: jnp.ndarray,
                        ref_logp_rejected: jnp.ndarray, *, alpha: float = 0.5, beta: float = 0.1
                        ) -> tuple[jnp.ndarray, jnp.ndarray]:
    """TGDPO's per-token weights from a token-level reward model: ``(w_chosen, w_rejected)``.

    With the token reward ``v_t = log pi_rm(y_t) - log pi_ref(y_t)`` of a previously trained
    policy ``pi_rm`` (a DPO model): ``w^w_t = 1 + alpha beta v^w_t`` on the chosen response and
    ``w^l_t = 1 - alpha beta v^l_t`` on the rejected one (more weight where the token reward
    agrees with the preference). DPO on the weighted sequence log-ratios
    ``h = beta [sum_t w^w_t (logp - ref)^w - sum_t w^l_t (logp - ref)^l]`` is TGDPO
    (:func:`tgdpo_loss`); ``alpha = 0`` gives DPO. No clamp (as the authors' code).

    Paper: "TGDPO: Harnessing Token-Level Reward Guidance for Enhancing Direct Preference
    Optimization" (Zhu et al.), arXiv:2506.14574; code ``dvlab-research/TGDPO`` @dd88982
    (``dpo_loss``, sigmoid branch): ``alpha = 0.5``, ``beta = 0.1``.

    Args:
      aux_logp_chosen, ref_logp_chosen, aux_logp_rejected, ref_logp_rejected: per-token log-probs
        ``[..., T]`` of the token-reward model and the reference. alpha, beta: as above.

    Returns:
      ``(w_chosen, w_rejected)`` float32 of the inputs' shape, no gradient.
    """
    for name, x in (("aux_logp_chosen", aux_logp_chosen), ("ref_logp_chosen", ref_logp_chosen),
                    ("aux_logp_rejected", aux_logp_rejected), ("ref_logp_rejected", ref_logp_rejected)):
        _checks.check_float(name, x)
    vw = jnp.asarray(aux_logp_chosen, jnp.float32) - jnp.asarray(ref_logp_chosen, jnp.float32)
    vl = jnp.asarray(aux_logp_rejected, jnp.float32) - jnp.asarray(ref_logp_rejected, jnp.float32)
    return jax.lax.stop_gradient(1.0 + alpha * beta * vw), jax.lax.stop_gradient(1.0 - alpha * beta * vl)


def tgdpo_loss(logp_chosen: jnp.ndarray, logp_rejected: jnp.ndarray, ref_logp_chosen: jnp.ndarray,
               ref_logp_rejected: jnp.ndarray, aux_logp_chosen: jnp.ndarray, aux_logp_rejected: jnp.ndarray,
               mask_chosen: jnp.ndarray, mask_rejected: jnp.ndarray, *, alpha: float = 0.5, beta: float = 0.1
               ) -> PreferenceOutput:
    """TGDPO on per-token log-probs: ``-log sigmoid(sum_t beta w^w_t u^w_t - sum_t beta w^l_t u^l_t)``
    with ``u = logp - ref_logp`` and the weights of :func:`tgdpo_token_weights`.

    Paper: "TGDPO: Harnessing Token-Level Reward Guidance for Enhancing Direct Preference
    Optimization" (Zhu et al.), arXiv:2506.14574 (see :func:`tgdpo_token_weights`). The trainer
    computes the same loss from weighted sequence sums (``recipe.loss=tgdpo`` of a preference run).

    Args:
      ``[B, T]`` per-token log-probs of the policy, the reference and the token-reward model on the
      chosen and rejected responses, and their masks. alpha, beta: as above.

    Returns:
      :class:`PreferenceOutput` (per-pair losses ``[B]`` and the pair metrics).
    """
    mc, mr = (_checks.as_mask(x) for x in (mask_chosen, mask_rejected))
    # values outside the masks never matter (and get no gradient): zero them first
    lc, rc_, ac = (_checks.zero_outside(_checks.as_float(x), mc) for x in (logp_chosen, ref_logp_chosen,
                                                                           aux_logp_chosen))
    lr, rr_, ar = (_checks.zero_outside(_checks.as_float(x), mr) for x in (logp_rejected, ref_logp_rejected,
                                                                           aux_logp_rejected))
    ww, wl = tgdpo_token_weights(ac, rc_, ar, rr_, alpha=alpha, beta=beta)
    logp_chosen, ref_logp_chosen, logp_rejected, ref_logp_rejected = lc, rc_, lr, rr_

    def wsum(w, x, m):
        return jnp.sum(jnp.where(m > 0, w * x, 0.0), axis=-1)

    c, r = wsum(ww, logp_chosen, mc), wsum(wl, logp_rejected, mr)
    rc, rr = wsum(ww, ref_logp_chosen, mc), wsum(wl, ref_logp_rejected, mr)
    return sigmoid_dpo_loss(c, r, rc, rr, beta=beta)
