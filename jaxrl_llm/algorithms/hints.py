"""Hints for prompts the policy cannot solve yet: part of the reference solution in the prompt.

With ``recipe.hints=<name>`` the RL loop asks the part, after a round is scored, which groups
to sample again with a hinted prompt; it samples them (the same number of completions, the
same policy), scores them and trains on the hinted groups in their hinted context (the hint is
prompt, so it is never in the loss, and the log-probs are the policy's in that context). It
asks again with the new outcomes (``stage`` counts the asks) until the part returns no group.
The prompt statistics, the reward metrics and a replay buffer see the round as first sampled.

A part is ``fn(x: HintInputs, **params) -> {group: hinted raw prompt}``; with the flag
``levels`` it returns ``{group: [hinted raw prompt of each level, mildest first]}`` and the loop
samples one response per level, takes the mildest level whose response scores ``> 0`` and puts
that response in the group's first row, trained after the plain prompt (Scaf-GRPO); a group
without such a level is left as it was. Its flag ``context``
says where the hinted groups are trained: ``"hinted"`` (the default: GHPO, the hint is part of
the prompt trained on) or ``"plain"`` (Guide: the responses sampled with the hint are trained
after the plain prompt, their old log-probs the sampler's in the hinted context, so the ratio
is an importance ratio between the two contexts; the loop marks those rows, the ``hinted``
input of ``recipe.loss=guide``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxrl_llm.algorithms.registry import Part, new_registry

__all__ = ["HintInputs", "HINTS", "add_hint", "trains_in_plain_context", "SCAF_SYSTEM", "icpo_prompt"]


@dataclasses.dataclass(frozen=True)
class HintInputs:
    """What a hint part sees for one round: ``values`` ``[N]`` each row's outcome (the reward
    total or the reward function named by the part's ``metric``, "does not apply" counting 0),
    ``group_ids`` ``[N]``, ``columns`` the data columns per group (the reference solution is
    one), ``raw_prompts`` each group's prompt as the data gives it (a string or chat messages)
    before any hint, ``hinted`` the groups hinted in earlier stages, ``stage`` the number of
    earlier asks this round, ``step`` the iteration and ``completions`` each row's decoded
    response (parts flagged ``needs_text``; else empty)."""

    values: np.ndarray
    group_ids: np.ndarray
    columns: Mapping[str, list]
    raw_prompts: tuple[Any, ...]
    hinted: frozenset
    stage: int
    step: int
    completions: tuple[str, ...] = ()


HINTS = new_registry("hints", "recipe.hints", "fn(x: HintInputs, **params) -> {group: hinted raw prompt}")

#: GHPO's text before the solution prefix (the authors' ``ghpo_trainer.py``)
GHPO_TEXT = ("\n The following text is the beginning part of the answer, which you can refer to for solving the "
             "problem:\n")


def trains_in_plain_context(bound) -> bool:
    """True for a bound hint part whose hinted groups train after the plain prompt (Guide)."""
    return bound is not None and bound.part.flag("context", "hinted") == "plain"


def add_hint(raw: Any, text: str) -> Any:
    """``raw`` with ``text`` appended to its (last) user message."""
    if isinstance(raw, str):
        return raw + text
    msgs = [dict(m) for m in raw]
    for m in reversed(msgs):
        if m.get("role") == "user":
            m["content"] = str(m["content"]) + text
            return msgs
    raise ValueError("a chat prompt without a user message cannot take a hint")


def _column(x: HintInputs, part: str, column: str, what: str, key: str = "column") -> list:
    """The data column ``column`` of the round's groups, or an error naming the config key."""
    if column not in x.columns:
        raise ValueError(f"recipe.hints={part} reads {what} from data column {column!r}; the data has "
                         f"{sorted(x.columns)} (set recipe.hints.{key})")
    return x.columns[column]


def _none(x: HintInputs):
    return {}


HINTS.register(Part("none", _none, note="no hints"))


def ghpo(x: HintInputs, *, column: str = "solution", fractions=(0.25, 0.5, 0.75), start_step: int = 0,
         template: str = GHPO_TEXT, metric: str | None = None):
    """GHPO's guidance (arXiv:2507.10628; the authors' ``hkgc-1/GHPO`` @af0a7dd,
    ``src/ghpo/ghpo_trainer.py``): a group whose outcomes are all ``<= 0`` is sampled again with
    the first ``round(len(solution) * w)`` characters of the reference solution appended to the
    user message after ``template``, for ``w`` in ``fractions`` in turn (stage ``s`` uses
    ``fractions[s]``), each stage on the groups still all-fail; the last stage's samples stay
    whatever they score. From training step ``start_step`` on. ``metric``: the reward function
    whose outcome decides (GHPO: the accuracy reward, not the total); default the total."""
    del metric  # read by the loop (the values it passes)
    return _solution_prefixes(x, "ghpo", column, fractions, start_step, template)


def _solution_prefixes(x: HintInputs, part: str, column: str, fractions, start_step: int, template: str) -> dict:
    """Stage ``s``: the all-fail groups (stage 0) or those hinted before that still fail get
    ``template`` and the first ``round(len(solution) * fractions[s])`` characters of their
    solution appended to the user message."""
    fractions = tuple(float(f) for f in fractions)
    if not fractions or any(not 0.0 < f <= 1.0 for f in fractions):
        raise ValueError(f"recipe.hints.fractions must be numbers in (0, 1], got {list(fractions)}")
    if list(fractions) != sorted(set(fractions)):
        raise ValueError(f"recipe.hints.fractions must increase (each stage a longer prefix), got {list(fractions)}")
    if x.stage >= len(fractions) or x.step < start_step:
        return {}
    sols = _column(x, part, column, "the reference solution")
    vals = np.nan_to_num(np.asarray(x.values, np.float64), nan=0.0)
    gid = np.asarray(x.group_ids)
    w = fractions[x.stage]
    out = {}
    for g in range(len(x.raw_prompts)):
        rows = gid == g
        if rows.any() and (vals[rows] <= 0).all() and (x.stage == 0 or g in x.hinted):
            sol = str(sols[g])
            out[g] = add_hint(x.raw_prompts[g], template + sol[:round(len(sol) * w)])
    return out


HINTS.register(Part(
    "ghpo", ghpo, paper="GHPO: Adaptive Guidance for Stable and Efficient LLM Reinforcement Learning (Liu et al.), "
                        "arXiv:2507.10628", methods=(128,), verified="hand values (the authors' code's rules)",
    tests="tests/training/test_hints.py",
    note="the authors' code (hkgc-1/GHPO @af0a7dd): all-fail groups (outcome <= 0; metric=<the accuracy reward>) "
         "re-sampled with 25%, then 50%, then 75% of the solution's characters appended to the prompt, all within "
         "the step; trained in the hinted context with no ratio correction; tasks give the solution in a column "
         "(default 'solution')"))


#: POPE's instruction before the oracle prefix (our wording: the paper instructs the model to build on it)
POPE_TEXT = ("\nBelow is the beginning of a correct solution. Continue from where it stops and finish solving the "
             "problem:\n")


def pope(x: HintInputs, *, column: str = "solution", fractions=(0.125, 0.25, 0.5, 0.75), start_step: int = 0,
         template: str = POPE_TEXT, metric: str | None = None):
    """POPE, Privileged On-Policy Exploration (Qu, Setlur, Smith, Salakhutdinov and Kumar,
    arXiv:2601.18779): a hard problem (every sampled response fails: outcome ``<= 0``) is
    explored again on-policy with a prefix of its oracle (reference) solution in the prompt and an
    instruction to build on it, and the policy is trained on those guided rollouts in the guided
    context. The oracle text is never a training target (it is prompt), which is the method's
    point against SFT or off-policy use of the solutions. The paper uses the *minimally
    sufficient* prefix: the search here grows the prefix over ``fractions`` (shortest first) within
    the step, stopping for each problem at the first length under which one of its responses
    scores ``> 0``; the last length's rollouts stay whatever they score.

    What is not reproduced: the paper trains on a mixture of guided and unguided prompts, keeping
    the unguided copy of a hard problem in the batch; here the guided group takes the unguided
    group's place (an all-fail group gives GRPO no gradient, so the update differs only through
    the aggregation's counts); its prefixes are chosen per problem before training, here online;
    the instruction wording and the default fractions are ours (the paper's code was not
    available to us). ``metric``: the reward function whose outcome decides (default the total)."""
    del metric  # read by the loop (the values it passes)
    return _solution_prefixes(x, "pope", column, fractions, start_step, template)


HINTS.register(Part(
    "pope", pope, paper="POPE: Learning to Reason on Hard Problems via Privileged On-Policy Exploration (Qu et al.), "
                        "arXiv:2601.18779", methods=(254,), verified="hand values",
    tests="tests/training/test_hints.py",
    note="all-fail problems explored again with the shortest prefix of the oracle solution (12.5%, 25%, 50%, 75% of "
         "its characters, in turn within the step) under which a response succeeds, after an instruction to build on "
         "it; trained on-policy in the guided context; the guided group replaces the unguided one (the paper keeps "
         "both) and the prefixes are found online (the paper: before training)"))


#: the text before a hint appended to the prompt by ``recipe.hints=guide`` with ``replace=false``
GUIDE_TEXT = "\nHint: "


def guide(x: HintInputs, *, column: str = "hint", replace: bool = True, template: str = GUIDE_TEXT,
          threshold: float = 0.0, start_step: int = 0, metric: str | None = None):
    """Guide's re-roll (arXiv:2506.13923; the authors' ``vaskar-open-source-research/guide_rl``
    @2f27715, ``ray_trainer.py``): a group whose mean outcome is ``<= threshold`` (0 of G
    correct) is sampled once more from the hinted prompt, from training step ``start_step``
    on. The hint is a data column: with ``replace`` (the authors' data) the column holds the
    whole hinted prompt, else its text is appended to the user message after ``template``.
    The loop trains the hinted responses after the *plain* prompt (flag ``context="plain"``);
    ``recipe.loss=guide`` reshapes their ratio. ``metric``: the reward function whose outcome
    decides (default the total)."""
    del metric  # read by the loop
    if x.stage > 0 or x.step < start_step:
        return {}
    hints = _column(x, "guide", column, "each problem's hint")
    vals = np.nan_to_num(np.asarray(x.values, np.float64), nan=0.0)
    gid = np.asarray(x.group_ids)
    out = {}
    for g in range(len(x.raw_prompts)):
        rows = gid == g
        if not rows.any() or vals[rows].mean() > threshold:
            continue
        text = hints[g]
        if text is None or (isinstance(text, str) and not text):
            continue  # a problem without a hint is not re-rolled
        if replace:
            if not isinstance(text, (str, list, tuple)):
                raise ValueError(f"recipe.hints=guide: data column {column!r} must hold the hinted prompt (a string or "
                                 f"chat messages) with replace=true; group {g} has {type(text).__name__}")
            out[g] = text if isinstance(text, str) else [dict(m) for m in text]
        else:
            out[g] = add_hint(x.raw_prompts[g], template + str(text))
    return out


HINTS.register(Part(
    "guide", guide, paper="Adaptive Guidance Accelerates Reinforcement Learning of Reasoning Models (Guide; Nath et "
                          "al.), arXiv:2506.13923", methods=(263,), verified="hand values (the authors' code's rules)",
    tests="tests/training/test_hints.py", flags=(("context", "plain"),),
    note="the authors' code (vaskar-open-source-research/guide_rl @2f27715): groups with 0 of G correct re-rolled once "
         "from the hinted prompt (a data column, default 'hint'), trained after the plain prompt with the hinted "
         "context's old log-probs; use with recipe.loss=guide (the reshaped, unclipped ratio r/(r + gamma)) and "
         "recipe.group_filter=dynamic_sampling (the code keeps groups with 0 < accuracy < 1, hinted or not); the "
         "code's truncation of re-rolled prompts to a multiple of the world size is not reproduced"))


#: Critique-GRPO's refinement request (the authors' ``refine_prompt``, critique-GRPO @e8f03a2,
#: ``verl/verl/critique_grpo/refinement_prompts.py``; its lines' source indentation left out)
CRITIQUE_REFINE = ("Given the following inputs:\n**Question**: {question}\n**Previous Solution**: {solution}\n"
                   "**Critique**: {critique}\n\nPlease re-answer by:\n- Correcting potential errors identified in the "
                   "critique, if they exist.\n- Providing clear, step-by-step reasoning.\n- Formatting the final answer "
                   "as `\\boxed{{answer}}`.\n\nEnsure the revised solution addresses all issues raised in the "
                   "critique.")
CRITIQUE_SYSTEM = "You are a helpful assistant."


def critique_grpo(x: HintInputs, *, critique: str = "simple_gt", column: str = "answer",
                  template: str = CRITIQUE_REFINE, system: str | None = CRITIQUE_SYSTEM, metric: str | None = None):
    """Critique-GRPO's refinements (arXiv:2506.03106; the authors' ``zhangxy-2019/critique-GRPO``
    @e8f03a2, ``verl/verl/critique_grpo/``): every response of every group gets a numerical
    critique -- ``simple`` "The generated solution is correct." / "... incorrect." by its outcome
    (``> 0``: correct), ``simple_gt`` (the code's default) the same with ", the ground truth is
    {answer}." from data column ``column`` -- and a refinement prompt (``template`` with the
    question, the response and the critique; ``system`` as a system message for chat data). The
    loop samples one refinement per prompt and puts the first that succeeds, else the first, in
    the group's first row, trained after the original question (``recipe.loss=critique_grpo``
    shapes its tokens). The code's third critique, a GPT-4o chain-of-thought critique, needs an
    API judge and is not reproduced. Cost: each refinement is sampled in the round's sampler shape
    (prompts x ``num_samples``, one row kept per prompt), so a step samples ``num_samples`` times
    the authors' one refinement per response; a refinement prompt longer than the largest prompt
    bucket is not asked (counted in ``hints/too_long``), and a step where none fits is an error."""
    del metric  # read by the loop
    if critique not in ("simple", "simple_gt"):
        raise ValueError(f"recipe.hints=critique_grpo: critique must be 'simple' or 'simple_gt', got {critique!r}")
    if x.stage > 0:
        return {}
    answers = _column(x, "critique_grpo", column, "each problem's answer") if critique == "simple_gt" else None
    vals = np.asarray(x.values, np.float64)
    gid = np.asarray(x.group_ids)
    out = {}
    for g in range(len(x.raw_prompts)):
        q, chat = _question(x.raw_prompts[g]), not isinstance(x.raw_prompts[g], str)
        levels = []
        for row in np.flatnonzero(gid == g):
            verdict = "correct" if vals[row] > 0 else "incorrect"
            text = f"The generated solution is {verdict}"
            text += "." if answers is None else f", the ground truth is {answers[g]}."
            levels.append(_rebuilt(template.format(question=q, solution=x.completions[row], critique=text), chat,
                                   system))
        if levels:
            out[g] = levels
    return out


HINTS.register(Part(
    "critique_grpo", critique_grpo, paper="Critique-GRPO: Advancing LLM Reasoning with Natural Language and Numerical "
                                          "Feedback (Zhang et al.), arXiv:2506.03106",
    methods=(225,), verified="hand values (the authors' code's critiques, prompt and choice)",
    tests="tests/training/test_hints.py",
    flags=(("levels", True), ("context", "plain"), ("needs_text", True), ("keep_failed", True)),
    note="each response critiqued (correct / incorrect, with the ground truth) and refined once; the first successful "
         "refinement of a prompt (else its first) replaces the group's first row, trained after the original "
         "question with recipe.loss=critique_grpo (the preset recipe.name=critique_grpo); not reproduced: the "
         "GPT-4o text critiques"))


#: ICPO's instruction after each question (the authors' ``prompt_builder.py``; their literal
#: ``\\boxed{{}}`` reaches the main question unformatted, with doubled braces: single ones here)
ICPO_INSTRUCTION = " Let's think step by step and output the final answer within \\boxed{}"
_DEMO_POOLS: dict[tuple[str, str, str], list[tuple[str, str]]] = {}


def icpo_prompt(demos: list[tuple[str, str]], question: str, *, instruction: bool = True) -> str:
    """ICPO's n-shot prompt (the authors' ``ICLPromptBuilder.construct_n_shot_prompt`` for a prompt
    without a system message): each demonstration as ``"Question: {q}{instruction}\nAnswer: {a}"``,
    joined by three newlines, then ``"Question: {question}{instruction}\nAnswer:"``."""
    inst = ICPO_INSTRUCTION if instruction else ""
    shots = "\n\n\n".join(f"Question: {q}{inst}\nAnswer: {a}" for q, a in demos)
    return f"{shots}\n\n\nQuestion: {question}{inst}\nAnswer:"


def _demo_pool(path: str, question_field: str, solution_field: str) -> list[tuple[str, str]]:
    key = (path, question_field, solution_field)
    if key not in _DEMO_POOLS:
        import json

        pool = []
        try:
            f = open(path, encoding="utf-8")
        except OSError as e:
            raise ValueError(f"recipe.hints.demos: cannot read {path} ({e.strerror})") from None
        with f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    pool.append((str(row[question_field]), str(row[solution_field])))
                except (ValueError, KeyError, TypeError) as e:
                    raise ValueError(f"recipe.hints.demos: {path} line {n}: a JSON object with fields "
                                     f"{question_field!r} and {solution_field!r} expected ({type(e).__name__}: {e})"
                                     ) from None
        if not pool:
            raise ValueError(f"recipe.hints.demos: {path} holds no demonstrations")
        _DEMO_POOLS[key] = pool
    return _DEMO_POOLS[key]


def icpo(x: HintInputs, *, demos: str | None = None, column: str = "solution", n_demo: int = 1, seed: int = 0,
         question_field: str = "question", solution_field: str = "solution", beta: float = 0.0,
         anneal_steps: int = 400, metric: str | None = None):
    """ICPO's in-context steered rollouts (arXiv:2510.26519; the authors' ``Celine-hxy/ICPO``
    @287ac48, ``verl/recipe/icpo``): each group's first row is replaced by a response the policy
    samples with ``n_demo`` solved problems in front of its question (implicit expert forcing,
    :func:`icpo_prompt`), trained after the plain question and marked for ``recipe.loss=icpo``
    (the scripts' one such row per group, ``off_policy_rollout.rollout_num=1``).

    Demonstrations: drawn at random, without replacement, from ``demos``, a JSONL file of solved
    problems (fields ``question_field`` / ``solution_field``; the authors' cache of MATH's training
    solutions), or, without a file, from the step's other problems and their data column
    ``column``. The draw depends on ``seed``, the iteration and the group (a resume repeats it).

    ``beta``, ``anneal_steps`` (read by the loop): the annealed expert bonus of the ``-rs``
    scripts: a correct demonstration-guided response gets ``beta max(0, 1 - step / anneal_steps)``
    added to its score (``beta`` 1, 400 steps there; 0 here: the plain ICPO scripts; ``step`` the
    iteration from 0). The released code never sets the step its decay reads, so there the bonus
    stays ``beta``; the annealing here is the paper's. The paper's expert-region reject sampling
    is not in the released code (its ``-rs`` scripts differ from the plain ones by the bonus only)
    and is not reproduced.

    Prompts: a text prompt becomes the n-shot text. A chat prompt keeps its (first) system message
    and gets the n-shot text as its one user message, which the run's encoder then renders with
    the chat template; this differs from the code, which feeds the n-shot text of a prompt without
    a system message as raw text with no template, and for one with a system message builds the
    text without the instruction after each question (as here) but inserts it before the marker
    "User: This is the problem:" when the template has one (not reproduced). The data's own
    "Let's think step by step..." is cut from the question, as the code does for prompts without a
    system message. The code's doubled braces in the main question's ``\\boxed{{}}`` are single here.

    ``seed`` is the part's own (independent of the run's seed). ``metric``: the reward function
    whose outcome counts as correct for the bonus (default: the reward total ``> 0``; with format
    rewards in the total, name the accuracy reward). Cost: each guided prompt is sampled in the
    round's shape (``num_samples`` responses, one kept), so a step samples about twice the
    authors' rollouts; a guided prompt longer than the largest prompt bucket is not asked
    (``hints/too_long``), and a step where none fits is an error."""
    if not (isinstance(beta, (int, float)) and not isinstance(beta, bool) and beta >= 0):
        raise ValueError(f"recipe.hints.beta must be a number >= 0, got {beta!r}")
    if isinstance(anneal_steps, bool) or not isinstance(anneal_steps, int) or anneal_steps < 1:
        raise ValueError(f"recipe.hints.anneal_steps must be an int >= 1, got {anneal_steps!r}")
    del metric  # read by the loop, like beta and anneal_steps
    if isinstance(n_demo, bool) or not isinstance(n_demo, int) or n_demo < 1:
        raise ValueError(f"recipe.hints.n_demo must be an int >= 1, got {n_demo!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"recipe.hints.seed must be an int >= 0, got {seed!r}")
    if x.stage > 0:
        return {}
    if demos is not None:
        pool = _demo_pool(demos, question_field, solution_field)
        own = [None] * len(x.raw_prompts)
    else:
        sols = _column(x, "icpo", column, "the demonstrations' solutions")
        pool = [(_plain_question(r), str(a)) for r, a in zip(x.raw_prompts, sols)]
        own = list(range(len(x.raw_prompts)))
    out = {}
    for g, raw in enumerate(x.raw_prompts):
        cands = [i for i in range(len(pool)) if i != own[g]]
        if len(cands) < n_demo:
            raise ValueError(f"recipe.hints=icpo: {n_demo} demonstrations asked, {len(cands)} available "
                             f"({'the file' if demos else 'the step' + chr(39) + 's other problems'})")
        rng = np.random.default_rng([seed, x.step, g])
        picks = rng.choice(len(cands), n_demo, replace=False)
        shots = [pool[cands[int(i)]] for i in picks]
        q = _plain_question(raw)
        if isinstance(raw, str):
            out[g] = [icpo_prompt(shots, q)]
            continue
        system = [m for m in raw if m.get("role") == "system"]
        text = icpo_prompt(shots, q, instruction=not system)
        out[g] = [[*system[:1], {"role": "user", "content": text}]]
    return out


def _plain_question(raw: Any) -> str:
    """The question without the data's own step-by-step instruction (the code's split)."""
    return _question(raw).split("Let's think step by step")[0].strip()


HINTS.register(Part(
    "icpo", icpo, paper="Think Outside the Policy: In-Context Steered Policy Optimization (ICPO), arXiv:2510.26519",
    methods=(22,), verified="hand values; the authors' prompt builder, loss and reward shaping (Celine-hxy/ICPO "
                            "@287ac48)",
    tests="tests/training/test_icpo.py, tests/conformance/test_icpo_authors.py",
    flags=(("levels", True), ("context", "plain"), ("keep_failed", True), ("expert_bonus", True)),
    note="each group's first row re-sampled by the policy with n_demo solved problems in context (a JSONL pool or the "
         "step's other problems), trained after the plain question with recipe.loss=icpo (the preset "
         "recipe.name=icpo); beta > 0: the annealed bonus of a correct guided response; not reproduced: the "
         "similarity match of demonstrations (random only), more than one guided row per group"))


#: Scaf-GRPO's system message of the rebuilt prompt (the authors' ``build_new_message``)
SCAF_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
_SCAF_TIERS = (("knowledge", "Knowledge Hints"), ("solution", "Solution Hints"))


def _rebuilt(text: str, chat: bool, system: str | None) -> Any:
    """A rebuilt prompt: ``text`` as the user message after ``system`` (chat data), else the text."""
    if not chat:
        return text
    return [*([{"role": "system", "content": system}] if system else []), {"role": "user", "content": text}]


def _question(raw: Any) -> str:
    if isinstance(raw, str):
        return raw
    for m in reversed(list(raw)):
        if m.get("role") == "user":
            return str(m["content"])
    raise ValueError("a chat prompt without a user message cannot take a hint")


def scaf_grpo(x: HintInputs, *, knowledge: str = "knowledge_parts", solution: str = "solution_parts",
              warmup_steps: int = 50, system: str | None = SCAF_SYSTEM, metric: str | None = None):
    """Scaf-GRPO's scaffolding (arXiv:2510.19807; the authors' ``dvlab-research/Scaf-GRPO``
    @1085db5, ``hint_mix_grpo/trainer/ray_trainer.py``): from iteration ``warmup_steps`` on
    (0-based; the code's global step, counted from 1, ``> warmup_steps``),
    a group whose outcomes are all exactly 0 gets hint levels, mildest first: the question with
    the first ``k`` knowledge parts (``k = 1..4``), then with the first ``k`` solution parts, each
    a rebuilt prompt ``"Question: {q}\n{tier}: {parts[:k] joined by spaces}"`` (with ``system``
    as a system message for chat data). The loop samples one response per level and puts the
    mildest level's success in the group's first row. ``knowledge``, ``solution``: the data
    columns holding each problem's list of parts (a problem without parts gets no hint)."""
    del metric  # read by the loop
    if x.stage > 0 or x.step < warmup_steps:
        return {}
    tiers = [(label, _column(x, "scaf_grpo", col, "each problem's hint parts", name), col)
             for (name, label), col in zip(_SCAF_TIERS, (knowledge, solution))]
    vals = np.asarray(x.values, np.float64)
    gid = np.asarray(x.group_ids)
    out = {}
    for g in range(len(x.raw_prompts)):
        rows = gid == g
        if not rows.any() or not np.all(vals[rows] == 0):
            continue
        q, chat = _question(x.raw_prompts[g]), not isinstance(x.raw_prompts[g], str)
        levels = []
        for label, column, col in tiers:
            parts = column[g]
            if parts is None:
                continue
            if isinstance(parts, str) or not all(isinstance(p, str) for p in parts):
                raise ValueError(f"recipe.hints=scaf_grpo: data column {col!r} must hold a list of strings per "
                                 f"problem; group {g} has {parts!r:.80}")
            for k in range(1, min(len(parts), 4) + 1):
                levels.append(_rebuilt(f"Question: {q}\n{label}: {' '.join(parts[:k])}", chat, system))
        if levels:
            out[g] = levels
    return out


HINTS.register(Part(
    "scaf_grpo", scaf_grpo, paper="Scaf-GRPO: Scaffolded Group Relative Policy Optimization for Enhancing LLM "
                                  "Reasoning (Zhang et al.), arXiv:2510.19807",
    methods=(70,), verified="hand values (the authors' code's rules)", tests="tests/training/test_hints.py",
    flags=(("levels", True),),
    note="the authors' code (dvlab-research/Scaf-GRPO @1085db5): after 50 steps, all-zero groups get up to 8 "
         "rebuilt prompts (knowledge hints 1-4 parts, then solution hints 1-4; the code's planning tier is "
         "commented out), one sample each; the mildest level that succeeds replaces the group's first row "
         "(replace_num=1). The response is trained after the plain prompt with recomputed old log-probs: the "
         "code's replace_hint_prompt=true (its default, false, trains that one row after the hinted prompt, which "
         "a group of one prompt cannot hold here); needs recipe.old_logp=recompute"))
