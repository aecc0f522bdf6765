"""TreePO's segment-tree sampler: the ``G`` responses of a prompt share their first segments.

Each prompt is prefilled once. Its first segment (``segment`` tokens) is decoded on
``min(branch, G)`` rows; at every segment boundary each path that goes on is copied into
children (its KV-cache rows and next-token logits are gathered, so the shared prefix is never
decoded again) and the children decode the next segment independently. A path ends at a stop
token or at the budget (``max_new_tokens``): it is a leaf, a response. The width follows the
authors' ``by_fixed_div`` budget with ``fixed_avg`` division: with ``F`` leaves of the prompt so
far, ``f`` of them ended in this segment and ``a`` paths going on, the next segment has
``max(a, min(G - F, branch * (f + a)))`` paths, ``floor(total / a)`` children per path and the
remainder to the last one, so the width doubles (``branch = 2``) until ``F`` plus the paths in
flight reach ``G``, and the slots of paths that ended pass to the others.

Where the authors' fallback refills a prompt whose paths all ended before ``G`` leaves (it cuts
finished leaves back to a random segment boundary and continues from there, or restarts from the
prompt), this sampler samples the missing leaves from the prompt in one further decode, as an
i.i.d. sampler would (the code's restart-from-the-prompt case): every prompt gets exactly ``G``
leaves, so the batch has the usual ``B x G`` rows.

A leaf's ``paths`` row holds the ids of its segments' nodes, root first (``-1`` past its
depth); two leaves share their first ``d`` segments iff their ``d``-th ids are equal (a fallback
leaf has one node of its own). :func:`jaxrl_llm.core.treepo_advantages` reads them (through the
loop's ``tree_prefix_ids``). ``last_stats`` counts the tokens decoded against the tokens of the
leaves (what i.i.d. sampling of the same responses would decode).

Paper: Li et al., "TreePO: Bridging the Gap of Policy Optimization and Efficacy and Inference
Efficiency with Heuristic Tree-based Modeling", arXiv:2508.17445; the authors' code
(``multimodal-art-projection/TreePO`` @f055523, ``vllm_rollout_spmd.py``,
``generate_sequences_tree_deepth_first_vanilla_mode``): 512-token segments, branch 2, depth 14,
``G = 16`` leaves in the paper's runs. Not reproduced: the random first divergence (inactive in
the released run), the repetition stop and the ``\\boxed{}`` stop rule (a stop token ends a
path), the fallback's random cut of finished leaves.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.models.transformer import init_cache, unstack_layers
from jaxrl_llm.rollout.sampler import _take_rows, decode, resolve_unroll
from jaxrl_llm.rollout.sampling import SamplingConfig
from jaxrl_llm.shapes import bucket, pad_prompts

__all__ = ["TreeRollout", "TreeSampler", "tree_widths"]


class TreeRollout(NamedTuple):
    """A :class:`~jaxrl_llm.rollout.Rollout` with each response's segment path."""

    tokens: Any  # [N, T] int32
    mask: Any  # [N, T] bool
    logprobs: Any  # [N, T] float32
    lengths: Any  # [N] int32
    stopped: Any  # [N] bool
    prompt_index: Any  # [N] int32
    paths: Any  # [N, D] int32 node id of each segment, root first; -1 past the leaf's depth


def tree_widths(finished: int, ended: int, going_on: int, width: int, branch: int) -> list[int]:
    """Children of each of ``going_on`` paths at a segment boundary (``by_fixed_div`` with
    ``fixed_avg``): with ``finished`` leaves of the prompt so far (``ended`` of them in this
    segment), ``total = max(a, min(width - finished, branch * (ended + a)))`` split evenly, the
    remainder to the last path: the slots of the paths that ended pass to the others."""
    if min(finished, ended, going_on) < 0 or ended > finished or width < 1 or branch < 1:
        raise ValueError(f"tree_widths: counts must be >= 0 with ended <= finished, width and branch >= 1; got "
                         f"finished={finished}, ended={ended}, going_on={going_on}, width={width}, branch={branch}")
    if going_on == 0:
        return []
    total = max(going_on, min(max(width - finished, 0), branch * (ended + going_on)))
    each = [total // going_on] * going_on
    each[-1] += total - sum(each)
    return each


@partial(jax.jit, static_argnums=(0, 4), static_argnames=("unroll_layers",))
def _prefill(graphdef: nnx.GraphDef, params: Any, tokens: jax.Array, mask: jax.Array, context_len: int, *others: Any,
             unroll_layers: bool = False):
    model = nnx.merge(graphdef, params, *others)
    layers = unstack_layers(nnx.state(model)) if unroll_layers else None
    cache = init_cache(model.cfg, tokens.shape[0], context_len, per_layer=layers is not None)
    valid, index = jax.lax.optimization_barrier((cache.valid, cache.index))  # see generate: no constant folding
    cache = cache._replace(valid=valid, index=index)
    h, cache = model(tokens, mask, cache=cache, layers=layers)
    return model.logits(h[:, -1]), cache


@partial(jax.jit, static_argnums=(0, 7), static_argnames=("unroll_layers",))
def _segment(graphdef: nnx.GraphDef, params: Any, cache: Any, logits: jax.Array, parents: jax.Array, done: jax.Array,
             key: jax.Array, config: SamplingConfig, *others: Any, unroll_layers: bool = False):
    """Gather the parents' cache rows and logits, decode one segment of the rows not ``done``."""
    model = nnx.merge(graphdef, params, *others)
    layers = unstack_layers(nnx.state(model)) if unroll_layers else None
    out = decode(model, layers, jnp.take(logits, parents, axis=0), _take_rows(cache, parents), done, key, config)
    return out.tokens, out.mask, out.logprobs, out.done, out.cache, out.logits


@dataclasses.dataclass
class _Node:
    parent: int  # index into the nodes list (-1: the prompt)
    prompt: int
    tokens: np.ndarray
    logprobs: np.ndarray


class TreeSampler:
    """Segment-tree sampling with the :class:`~jaxrl_llm.rollout.Sampler` call convention:
    ``sampler(params, prompts, key, *others)`` returns a :class:`TreeRollout` of
    ``config.num_samples`` responses per prompt (rows prompt-major).

    Args:
      graphdef, config: as :class:`~jaxrl_llm.rollout.Sampler`.
      segment: tokens per segment (the authors' 512); the tree has ``ceil(T / segment)`` levels.
      branch: children per path while the width is below ``G`` (the authors' 2).
      length_buckets: prompt length buckets. Row counts of the segments are padded to powers of
        two (rows past the real ones are done from the start), so a run compiles few shapes.
      unroll_layers: as :class:`~jaxrl_llm.rollout.Sampler` (``"auto"``: unrolled for small
        or 16-bit models).
    """

    def __init__(self, graphdef: nnx.GraphDef, config: SamplingConfig, *, segment: int, branch: int = 2,
                 length_buckets: Sequence[int] = (32, 64, 128, 256, 512, 1024, 2048),
                 unroll_layers: bool | str = "auto"):
        if isinstance(segment, bool) or not isinstance(segment, int) or segment < 1:
            raise ValueError(f"TreeSampler: segment must be an int >= 1, got {segment!r}")
        if isinstance(branch, bool) or not isinstance(branch, int) or branch < 1:
            raise ValueError(f"TreeSampler: branch must be an int >= 1, got {branch!r}")
        if unroll_layers not in (True, False, "auto"):
            raise ValueError(f"TreeSampler: unroll_layers must be True, False or 'auto', got {unroll_layers!r}")
        if config.weight_dtype is not None:
            raise ValueError(f"TreeSampler: SamplingConfig.weight_dtype={config.weight_dtype!r} is not supported by the "
                             "segment-tree sampler (it decodes with the model's own weights); leave it None")
        self.graphdef, self.config, self.segment, self.branch = graphdef, config, segment, branch
        self.depth = math.ceil(config.max_new_tokens / segment)
        self.length_buckets = tuple(sorted(length_buckets))
        self.unroll_layers = unroll_layers
        self.compiled_shapes: set[tuple[int, int]] = set()
        self.last_stats: dict[str, float] = {}

    def _seg_config(self, tokens: int) -> SamplingConfig:
        return dataclasses.replace(self.config, max_new_tokens=tokens, num_samples=1)

    def __call__(self, params: Any, prompts: Sequence[Sequence[int]], key: jax.Array, *others: Any,
                 counts: Sequence[int] | None = None) -> TreeRollout:
        if counts is not None:
            raise ValueError("TreeSampler: a tree gives every prompt num_samples leaves; it does not take counts "
                             "(recipe.allocator cannot be used with rollout.tree_segment)")
        cfg, s, w = self.config, self.segment, self.config.num_samples
        b, t = len(prompts), cfg.max_new_tokens
        length = bucket(max(len(p) for p in prompts), self.length_buckets)
        tokens, mask = pad_prompts(prompts, length, b, cfg.pad_token_id)
        unroll = resolve_unroll(self.unroll_layers, params, *others)
        root_logits, root_cache = _prefill(self.graphdef, params, tokens, mask, length + self.depth * s, *others,
                                           unroll_layers=unroll)
        nodes: list[_Node] = []
        leaves: list[tuple[int, bool]] = []  # (node, stopped)
        finished = np.zeros(b, np.int64)
        # rows of the first segment: min(branch, G) per prompt, continuing the prompt's prefill
        parents = np.repeat(np.arange(b), min(self.branch, w))
        row_prompt = parents.copy()
        row_node = np.full(len(parents), -1)  # the node each row continues (-1: the prompt)
        cache, logits = root_cache, root_logits
        decoded = 0
        for k in range(self.depth):
            n_rows = len(parents)
            rows = min(1 << max(n_rows - 1, 0).bit_length(), max(b * w, n_rows))
            self.compiled_shapes.add((rows, length))
            par = np.zeros(rows, np.int32)
            par[:n_rows] = parents
            done = np.arange(rows) >= n_rows
            seg_t = min(s, t - k * s)
            tok, msk, lp, stop, cache, logits = _segment(
                self.graphdef, params, cache, logits, jnp.asarray(par), jnp.asarray(done),
                jax.random.fold_in(key, k), self._seg_config(seg_t), *others, unroll_layers=unroll)
            tok, msk, lp, stop = (np.asarray(x)[:n_rows] for x in (tok, msk, lp, stop))
            decoded += int(msk.sum())
            going: list[list[int]] = [[] for _ in range(b)]  # per prompt, its rows that go on
            ended = np.zeros(b, np.int64)
            cur_node = np.empty(n_rows, np.int64)
            for r in range(n_rows):
                nodes.append(_Node(int(row_node[r]), int(row_prompt[r]), tok[r][msk[r]], lp[r][msk[r]]))
                cur_node[r] = len(nodes) - 1
                if stop[r] or k == self.depth - 1:
                    leaves.append((len(nodes) - 1, bool(stop[r])))
                    finished[row_prompt[r]] += 1
                    ended[row_prompt[r]] += 1
                else:
                    going[row_prompt[r]].append(r)
            new_parents, new_prompt, new_node = [], [], []
            for p in range(b):
                for r, c in zip(going[p], tree_widths(int(finished[p]), int(ended[p]), len(going[p]), w,
                                                      self.branch)):
                    new_parents += [r] * c
                    new_prompt += [p] * c
                    new_node += [int(cur_node[r])] * c
            if not new_parents:
                break
            parents, row_prompt, row_node = (np.asarray(new_parents), np.asarray(new_prompt), np.asarray(new_node))
        # prompts whose paths all ended before G leaves: the missing leaves from the prompt
        missing = np.maximum(w - finished, 0)
        fallback = int(missing.sum())
        if fallback:
            fp = np.repeat(np.arange(b), missing)
            rows = min(1 << max(fallback - 1, 0).bit_length(), b * w)
            par = np.zeros(rows, np.int32)
            par[:fallback] = fp
            tok, msk, lp, stop, _, _ = _segment(
                self.graphdef, params, root_cache, root_logits, jnp.asarray(par), jnp.asarray(np.arange(rows) >= fallback),
                jax.random.fold_in(key, self.depth), self._seg_config(t), *others, unroll_layers=unroll)
            tok, msk, lp, stop = (np.asarray(x)[:fallback] for x in (tok, msk, lp, stop))
            decoded += int(msk.sum())
            for r in range(fallback):
                nodes.append(_Node(-1, int(fp[r]), tok[r][msk[r]], lp[r][msk[r]]))
                leaves.append((len(nodes) - 1, bool(stop[r])))
        return self._assemble(nodes, leaves, b, decoded, fallback)

    def _assemble(self, nodes: list[_Node], leaves: list[tuple[int, bool]], b: int, decoded: int,
                  fallback: int) -> TreeRollout:
        cfg, w, t = self.config, self.config.num_samples, self.config.max_new_tokens
        by_prompt: list[list[tuple[int, bool]]] = [[] for _ in range(b)]
        for leaf in leaves:
            by_prompt[nodes[leaf[0]].prompt].append(leaf)
        n = b * w
        out_tok = np.full((n, t), cfg.pad_token_id, np.int32)
        out_mask = np.zeros((n, t), bool)
        out_lp = np.zeros((n, t), np.float32)
        lengths = np.zeros(n, np.int32)
        stopped = np.zeros(n, bool)
        paths = np.full((n, max(self.depth, 1)), -1, np.int32)
        for p in range(b):
            if len(by_prompt[p]) != w:  # the width rule and the fallback give every prompt exactly G leaves
                raise RuntimeError(f"TreeSampler: prompt {p} has {len(by_prompt[p])} leaves, not {w}")
            for j, (leaf, stop) in enumerate(by_prompt[p]):
                chain = []
                node = leaf
                while node >= 0:
                    chain.append(node)
                    node = nodes[node].parent
                chain.reverse()
                row = p * w + j
                seq = np.concatenate([nodes[c].tokens for c in chain])
                lps = np.concatenate([nodes[c].logprobs for c in chain])
                out_tok[row, :len(seq)] = seq
                out_mask[row, :len(seq)] = True
                out_lp[row, :len(seq)] = lps
                lengths[row], stopped[row] = len(seq), stop
                paths[row, :len(chain)] = chain
        leaf_tokens = int(lengths.sum())
        self.last_stats = {"tree/decoded_tokens": float(decoded), "tree/leaf_tokens": float(leaf_tokens),
                           "tree/saved_frac": 1.0 - decoded / leaf_tokens if leaf_tokens else 0.0,
                           "tree/fallback_leaves": float(fallback)}
        return TreeRollout(out_tok, out_mask, out_lp, lengths, stopped, np.repeat(np.arange(b), w).astype(np.int32),
                           paths)
