"""The seed papers' reward designs (:mod:`jaxrl_llm.core.reward_shaping`) as reward shaping
parts, ``recipe.shaping=<name>``.

A shaping part sees the reward total, the lengths, the groups, every reward function's score and
(parts flagged ``needs_text``) the decoded completions (:class:`~jaxrl_llm.algorithms.ShapingInputs`)
and returns a per-row bonus added to the total. The methods here define the reward itself, so
they return ``new_reward - total``: the shaped score *is* the method's reward. Which rows are
correct comes from a reward function's score (``metric``, default the total) at or above
``threshold``, as in :func:`~jaxrl_llm.algorithms.sampling.kimi_length`.
"""

from __future__ import annotations

import math
import re

import jax.numpy as jnp
import numpy as np

import jaxrl_llm.core as core
from jaxrl_llm.algorithms.answers import cluster_ids, final_answer
from jaxrl_llm.algorithms.registry import Part
from jaxrl_llm.algorithms.sampling import SHAPING, ShapingInputs

__all__: list[str] = []

_T = "tests/core/test_reward_shaping.py, tests/training/test_paper_losses.py"


def _metric(x: ShapingInputs, name: str | None) -> np.ndarray:
    if name is None:
        return np.asarray(x.scores, np.float64)
    if name not in x.per_fn:
        raise ValueError(f"reward function {name!r} not found; the rewards are {sorted(x.per_fn)}")
    return np.nan_to_num(np.asarray(x.per_fn[name], np.float64), nan=0.0)


def _correct(x: ShapingInputs, metric: str | None, threshold: float) -> np.ndarray:
    return _metric(x, metric) >= threshold


def _replace(x: ShapingInputs, reward) -> np.ndarray:
    return (np.asarray(reward, np.float32) - np.asarray(x.scores, np.float32)).astype(np.float32)


def _g(x: ShapingInputs):
    return jnp.asarray(x.group_ids, jnp.int32), x.num_groups


def thinkless(x: ShapingInputs, *, metric: str | None = None, threshold: float = 1.0, short_tag: str = "<short>",
              short_reward: float = 1.0, think_reward: float = 0.5, wrong_reward: float = -1.0) -> np.ndarray:
    """Thinkless's mode reward: the completion's mode is short when it starts with ``short_tag``
    (the text is decoded with special tokens kept: the authors add ``<short>`` / ``<think>`` to
    the vocabulary as control tokens)."""
    short = np.array([c.lstrip().startswith(short_tag) for c in x.completions], bool)
    r = core.thinkless_reward(jnp.asarray(_correct(x, metric, threshold)), jnp.asarray(short),
                              short_reward=short_reward, think_reward=think_reward, wrong_reward=wrong_reward)
    return _replace(x, r)


def grpo_lambda(x: ShapingInputs, *, metric: str | None = None, threshold: float = 1.0, top_fraction: float = 0.5,
                length_weight: float = 1.0) -> np.ndarray:
    """GRPO-lambda: the length-penalised reward for the top groups by accuracy, 0/1 elsewhere."""
    r = core.grpo_lambda_reward(jnp.asarray(_correct(x, metric, threshold)), jnp.asarray(x.lengths, jnp.float32),
                                *_g(x), top_fraction=top_fraction, length_weight=length_weight)
    return _replace(x, r)


def concise(x: ShapingInputs, *, metric: str | None = None, threshold: float = 1.0, alpha: float = 1.0,
            max_length: int | None = None) -> np.ndarray:
    """ConciseR's L-GRPO reward (``max_length`` defaults to the sampler's budget)."""
    r = core.concise_reward(jnp.asarray(_correct(x, metric, threshold)), jnp.asarray(x.lengths, jnp.float32), *_g(x),
                            max_length=float(max_length or x.max_new_tokens), alpha=alpha)
    return _replace(x, r)


def otc(x: ShapingInputs, *, metric: str | None = None, threshold: float = 1.0, calls_metric: str | None = None,
        call_tag: str = "<tool_call>", c: float = 1.0, alpha: float = 1.0, mode: str = "grpo") -> np.ndarray:
    """OTC: correctness times tool efficiency; the calls are a reward function's score
    (``calls_metric``) or, by default, the occurrences of ``call_tag`` in the completion."""
    if calls_metric is not None:
        calls = _metric(x, calls_metric)
    else:
        calls = np.array([len(re.findall(re.escape(call_tag), t)) for t in x.completions], np.float64)
    r = core.otc_tool_reward(jnp.asarray(_correct(x, metric, threshold)), jnp.asarray(calls, jnp.float32), *_g(x),
                             c=c, alpha=alpha, mode=mode)
    return _replace(x, r)


def fapo(x: ShapingInputs, *, flaw_metric: str, metric: str | None = None, threshold: float = 1.0,
         flaw_threshold: float = 0.5, penalty: float = 1.0) -> np.ndarray:
    """FAPO: +-1 by correctness, minus ``penalty`` where reward function ``flaw_metric`` (a
    generative reward model's verdict) is at least ``flaw_threshold``."""
    flawed = _metric(x, flaw_metric) >= flaw_threshold
    return _replace(x, core.fapo_reward(jnp.asarray(_correct(x, metric, threshold)), jnp.asarray(flawed),
                                        penalty=penalty))


def posterior(x: ShapingInputs, *, format_metric: str, outcome_metric: str, thinking_metric: str) -> np.ndarray:
    """Posterior-GRPO: format + outcome + outcome x thinking score, from three reward functions."""
    r = core.posterior_reward(*(jnp.asarray(_metric(x, k), jnp.float32)
                                for k in (format_metric, outcome_metric, thinking_metric)))
    return _replace(x, r)


_EMPTY = ("<no answer>",)  # a key no extracted answer equals


def empo(x: ShapingInputs, *, threshold: bool = True, empty_reward_zero: bool = True) -> np.ndarray:
    """EMPO: the share of the group with the same final answer (no label needed). With
    ``empty_reward_zero`` (the authors' TRL version) a group's responses without an answer form
    one cluster that counts in the shares and the entropy threshold and is rewarded 0; without
    it (their verl version) each is a cluster of its own rewarded ``1/G``."""
    keys = final_answer(list(x.completions))
    empty = np.array([k is None for k in keys])
    if empty_reward_zero:  # the authors' TRL version: the group's empty answers are one cluster ("")
        keys = [_EMPTY if k is None else k for k in keys]
    ids = cluster_ids(keys, np.asarray(x.group_ids))  # (verl version: each empty answer a cluster of its own)
    empty = empty if empty_reward_zero else None
    r = core.empo_reward(jnp.asarray(ids), *_g(x), empty=None if empty is None else jnp.asarray(empty),
                         threshold=threshold)
    return _replace(x, r)


def self_play(x: ShapingInputs, *, metric: str | None = None, preference: str = "hard", temperature: float = 1.0
              ) -> np.ndarray:
    """Minimaximalist SPO: the win rate against the group's other samples, under a preference
    derived from a reward function's score: ``hard`` (``1[s_i > s_j]``, ties 0.5) or
    ``bradley_terry`` (``sigmoid((s_i - s_j) / temperature)``). (A judge's own pairwise
    preferences go through :func:`jaxrl_llm.core.self_play_win_rate` directly.)"""
    if preference not in ("hard", "bradley_terry"):
        raise ValueError(f"recipe.shaping.preference must be 'hard' or 'bradley_terry', got {preference!r}")
    if not temperature > 0:
        raise ValueError(f"recipe.shaping.temperature must be > 0, got {temperature!r}")
    s = _metric(x, metric)
    d = s[:, None] - s[None]
    p = (d > 0) + 0.5 * (d == 0) if preference == "hard" else 1.0 / (1.0 + np.exp(-d / temperature))
    return _replace(x, core.self_play_win_rate(jnp.asarray(p, jnp.float32), *_g(x)))


#: a region ``[start, end]`` in a completion (the last one counts)
REGION_RE = r"\[\s*(\d+)\s*,\s*(\d+)\s*\]"


def parse_regions(completions, pattern: str = REGION_RE, max_value: int = 2**31 - 1
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(starts, ends, has_region)`` of the last ``pattern`` match (two integer groups) in each
    completion; no match, ``start > end`` or ``end > max_value``: no region."""
    rx = re.compile(pattern)
    if rx.groups != 2:
        raise ValueError(f"recipe.shaping.pattern must have exactly two groups (start, end), got {pattern!r}")
    n = len(completions)
    st, en, has = np.zeros(n, np.int32), np.zeros(n, np.int32), np.zeros(n, bool)
    for i, c in enumerate(completions):
        found = rx.findall(c)
        if found:
            a, b = (int(v) for v in found[-1])
            if a <= b <= max_value:  # a region past the grid (or past int32) is no region
                st[i], en[i], has[i] = a, b, True
    return st, en, has


def region_consistency(x: ShapingInputs, *, pattern: str = REGION_RE, max_cells: int = 4096) -> np.ndarray:
    """GUI-RCPO: the reward is the mean vote of the group's regions over the response's own region
    (:func:`jaxrl_llm.core.region_consistency_reward`), no label used; regions parsed from the
    completions with ``pattern`` (default ``[start, end]``, inclusive integers)."""
    if not (isinstance(max_cells, int) and max_cells >= 1):
        raise ValueError(f"recipe.shaping.max_cells must be an int >= 1, got {max_cells!r}")
    # a region past the grid is a response that predicted nothing usable: no region, reward 0
    st, en, has = parse_regions(list(x.completions), pattern, max_value=max_cells - 1)
    grid = int(en[has].max()) + 1 if has.any() else 1
    grid = 1 << max(grid - 1, 0).bit_length()  # a power of two: few distinct compiled shapes
    r = core.region_consistency_reward(jnp.asarray(st), jnp.asarray(en), jnp.asarray(has), *_g(x), grid=grid)
    return _replace(x, r)


def cgpo(x: ShapingInputs, *, reward_metric: str, judges: tuple = (), baseline_metric: str | None = None,
         judge_threshold: float = 0.5) -> np.ndarray:
    """CGPO / CRPG: the reward model's score (reward function ``reward_metric``) calibrated
    against a baseline response's score (reward function ``baseline_metric``, e.g. one that
    scores the data's reference answer with the same reward model; default 0) and set to 0 where
    any judge (the reward functions named in ``judges``, a score ``< judge_threshold`` meaning a
    violation; "does not apply" passes) flags the response
    (:func:`jaxrl_llm.core.cgpo_calibrated_reward`)."""
    judges = (judges,) if isinstance(judges, str) else tuple(judges)
    r = _metric(x, reward_metric)
    base = _metric(x, baseline_metric) if baseline_metric is not None else np.zeros_like(r)
    feasible = np.ones(len(r), bool)
    for j in judges:
        if j not in x.per_fn:
            raise ValueError(f"recipe.shaping=cgpo: judge {j!r} is not a reward function of the run; the rewards are "
                             f"{sorted(x.per_fn)}")
        v = np.asarray(x.per_fn[j], np.float64)
        feasible &= np.isnan(v) | (v >= judge_threshold)
    out = core.cgpo_calibrated_reward(jnp.asarray(r, jnp.float32), jnp.asarray(base, jnp.float32),
                                      jnp.asarray(feasible))
    return _replace(x, out)


def cosine_length(x: ShapingInputs, *, metric: str | None = None, threshold: float = 1.0, weight: float = 1.0,
                  max_length: float = 1000.0, unit: str = "chars", min_correct: float = 0.5, max_correct: float = 1.0,
                  min_wrong: float = -0.5, max_wrong: float = 0.0, clamp_length: bool = False) -> np.ndarray:
    """The cosine length reward (:func:`jaxrl_llm.core.cosine_length_reward`) times ``weight`` in
    place of the correctness reward: of reward function ``metric`` (the others kept), or of the
    total when ``metric`` is unset. Lengths in characters of the completion (``unit="chars"``,
    Open-RS's code) or tokens."""
    if unit not in ("chars", "tokens"):
        raise ValueError(f"recipe.shaping.unit must be 'chars' or 'tokens', got {unit!r}")
    lengths = (np.array([len(c) for c in x.completions], np.float32) if unit == "chars"
               else np.asarray(x.lengths, np.float32))
    r = core.cosine_length_reward(jnp.asarray(_correct(x, metric, threshold)), jnp.asarray(lengths),
                                  max_length=max_length, min_correct=min_correct, max_correct=max_correct,
                                  min_wrong=min_wrong, max_wrong=max_wrong, clamp_length=clamp_length)
    replaced = _metric(x, metric)  # the correctness reward's contribution to the total, removed
    return (weight * np.asarray(r, np.float64) - replaced).astype(np.float32)


#: what marks a refusal (the Auto-CEI code's phrases, matched case-insensitively)
IDK_PHRASES = ("i don't know", "sorry", "too difficult", "unfortunate", "no answer")


def auto_cei(x: ShapingInputs, *, metric: str | None = None, threshold: float = 1.0, c1: float = 13.0, c2: float = 0.4,
             phrases: tuple = IDK_PHRASES, step_sep: str = "\n", steps: str = "code") -> np.ndarray:
    """Auto-CEI's reward (:func:`jaxrl_llm.core.auto_cei_reward`) in place of the total: a
    completion containing one of ``phrases`` is a refusal, scored by its reasoning steps; others
    +1 when the reward function ``metric`` (default the total) is at least ``threshold``, else -1.
    ``steps="code"`` (the authors' ``reward_processor``) counts the pieces of the whole completion
    split at ``step_sep`` (``"\n"``; their MATH setting: ``".\n"``), empty ones included;
    ``steps="before"`` counts only the non-empty pieces before the refusal (the paper's wording)."""
    phrases = tuple(p.lower() for p in ((phrases,) if isinstance(phrases, str) else phrases))
    if not phrases or not step_sep:
        raise ValueError("recipe.shaping=auto_cei: phrases and step_sep must not be empty")
    if steps not in ("code", "before"):
        raise ValueError(f"recipe.shaping.steps must be 'code' or 'before', got {steps!r}")
    refused, counts = [], []
    for text in x.completions:
        low = text.lower()
        at = [low.find(p) for p in phrases if p in low]
        refused.append(bool(at))
        if steps == "code":
            counts.append(len(text.split(step_sep)))
        else:
            before = text[:min(at)] if at else text
            counts.append(sum(1 for piece in before.split(step_sep) if piece.strip()))
    r = core.auto_cei_reward(jnp.asarray(_correct(x, metric, threshold)), jnp.asarray(refused),
                             jnp.asarray(counts, jnp.float32), c1=c1, c2=c2)
    return _replace(x, r)


def trailing_loop_fraction(ids, min_repeats: int = 2) -> float:
    """The share of ``ids`` inside the repeating block the sequence ends with, CAMPO's ``f(o)``
    (0.0 without one): for every period ``p`` from 1 to ``len // min_repeats``, the copies of the
    last ``p`` tokens that precede it back to back are counted; a period with at least
    ``min_repeats`` copies in all is a loop, and the loop of the *longest* such period sets the
    start (the authors' ``find_infinite_loop_start``, exact token matching, MiroMind-M1 @3ace1ab)."""
    a = np.asarray(ids)
    n = len(a)
    start = None
    for p in range(1, n // min_repeats + 1):
        copies, right = 1, n - p
        while right - p >= 0 and np.array_equal(a[right - p:right], a[right:right + p]):
            copies += 1
            right -= p
        if copies >= min_repeats:
            start = right
    return 0.0 if start is None else (n - start) / n


def campo(x: ShapingInputs, *, coef: float = 1.0, constant: float | None = None, min_repeats: int = 2) -> np.ndarray:
    """CAMPO's repetition penalty (:func:`jaxrl_llm.core.campo_repetition_penalty`) subtracted
    from the total of the responses cut at the length cap that end in a loop
    (:func:`trailing_loop_fraction` of their token ids)."""
    if isinstance(min_repeats, bool) or not isinstance(min_repeats, int) or min_repeats < 2:
        raise ValueError(f"recipe.shaping=campo: min_repeats must be an int >= 2, got {min_repeats!r}")
    cut = np.asarray(x.lengths) >= x.max_new_tokens  # only responses cut at the cap are checked (the code's)
    frac = np.array([trailing_loop_fraction(t, min_repeats) if c else 0.0 for t, c in zip(x.token_ids, cut)],
                    np.float32)
    pen = core.campo_repetition_penalty(jnp.asarray(frac), jnp.asarray(cut), coef=coef, constant=constant)
    return -np.asarray(pen, np.float32)


#: GTAlign's payoff matrix: the user's question clear (DQ) or vague (VQ) x the model's answer
#: (AQ: answer and ask, CQ: clarifying question, DA: direct answer), each cell ``{"LLM": x, "user": y}``
GTALIGN_CELLS = ("DQ_AQ", "DQ_CQ", "DQ_DA", "VQ_AQ", "VQ_CQ", "VQ_DA")
_GTALIGN_LAYOUT = re.compile(r"^<thinking>.*?</thinking>\s*<payoff>.*?</payoff>\s*<analyze>.*?</analyze>\s*"
                             r"<response>.*?</response>$", re.DOTALL | re.MULTILINE)


def _tag(text: str, tag: str) -> str | None:
    m = re.search(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)
    return None if m is None else m.group(1).strip()


def _payoff(block: str) -> dict | None:
    """The payoff matrix of a ``<payoff>`` block (JSON or a Python literal; curly quotes
    straightened), or None when it is not the six cells of two numbers each."""
    import ast
    import json

    try:
        data = json.loads(block)
    except RecursionError:
        return None
    except ValueError:
        try:
            data = ast.literal_eval(block.replace("\u201c", '"').replace("\u201d", '"').replace("\u2018", "'")
                                    .replace("\u2019", "'"))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return None
    if not isinstance(data, dict) or set(data) != set(GTALIGN_CELLS):
        return None
    for v in data.values():
        if not (isinstance(v, dict) and set(v) == {"LLM", "user"}
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v.values())):
            return None
    return data


def _length_window(n_words: float, lo: float, hi: float, k: float = 0.005) -> float:
    return 1.0 / (1.0 + math.exp(k * (lo - n_words))) / (1.0 + math.exp(k * (n_words - hi)))


def gtalign(x: ShapingInputs, *, metric: str | None = None, mode: str = "cobb_douglas",
            epsilon: float = 1e-4) -> np.ndarray:
    """GTAlign's reward (:func:`jaxrl_llm.core.mutual_welfare_reward`) in place of the total, from
    the completion's ``<thinking>``, ``<payoff>``, ``<analyze>``, ``<response>`` blocks (the
    authors' ``math_hard`` task): with ``A`` the answer score (reward function ``metric``, default
    the total, clipped to [0, 1]; the authors' LLM judge), ``F`` the layout (1 when the four
    blocks are all there in order and the payoff parses), ``P`` the payoff matrix's spread (1/12
    per cell whose two payoffs differ, 1/12 more when by over 10 %), ``l(n; lo, hi)`` a logistic
    window over the word count and ``rho = exp(-chars before <response> / 500)``:

    ``U = eps + 0.5 A + 0.2 l(response; 20, 500) + 0.3 rho``,
    ``W = eps + 0.2 F + 0.2 P + 0.4 A + 0.2 l(whole completion; 500, 1000)``;

    a completion without a ``<response>`` or a valid ``<payoff>`` block scores 0 (the code). The
    layout check is the code's regular expression with its flags: under ``re.MULTILINE`` its ``$``
    also accepts text after the last line break that follows ``</response>``."""
    acc = np.clip(_metric(x, metric), 0.0, 1.0)
    out = np.zeros(len(x.completions), np.float64)
    user, llm = np.zeros_like(out), np.zeros_like(out)
    ok = np.zeros(len(out), bool)
    for i, text in enumerate(x.completions):
        response, block = _tag(text, "response"), _tag(text, "payoff")
        pay = None if block is None else _payoff(block)
        if response is None or pay is None:
            continue
        ok[i] = True
        fmt = float(_GTALIGN_LAYOUT.match(text) is not None)
        spread = 0.0
        for v in pay.values():
            spread += (v["user"] != v["LLM"]) / 12.0
            spread += (abs(v["user"] - v["LLM"]) / max(abs(v["user"]), abs(v["LLM"]), 1e-8) > 0.1) / 12.0
        rho = math.exp(-len(text.split("<response>")[0]) / 500.0)
        user[i] = epsilon + 0.5 * acc[i] + 0.2 * _length_window(len(response.split()), 20, 500) + 0.3 * rho
        llm[i] = epsilon + 0.2 * fmt + 0.2 * spread + 0.4 * acc[i] + 0.2 * _length_window(len(text.split()), 500, 1000)
    r = np.asarray(core.mutual_welfare_reward(jnp.asarray(user, jnp.float32), jnp.asarray(llm, jnp.float32),
                                              mode=mode))
    return _replace(x, np.where(ok, r, 0.0))


A2FM_MODE = r"<classification>\s*([A-Za-z_]+)\s*</classification>"


def apo(x: ShapingInputs, *, tau: float, alpha: float = 2.0, metric: str | None = None, threshold: float = 1.0,
        format_metric: str | None = None, mode_pattern: str = A2FM_MODE, fast_mode: str = "instant") -> np.ndarray:
    """A²FM's APO reward (:func:`jaxrl_llm.core.apo_adaptive_reward`) in place of the total: the
    mode of a completion is the first match of ``mode_pattern`` (its group 1; no match: not the
    fast mode), a query's fast-mode success rate is that of its group's responses in
    ``fast_mode`` (0 without any), correctness is reward function ``metric`` (default the total)
    ``>= threshold``, the format reward function ``format_metric`` (``>= 1`` passes; unset: 1)."""
    try:
        pat = re.compile(mode_pattern)
    except re.error as e:
        raise ValueError(f"recipe.shaping=apo: mode_pattern {mode_pattern!r} is not a regular expression: {e}") from None
    if pat.groups < 1:
        raise ValueError(f"recipe.shaping=apo: mode_pattern {mode_pattern!r} needs a group capturing the mode name")
    modes = []
    for text in x.completions:
        m = pat.search(text)
        modes.append(m.group(1).strip().lower() if m and m.groups() else None)
    fast = np.array([md == fast_mode.lower() for md in modes], bool)
    correct = _correct(x, metric, threshold)
    gid = np.asarray(x.group_ids)
    rate = np.zeros(len(gid), np.float64)
    for g in np.unique(gid):
        rows = gid == g
        n = (rows & fast).sum()
        rate[rows] = (rows & fast & correct).sum() / n if n else 0.0
    fmt = None if format_metric is None else jnp.asarray(_metric(x, format_metric) >= 1.0)
    r = core.apo_adaptive_reward(jnp.asarray(correct), jnp.asarray(fast), jnp.asarray(rate, jnp.float32), fmt,
                                 tau=tau, alpha=alpha)
    return _replace(x, r)


def group_contrastive_aux(x: ShapingInputs, *, margin: float, metric: str | None = None, threshold: float = 1.0,
                          aux_pattern: str = r"<aux>.*?</aux>", aux_weight: float = 1.0, length_weight: float = 0.0,
                          max_length: float = 900.0) -> np.ndarray:
    """GeometryZero's GCPO reward terms added to the total: ``aux_weight`` x the group-contrastive
    auxiliary reward (:func:`jaxrl_llm.core.group_contrastive_aux_reward`; a completion uses the
    auxiliary step when ``aux_pattern`` matches it, the paper's ``<aux>...</aux>``) plus
    ``length_weight`` x ``min(L, max_length) / max_length`` (L in tokens; the length reward of the
    authors' pre-release code, ``ekonwang/r1_workspace`` @6ad71ad, with 0.5 and 900 there; off by
    default: the paper's form was not available to us)."""
    try:
        pat = re.compile(aux_pattern, re.DOTALL)
    except re.error as e:
        raise ValueError(f"recipe.shaping=group_contrastive_aux: aux_pattern {aux_pattern!r}: {e}") from None
    if max_length <= 0:
        raise ValueError(f"recipe.shaping.max_length must be > 0, got {max_length!r}")
    used = np.array([pat.search(t) is not None for t in x.completions], bool)
    aux = core.group_contrastive_aux_reward(jnp.asarray(used), jnp.asarray(_correct(x, metric, threshold)),
                                            *_g(x), margin=margin)
    length = np.minimum(np.asarray(x.lengths, np.float64), max_length) / max_length
    return (aux_weight * np.asarray(aux, np.float64) + length_weight * length).astype(np.float32)


HBPO_BUDGETS = (512, 1024, 2048, 2560)


def hbpo(x: ShapingInputs, *, budgets: tuple = HBPO_BUDGETS, metric: str | None = None, threshold: float = 1.0,
         beta: float = 4.0, max_length: float = 4096.0, alpha: float | None = None) -> np.ndarray:
    """HBPO's budget-aware reward; prompt group ``g`` was asked with budget ``budgets[g % k]``
    (the data pipeline's budget variants, ``data.budgets``)."""
    budget = np.asarray(budgets, np.float32)[np.asarray(x.group_ids) % len(budgets)]
    r = core.hbpo_reward(jnp.asarray(_correct(x, metric, threshold)), jnp.asarray(x.lengths, jnp.float32),
                         jnp.asarray(budget), beta=beta, max_length=max_length, alpha=alpha)
    return _replace(x, r)


def think_short(x: ShapingInputs, *, metric: str | None = None, threshold: float = 1.0,
                correctness_weight: float = 0.6, length_weight: float = 0.3, format_metric: str | None = None,
                format_weight: float = 0.1, initial_budget: float = 256.0, final_budget: float = 87.0,
                drops: int = 3, interval: int = 150, schedule: str = "exponential", r_max: float = 1.0,
                band: bool = False) -> np.ndarray:
    """Train Long, Think Short: ``w_c 1[correct] + w_l R_len(L; B(step)) + w_f format`` with the
    triangular length reward around the step's curriculum budget (``format_metric``: a reward
    function scoring the think/answer tags; without one the format term is 0)."""
    budget = core.curriculum_budget(x.step, initial=initial_budget, final=final_budget, drops=drops,
                                    interval=interval, schedule=schedule)
    r = correctness_weight * _correct(x, metric, threshold).astype(np.float32) + length_weight * np.asarray(
        core.triangular_length_reward(jnp.asarray(x.lengths), budget, r_max=r_max, band=band))
    if format_metric is not None:
        r = r + format_weight * np.nan_to_num(_metric(x, format_metric))
    return _replace(x, r)


def hapo_history(x: ShapingInputs, *, metric: str | None = None, threshold: float = 1.0, weight: float = 1.0,
                 floor: float = -0.7, mode: str = "cosine") -> tuple[np.ndarray, dict]:
    """HAPO (history-aware): correctness plus the length reward against the prompt's shortest
    correct response so far; the history (prompt key -> length; the prompt text where there are
    no keys) is this part's state (its slot of the prompt store) and is updated with the batch
    after scoring (the reward uses the history from before)."""
    state = dict(x.state or {})
    keys = x.prompt_keys or x.prompts
    hist = np.array([state.get(p, 0.0) for p in keys], np.float32)  # 0: no correct response yet
    gid = np.asarray(x.group_ids, np.int32)
    correct = _correct(x, metric, threshold)
    r = core.hapo_history_reward(jnp.asarray(correct), jnp.asarray(x.lengths), jnp.asarray(hist[gid]), weight=weight,
                                 floor=floor, mode=mode)
    new = np.asarray(core.hapo_history_update(jnp.asarray(hist), jnp.asarray(correct), jnp.asarray(x.lengths),
                                              jnp.asarray(gid), x.num_groups))
    for p, h in zip(keys, new):
        if h > 0:  # the same prompt twice in a batch: the shorter of the two
            state[p] = min(float(h), state.get(p, float("inf")))
    return _replace(x, r), state


_TEXT = (("needs_text", True),)
for _part in (
    Part("thinkless", thinkless, paper="Thinkless: LLM Learns When to Think (Fang et al.), arXiv:2505.13379",
         core=("thinkless_reward",), methods=(136,), verified="hand values", tests=_T,
         flags=(("needs_text", "raw"),),  # the control tokens are often special tokens
         note="short-correct 1, think-correct 0.5, wrong -1 (the authors' values); with recipe.loss=thinkless"),
    Part("grpo_lambda", grpo_lambda, paper="Stable Reinforcement Learning for Efficient Reasoning (GRPO-lambda), "
                                           "arXiv:2505.18086",
         core=("grpo_lambda_reward", "kimi_length_reward"), methods=(115,), verified="hand values", tests=_T,
         note="top-lambda groups by accuracy get Kimi's length reward (the penalty form is our reading; no code)"),
    Part("concise", concise, paper="Walk Before You Run! Concise LLM Reasoning via Reinforcement Learning "
                                   "(ConciseR), arXiv:2505.21178",
         core=("concise_reward",), methods=(117,), verified="hand values, paper identity", tests=_T,
         note="length bonus only in all-correct groups; the linear form and alpha are our reading (no code)"),
    Part("otc", otc, paper="OTC: Optimal Tool Calls via Reinforcement Learning (Wang et al.), arXiv:2504.14870",
         core=("otc_tool_reward",), methods=(60,), verified="hand values, paper identity", tests=_T, flags=_TEXT,
         note="calls counted from <tool_call> tags unless calls_metric names a reward function"),
    Part("fapo", fapo, paper="FAPO: Flawed-Aware Policy Optimization for Efficient and Reliable Reasoning, "
                             "arXiv:2510.22543",
         core=("fapo_reward",), methods=(30,), verified="hand values, paper identity", tests=_T,
         note="flaw_metric: a reward function flagging flawed reasoning (the paper's generative reward model)"),
    Part("posterior", posterior, paper="Posterior-GRPO: Rewarding Reasoning Processes in Code Generation, "
                                       "arXiv:2508.05170",
         core=("posterior_reward",), methods=(89,), verified="hand values", tests=_T,
         note="three reward functions by name: format, outcome, thinking score in [0, 1]"),
    Part("empo", empo, paper="Right Question is Already Half the Answer: Fully Unsupervised LLM Reasoning "
                             "Incentivization (EMPO), arXiv:2504.05812",
         core=("empo_reward",), methods=(15,), verified="hand values", tests=_T, flags=_TEXT,
         note="replaces the reward by the answer's share of the group (final answers as clusters); no label used"),
    Part("region_consistency", region_consistency,
         paper="Test-Time Reinforcement Learning for GUI Grounding via Region Consistency (GUI-RC / GUI-RCPO; Du et "
               "al.), arXiv:2508.05615",
         core=("region_consistency_reward",), methods=(98,), verified="hand values, paper identity (unanimous "
                                                                      "regions: 1; isolated: 1/K)",
         tests=_T + ", tests/tasks/test_span_grounding.py", flags=_TEXT,
         note="replaces the reward by the mean vote of the group's predicted regions over the response's own region "
              "(test-time RL, no label); the screen's 2-D boxes become 1-D [start, end] spans (the span-grounding "
              "task, tasks.span_grounding); normalisations are our reading (code not available)"),
    Part("cgpo", cgpo, paper="The Perfect Blend: Redefining RLHF with Mixture of Judges (CGPO; Xu et al.), "
                             "arXiv:2409.20370",
         core=("cgpo_calibrated_reward",), methods=(54,), verified="hand values",
         tests=_T,
         note="CRPG's reward: sigmoid(r - r_base) from a reward model's scores (reward_metric, baseline_metric: reward "
              "functions by name), 0 where a judge (reward functions in judges, < judge_threshold) flags a "
              "violation; not reproduced: per-task stratification and the CODPO / CRRAFT optimisers"),
    Part("cosine_length", cosine_length,
         paper="Demystifying Long Chain-of-Thought Reasoning in LLMs (Yeo et al.), arXiv:2502.03373; as used by "
               "Open-RS (Dang and Ngo), arXiv:2503.16219",
         core=("cosine_length_reward",), verified="hand values (the Open-RS code's formula and defaults)",
         tests=_T, flags=_TEXT,
         note="replaces the correctness reward (metric) by weight x the cosine of the length: 1.0 -> 0.5 correct, "
              "0.0 -> -0.5 wrong over max_length characters (Open-RS's code; unit=tokens for tokens); past max_length "
              "the cosine rises again as in that code (clamp_length=true holds it); the open_rs preset's reward"),
    Part("auto_cei", auto_cei, paper="Automatic Curriculum Expert Iteration for Reliable LLM Reasoning (Auto-CEI; "
                                     "Zhao et al.), arXiv:2410.07627",
         core=("auto_cei_reward",), methods=(193,), verified="hand values (the authors' code's reward and phrases)",
         tests=_T + ", tests/conformance/test_auto_cei.py", flags=_TEXT,
         note="+1 right, -1 wrong, a refusal (\"I don't know\", ...) scored tanh(c2 (steps - c1) / 2) by its "
              "reasoning steps (the completion's lines, as the code counts them; steps=before: the non-empty lines "
              "before the refusal); not reproduced: the expert iteration and the hill-climbing "
              "curriculum that moves c1 (c1, c2 are arguments; 13 and 0.4 the code's defaults)"),
    Part("campo", campo, paper="MiroMind-M1: An Open-Source Advancement in Mathematical Reasoning via Context-Aware "
                               "Multi-Stage Policy Optimization (CAMPO), arXiv:2507.14683",
         core=("campo_repetition_penalty",), methods=(141,),
         verified="hand values (the paper's penalty; the authors' code's loop detection and constant, "
                  "MiroMindAsia/MiroMind-M1 @3ace1ab)", tests=_T + ", tests/conformance/test_campo_loop.py",
         flags=(("needs_ids", True),),
         note="responses cut at rollout.max_new_tokens that end in a repeating block lose coef x the block's share "
              "of the response (the paper's f(o); constant=0.1: the released code's flat penalty); not reproduced: "
              "the length-progressive stages (16K -> 32K -> 48K: runs with a growing rollout.max_new_tokens, resumed "
              "from each other) and DAPO's dynamic sampling (recipe.group_filter)"),
    Part("gtalign", gtalign, paper="GTAlign: Game-Theoretic Alignment of LLM Assistants for Social Welfare, "
                                   "arXiv:2510.08872",
         core=("mutual_welfare_reward",), methods=(259,),
         verified="hand values (the authors' code's welfare terms and constants, ulab-uiuc/GTAlign @1e35360)",
         tests=_T + ", tests/conformance/test_gtalign.py", flags=_TEXT,
         note="sqrt(user welfare x model welfare) from the answer score (metric), the <thinking>/<payoff>/<analyze>/"
              "<response> layout, the payoff matrix's spread, length windows and the reasoning's brevity; "
              "mode=linear: the mean (the paper's ablation); not reproduced: the LLM judge (the run's verifier scores "
              "the answer), the pricing-aware inference, the PPO critic (recipe.name=ppo)"),
    Part("apo", apo, paper="A²FM: An Adaptive Agent Foundation Model for Tool-Aware Hybrid Reasoning (APO), "
                           "arXiv:2510.12838",
         core=("apo_adaptive_reward",), methods=(4,),
         verified="hand values (the paper's reward from secondary write-ups: no training code released)",
         tests=_T, flags=_TEXT,
         note="accuracy x (1 - p^2 for a slow mode on a query whose fast mode succeeds with rate p > tau) x format; "
              "the mode from a <classification> tag; tau has no default; not reproduced: the rollouts forced into "
              "each mode by prefix injection (p is the group's own fast-mode responses' success rate), the LLM "
              "judge, the route-then-align SFT"),
    Part("group_contrastive_aux", group_contrastive_aux,
         paper="GeometryZero: Improving Geometry Solving for LLM with Group Contrastive Policy Optimization (GCPO), "
               "arXiv:2506.07160",
         core=("group_contrastive_aux_reward",), methods=(213,),
         verified="hand values (the paper's Eq. 3; the masking's cases reconstructed from reviews, margin required)",
         tests=_T, flags=_TEXT,
         note="+1 / -1 / 0 for an <aux> step by whether its group's responses with it are right more or less often "
              "than those without (by > margin), plus an optional capped length reward; not reproduced: the exact "
              "Eq. 4 and margin, the length reward's form, the geometry data and tool execution"),
    Part("hbpo", hbpo, paper="Hierarchical Budget Policy Optimization for Adaptive Reasoning (HBPO), arXiv:2507.15844",
         core=("hbpo_reward",), methods=(2,), verified="hand values (the authors' code), paper identity (f1(b, b) = "
                                                      "f2(b))", tests=_T,
         note="min(f1, f2) for correct answers, 0 wrong; needs data.budgets equal to budgets (prompt group g is "
              "budget g % k); with recipe.advantage=hbpo"),
    Part("think_short", think_short, paper="Train Long, Think Short: Curriculum Learning for Efficient Reasoning, "
                                           "arXiv:2508.08940",
         core=("triangular_length_reward", "curriculum_budget"), methods=(92,),
         verified="hand values (the paper's formulas; no code released)", tests=_T,
         note="triangular length reward around a budget that decays 256 -> 87 tokens in 3 drops every 150 steps "
              "(the paper's run); weights 0.6/0.3 are the paper's ablation setting (its main run's are not stated)"),
    Part("hapo_history", hapo_history, paper="HAPO: Training Language Models to Reason Concisely via History-Aware "
                                             "Policy Optimization, arXiv:2505.11225",
         core=("hapo_history_reward", "hapo_history_update"), methods=(10,),
         verified="hand values (the authors' code)", tests=_T, flags=(("stateful", True),),
         note="per-prompt history (shortest correct length so far) in the run's prompt store, checkpointed; cosine "
              "length reward, floor -0.7 for correct rows, never positive for wrong ones"),
    Part("self_play", self_play, paper="A Minimaximalist Approach to Reinforcement Learning from Human Feedback "
                                       "(Swamy et al.), arXiv:2401.04056",
         core=("self_play_win_rate",), methods=(32,), verified="hand values, paper identity", tests=_T,
         note="win rate within the group under a preference from a reward function's score (hard or "
              "Bradley-Terry)"),
):
    SHAPING.register(_part)
