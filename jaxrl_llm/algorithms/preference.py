"""Preference losses as registered parts: ``recipe.loss=<name>`` of a preference run.

Calling convention: ``fn(logps, counts, batch, **params) -> PreferenceOutput`` where ``logps``
and ``counts`` are the summed log-likelihoods and token counts of the completions, pair-major
``[B, 2]`` (chosen, rejected) for paired losses or ``[N]`` rows for unpaired KTO, and ``batch``
holds what the part ``requires``: ``ref_logps`` (the frozen reference's sums, same layout) and,
for KTO, ``desirable [N]`` and ``kl_ref_point [N]``. Each part is one core function of
:mod:`jaxrl_llm.core.preference` with the inputs it takes (summed log-ratios, lengths, or ORPO's
per-token averages).
"""

from __future__ import annotations

import jax.numpy as jnp

import jaxrl_llm.core as core
from jaxrl_llm.algorithms.registry import Part, new_registry

__all__ = ["PREFERENCE_LOSSES"]

PREFERENCE_LOSSES = new_registry("preference loss", "preference recipe.loss",
                                 "fn(logps [B, 2] | [N], counts, batch, **params) -> PreferenceOutput")

_T = "tests/core/test_preference.py, tests/conformance/test_trl_preference.py"
_REF = frozenset({"ref_logps"})


def _paired_dpo(core_fn):
    def fn(logps, counts, batch, **kw):
        ref = batch["ref_logps"]
        return core_fn(logps[:, 0], logps[:, 1], ref[:, 0], ref[:, 1], counts[:, 0], counts[:, 1], **kw)
    fn.__name__ = core_fn.__name__
    fn.__doc__ = core_fn.__doc__
    fn.__wrapped__ = core_fn  # the catalogue and the argument checks read the core signature
    return fn


for _name, _fn, _paper in (
        ("dpo", core.sigmoid_dpo_loss, "Direct Preference Optimization (Rafailov et al.), arXiv:2305.18290"),
        ("robust", core.robust_dpo_loss, "Provably Robust DPO (Chowdhury et al.), arXiv:2403.00409"),
        ("ipo", core.ipo_loss, "A General Theoretical Paradigm to Understand Learning from Human Preferences "
                               "(Azar et al.), arXiv:2310.12036"),
        ("sigmoid_norm", core.sigmoid_norm_loss, "Tulu 3 (Lambert et al.), arXiv:2411.15124"),
        ("hinge", core.hinge_loss, "SLiC-HF (Zhao et al.), arXiv:2305.10425"),
        ("sppo_hard", core.sppo_hard_loss, "Self-Play Preference Optimization (Wu et al.), arXiv:2405.00675"),
        ("nca_pair", core.nca_pair_loss, "Noise Contrastive Alignment (Chen et al.), arXiv:2402.05369"),
        ("exo_pair", core.exo_pair_loss, "Towards Efficient Exact Optimization of LM Alignment (Ji et al.), "
                                         "arXiv:2402.00856"),
        ("bco_pair", core.bco_pair_loss, "Binary Classifier Optimization (Jung et al.), arXiv:2404.04656"),
        ("apo_zero", core.apo_zero_loss, "Anchored Preference Optimization (D'Oosterlinck et al.), arXiv:2408.06266"),
        ("apo_down", core.apo_down_loss, "Anchored Preference Optimization (D'Oosterlinck et al.), arXiv:2408.06266"),
        ("discopop", core.discopop_loss, "Discovering Preference Optimization Algorithms (Lu et al.), "
                                         "arXiv:2406.08414")):
    PREFERENCE_LOSSES.register(Part(_name, _paired_dpo(_fn), paper=_paper, core=(_fn.__name__,), requires=_REF,
                                    verified="TRL", tests=_T, flags=(("paired", True),)))


def _wraps(core_fn):
    def deco(fn):
        fn.__wrapped__ = core_fn  # the argument checks and the catalogue read the core signature
        fn.__doc__ = core_fn.__doc__
        return fn
    return deco


@_wraps(core.kto_paired_loss)
def kto_paired(logps, counts, batch, **kw):
    ref = batch["ref_logps"]
    return core.kto_paired_loss(logps[:, 0], logps[:, 1], ref[:, 0], ref[:, 1], **kw)


@_wraps(core.simpo_loss)
def simpo(logps, counts, batch, **kw):
    return core.simpo_loss(logps[:, 0], logps[:, 1], counts[:, 0], counts[:, 1], **kw)


@_wraps(core.cpo_loss)
def cpo(logps, counts, batch, **kw):
    lengths = (counts[:, 0], counts[:, 1]) if kw.get("loss_type", "sigmoid") == "ipo" else (None, None)
    return core.cpo_loss(logps[:, 0], logps[:, 1], *lengths, **kw)


@_wraps(core.orpo_loss)
def orpo(logps, counts, batch, **kw):
    return core.orpo_loss(logps[:, 0] / jnp.maximum(counts[:, 0], 1.0), logps[:, 1] / jnp.maximum(counts[:, 1], 1.0),
                          **kw)


@_wraps(core.kto_loss)
def kto(logps, counts, batch, **kw):
    return core.kto_loss(logps, batch["ref_logps"], batch["desirable"], batch["kl_ref_point"][0], **kw)


def tgdpo(logps, counts, batch, *, beta: float = 0.1, alpha: float = 0.5):
    """TGDPO: DPO's logistic loss on token-weighted sequence log-likelihoods (the trainer weighs
    each token by :func:`jaxrl_llm.core.tgdpo_token_weights` of the auxiliary model; ``alpha`` is
    read there)."""
    ref = batch["ref_logps"]
    return core.sigmoid_dpo_loss(logps[:, 0], logps[:, 1], ref[:, 0], ref[:, 1], beta=beta)


PREFERENCE_LOSSES.register(Part(
    "tgdpo", tgdpo,
    paper="TGDPO: Harnessing Token-Level Reward Guidance for Enhancing Direct Preference Optimization (Zhu et al.), "
          "arXiv:2506.14574",
    core=("tgdpo_token_weights", "tgdpo_loss", "sigmoid_dpo_loss"), requires=frozenset({"ref_logps", "token_weights"}),
    methods=(138,), verified="hand values (the authors' code), paper identity (alpha = 0: DPO, TRL)",
    tests="tests/core/test_preference.py, tests/training/test_aux_policy.py",
    flags=(("paired", True), ("token_weights", True)),
    note="per-token weights 1 +- alpha beta log(pi_rm / pi_ref) from the auxiliary model (model.aux_params: a DPO "
         "model) on the chosen / rejected tokens"))

@_wraps(core.c3po_loss)
def c3po(logps, counts, batch, **kw):
    ref = batch["ref_logps"]
    return core.c3po_loss(logps[:, 0], logps[:, 1], ref[:, 0], ref[:, 1], counts[:, 0], batch["scope"], **kw)


PREFERENCE_LOSSES.register(Part(
    "c3po", c3po,
    paper="RLVF: Learning from Verbal Feedback without Overgeneralization (C3PO; Stephan et al.), arXiv:2402.10893",
    core=("c3po_loss", "sigmoid_dpo_loss"), requires=frozenset({"ref_logps", "scope"}), methods=(51,),
    verified="hand values, paper identity (all pairs in scope: DPO, TRL)",
    tests="tests/core/test_preference.py, tests/training/test_c3po.py", flags=(("paired", True),),
    note="each pair's scope from the data column data.scope_field (in / near / out): DPO on in-scope pairs, the "
         "per-token NLL of the original model's response (the chosen completion) on near- and out-of-scope "
         "pairs, weighted near_coef / out_coef; the synthetic data generation is not reproduced"))

@_wraps(core.rationale_dpo_loss)
def rdpo(logps, counts, batch, **kw):
    ref = batch["ref_logps"]
    return core.rationale_dpo_loss(logps[:, 0], logps[:, 1], ref[:, 0], ref[:, 1], logps[:, 2], **kw)


PREFERENCE_LOSSES.register(Part(
    "rdpo", rdpo,
    paper="Data-Centric Human Preference Optimization with Rationales (Just et al.), arXiv:2407.14477",
    core=("rationale_dpo_loss", "sigmoid_dpo_loss"), requires=_REF, methods=(236,),
    verified="hand values, paper identity (gamma 0: DPO + log 2); a transcription of the authors' loss "
             "(reds-lab/preference-learning-with-rationales @16111a1)",
    tests="tests/core/test_preference.py, tests/training/test_rationale_dpo.py, tests/conformance/test_rationale_dpo_authors.py",
    flags=(("paired", True), ("rationale", True)),
    note="DPO + -log sigmoid(gamma log pi(rationale | the pair shown to a judge)); each pair's rationale from "
         "pairs.rationale_field of a pairs file (a third row per pair); not reproduced: the machine-written "
         "rationales (the data brings them) and R-ORPO"))

PREFERENCE_LOSSES.register(Part(
    "spin", _paired_dpo(core.sigmoid_dpo_loss),
    paper="Self-Play Fine-Tuning Converts Weak Language Models to Strong Language Models (SPIN, Chen et al.), "
          "arXiv:2401.01335",
    core=("sigmoid_dpo_loss",), requires=_REF, methods=(196,), verified="TRL (its DPO sigmoid loss), paper identity",
    tests="tests/core/test_preference.py, tests/training/test_spin.py", flags=(("paired", True),),
    note="DPO's logistic loss with the human answer as chosen and the current policy's own sample as rejected, the "
         "previous iterate as reference: the self-play loop is pairs.source=spin (experiments/tiny_spin.py)"))

for _part in (
    Part("kto_paired", kto_paired, paper="KTO (Ethayarajh et al.), arXiv:2402.01306", core=("kto_paired_loss",),
         requires=_REF, verified="TRL", tests=_T, flags=(("paired", True),),
         note="in-batch reference points unless kl_ref_point is given"),
    Part("simpo", simpo, paper="SimPO (Meng, Xia and Chen), arXiv:2405.14734", core=("simpo_loss",), methods=(127,),
         verified="TRL",
         tests=_T, flags=(("paired", True),)),
    Part("cpo", cpo, paper="Contrastive Preference Optimization (Xu et al.), arXiv:2401.08417", core=("cpo_loss",),
         verified="TRL", tests=_T, flags=(("paired", True),), note="loss_type sigmoid | hinge | ipo"),
    Part("orpo", orpo, paper="ORPO (Hong, Lee and Thorne), arXiv:2403.07691", core=("orpo_loss",), verified="TRL",
         tests=_T, flags=(("paired", True),), note="on per-token average log-probs"),
    Part("kto", kto, paper="KTO (Ethayarajh et al.), arXiv:2402.01306", core=("kto_loss", "kto_kl_reference_point"),
         requires=frozenset({"ref_logps", "desirable", "kl_ref_point"}), verified="TRL", tests=_T,
         flags=(("paired", False),), note="unpaired rows; the reference point from mismatched completions (TRL)"),
):
    PREFERENCE_LOSSES.register(_part)
