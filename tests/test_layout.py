"""Package layering of ``jaxrl_llm``, read from the source with ``ast`` (nothing is imported).

Every module is assigned to a *unit*: its subpackage (``jaxrl_llm/models/hf.py`` -> ``models``)
or, for a module at the top of the package, its own name (``jaxrl_llm/shapes.py`` ->
``shapes``). An import of ``jaxrl_llm.<unit>...`` is an edge to that unit. Imports that run
when the module is imported (module level, including ``if``/``try``/class bodies) are kept
apart from *deferred* ones (inside a function body), which run only when called, and from
``if TYPE_CHECKING:`` ones, which never run.

The layering, lowest first (a unit may import only units of a strictly lower rank)::

    core, shapes,      no other jaxrl_llm unit (shapes: numpy-only token padding / buckets;
    config             config: typed overrides of config dataclasses, omegaconf only)
    parallel,          meshes, logical sharding rules, multi-host helpers;
    algorithms         algorithms: the registered method parts (core, config)
    models             imports parallel (constrain, state_shardings) and core
    rewards, rollout   rewards: core, shapes; rollout: models, parallel, shapes
    data, tasks        data: rewards (the GSM8K gold parser), shapes
    agents             environments, tools, episode rollout: rollout, rewards (the sandbox), tasks, data
    training, ...      everything above (not checked here beyond "nothing below imports it")

Deferred imports obey the same ranks, except the entries of ``DEFERRED_UPWARD`` (lazy
re-exports kept for compatibility; they never run at import time).

``python tests/test_layout.py`` prints the graph.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

PKG = "jaxrl_llm"
ROOT = Path(__file__).resolve().parents[1] / PKG

RANKS = {
    "core": 0, "shapes": 0, "config": 0,
    "parallel": 1, "algorithms": 1,
    "models": 2,
    "rewards": 3, "rollout": 3,
    "data": 4, "tasks": 4,
    "agents": 5,
}
LOWER = set(RANKS)  # the units whose imports are checked

# (importing module, imported unit): deferred imports allowed to point up (never run at import)
DEFERRED_UPWARD = {
    # `from jaxrl_llm.parallel import init_sharded` and `from jaxrl_llm.parallel.sharding import
    # init_sharded` keep working: a module __getattr__ fetches it from jaxrl_llm.models on use
    ("jaxrl_llm.parallel", "models"),
    ("jaxrl_llm.parallel.sharding", "models"),
    # the answer clusterer extracts final answers as the math verifier does (one extraction)
    ("jaxrl_llm.algorithms.answers", "rewards"),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str | None:
    """``jaxrl_llm.models.hf`` -> ``models``; ``jaxrl_llm.shapes`` -> ``shapes``; ``jaxrl_llm`` -> ``""``."""
    parts = module.split(".")
    if parts[0] != PKG:
        return None
    return parts[1] if len(parts) > 1 else ""


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """Absolute jaxrl_llm modules an import statement names (``from a import b`` -> ``a.b``
    when ``b`` is a submodule, else ``a``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        src = ".".join(base + ([node.module] if node.module else []))
    else:
        src = node.module or ""
    out = []
    for a in node.names:
        sub = f"{src}.{a.name}"
        rel = Path(*sub.split("."))
        if (ROOT.parent / rel).is_dir() or (ROOT.parent / rel).with_suffix(".py").is_file():
            out.append(sub)
        else:
            out.append(src)
    return out


def _imports(path: Path) -> list[tuple[str, str, int]]:
    """``(imported module, kind, line)`` of every jaxrl_llm import in ``path``; kind is
    ``"module"``, ``"deferred"`` (in a function) or ``"typing"`` (under TYPE_CHECKING)."""
    module = _module_name(path)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    found = []

    def visit(node: ast.AST, kind: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for sub in child.body:
                    visit_one(sub, "typing")
                for sub in child.orelse:
                    visit_one(sub, kind)
                continue
            visit_one(child, kind)

    def visit_one(child: ast.AST, kind: str) -> None:
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            for t in _targets(child, module, is_package):
                if _unit(t) is not None:
                    found.append((t, kind, child.lineno))
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and kind == "module":
            kind = "deferred"
        visit(child, kind)

    visit(tree, "module")
    return found


@functools.cache
def import_graph() -> dict[str, dict[str, set[tuple[str, str, int]]]]:
    """``graph[kind][unit] = {(importing module, imported unit, line)}`` over edges between
    different units (the root package ``jaxrl_llm/__init__.py`` is the unit ``""``)."""
    graph: dict[str, dict[str, set]] = {"module": defaultdict(set), "deferred": defaultdict(set),
                                        "typing": defaultdict(set)}
    for path in sorted(ROOT.rglob("*.py")):
        module = _module_name(path)
        src = _unit(module)
        for target, kind, line in _imports(path):
            dst = _unit(target)
            if dst and dst != src:
                graph[kind][src].add((module, dst, line))
    return graph


def unit_edges(kind: str) -> dict[str, set[str]]:
    return {u: {d for _, d, _ in edges} for u, edges in import_graph()[kind].items()}


def _cycles(edges: dict[str, set[str]], nodes: set[str]) -> list[list[str]]:
    """The cycles (as paths) of ``edges`` restricted to ``nodes``, one per strongly connected part."""
    out, state, stack = [], {}, []

    def dfs(u):
        state[u] = 1
        stack.append(u)
        for v in sorted(set(edges.get(u, ())) & nodes):
            if state.get(v) == 1:
                out.append(stack[stack.index(v):] + [v])
            elif v not in state:
                dfs(v)
        stack.pop()
        state[u] = 2

    for n in sorted(nodes):
        if n not in state:
            dfs(n)
    return out


def _fmt(edges: set[tuple[str, str, int]]) -> str:
    return "; ".join(f"{m}:{line} -> {d}" for m, d, line in sorted(edges))


# ----------------------------------------------------------------------------------------- tests


def test_every_module_is_parsed_and_units_are_known():
    units = {_unit(_module_name(p)) for p in ROOT.rglob("*.py")}
    assert {"core", "shapes", "parallel", "models", "rewards", "rollout", "data", "tasks", "training"} <= units
    assert ROOT.joinpath("shapes.py").is_file()


def test_core_and_shapes_import_no_other_unit():
    g = import_graph()
    for unit in ("core", "shapes", "config"):
        for kind in ("module", "deferred", "typing"):
            assert not g[kind].get(unit), f"{unit} imports ({kind}): {_fmt(g[kind][unit])}"


def test_root_package_imports_only_core():
    assert unit_edges("module").get("", set()) <= {"core"}


def test_no_import_cycle_at_module_level():
    edges = unit_edges("module")
    lower = _cycles(edges, LOWER)
    assert not lower, f"import cycles among {sorted(LOWER)}: {lower}"
    everything = set(edges) | {d for ds in edges.values() for d in ds}
    assert not _cycles(edges, everything), f"import cycles: {_cycles(edges, everything)}"


def test_module_level_imports_go_strictly_down():
    bad = {(m, d, line) for u, es in import_graph()["module"].items() if u in LOWER
           for m, d, line in es if d not in RANKS or RANKS[d] >= RANKS[u]}
    assert not bad, f"module-level imports that do not go down the layering: {_fmt(bad)}"


def test_deferred_imports_go_down_too():
    """Lazy (function-level) imports must not hide a cycle: they obey the same ranks except
    the listed compatibility re-exports."""
    bad = {(m, d, line) for u, es in import_graph()["deferred"].items() if u in LOWER
           for m, d, line in es if (d not in RANKS or RANKS[d] >= RANKS[u]) and (m, d) not in DEFERRED_UPWARD}
    assert not bad, f"function-level imports that point up the layering: {_fmt(bad)}"
    used = {(m, d) for es in import_graph()["deferred"].values() for m, d, _ in es}
    assert DEFERRED_UPWARD <= used, f"stale DEFERRED_UPWARD entries: {DEFERRED_UPWARD - used}"


def test_models_and_parallel_direction():
    g = import_graph()
    assert "parallel" in unit_edges("module").get("models", set())  # models use constrain / shardings
    for kind in ("module", "typing"):
        assert "models" not in {d for _, d, _ in g[kind].get("parallel", ())}, _fmt(g[kind]["parallel"])


def test_data_and_rewards_do_not_reach_up():
    g = import_graph()
    for unit in ("data", "rewards"):
        for kind in ("module", "deferred", "typing"):
            up = {e for e in g[kind].get(unit, ()) if e[1] in ("rollout", "training")}
            assert not up, f"{unit} reaches up ({kind}): {_fmt(up)}"
    # rewards sit below data (jaxrl_llm.data.gsm8k uses the rewards' GSM8K parser), never the reverse
    back = {e for kind in g for e in g[kind].get("rewards", ()) if e[1] == "data"}
    assert not back, f"rewards import data: {_fmt(back)}"


def test_nothing_below_training_imports_it():
    g = import_graph()
    top = {"training", "cli", "plan", "__main__"}
    bad = {e for kind in g for u, es in g[kind].items() if u in LOWER for e in es if e[1] in top}
    assert not bad, _fmt(bad)


if __name__ == "__main__":
    g = import_graph()
    for kind in ("module", "deferred", "typing"):
        print(f"== {kind}-level imports between units")
        for u in sorted(g[kind]):
            print(f"  {u or PKG:10s} -> {sorted({d for _, d, _ in g[kind][u]})}")
            for m, d, line in sorted(g[kind][u]):
                print(f"      {m}:{line} -> {d}")
