"""The ``jaxrl-llm`` command (also ``python -m jaxrl_llm``)::

    jaxrl-llm list                                   experiments, with the first line of their docstring
    jaxrl-llm train <experiment> [key=value ...] [--config f.yaml] [--print-config] [--dry-run]
    jaxrl-llm check [<experiment> ...]               resolve configs and run each experiment's check()
    jaxrl-llm plan <experiment> [key=value ...]      compile its train step + sampler on abstract shapes; memory report
    jaxrl-llm plan --model P --mesh D,F,T[,E] [...]  the same for a model preset, batch and mesh given as flags
    jaxrl-llm methods [--json] [--kind K]            every method part: config name, paper, core function, tests

An *experiment* is a Python file that defines a function ``config()`` returning a config (or a
dataclass ``Config``, instantiated with its defaults). ``train`` runs it with the library's runner
for its type (:mod:`jaxrl_llm.training.runners`: an ``RLRunConfig`` with ``run_rl``, ...), after
the runner's check or the file's own ``check(cfg)`` (which raises if the config cannot work:
shapes, mesh, memory budget; that is how experiments too large for this machine are
config-checked, not run), and prints what the run returns as JSON. A file that defines
``main(cfg)`` (a script of your own) runs with it instead.

``<experiment>`` is a path to a ``.py`` file, or a name looked up in ``./experiments/``, then in
the ``experiments/`` folder beside the installed package (a source checkout or editable
install); ``$JAXRL_LLM_EXPERIMENTS`` (folders separated by ``os.pathsep``) replaces that search
path.

Exit codes: 0 success; 2 a usage error (unknown experiment, a file that is not an experiment,
a bad override or config file, a config mistake found by a check or at the start of a run),
reported as one line without a traceback; 1 an exception raised by the experiment itself (its
traceback is printed as usual), or a run whose checkpoints are all unreadable (one line).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import importlib.util
import json
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Any

from jaxrl_llm.config import ConfigError, apply_overrides, config_diff, to_yaml

__all__ = ["main", "Experiment", "load_experiment", "resolve_experiment", "find_experiments", "experiment_dirs"]

ENV_DIRS = "JAXRL_LLM_EXPERIMENTS"


class UsageError(Exception):
    """A command-line mistake: reported in one line, exit code 2."""


# ---------------------------------------------------------------------------- finding experiments


def experiment_dirs() -> list[Path]:
    """Folders searched for experiments by name, in order."""
    env = os.environ.get(ENV_DIRS)
    if env:
        candidates = [Path(p) for p in env.split(os.pathsep) if p]
    else:
        candidates = [Path.cwd() / "experiments", Path(__file__).resolve().parent.parent / "experiments"]
    out, seen = [], set()
    for d in candidates:
        key = d.resolve()
        if d.is_dir() and key not in seen:
            seen.add(key)
            out.append(d)
    return out


def find_experiments() -> dict[str, Path]:
    """``{name: path}`` of the ``*.py`` files in :func:`experiment_dirs` (earlier folders win)."""
    found: dict[str, Path] = {}
    for d in experiment_dirs():
        for p in sorted(d.glob("*.py")):
            if not p.name.startswith("_"):
                found.setdefault(p.stem, p)
    return found


def resolve_experiment(spec: str) -> Path:
    """A path to a ``.py`` file, or an experiment name; raises :class:`UsageError` if not found."""
    if spec.endswith(".py") or "/" in spec or os.sep in spec:
        p = Path(spec)
        if not p.is_file():
            raise UsageError(f"experiment file not found: {spec}")
        return p
    known = find_experiments()
    if spec in known:
        return known[spec]
    searched = ", ".join(str(d) for d in experiment_dirs()) or "no experiments/ folder found"
    close = difflib.get_close_matches(spec, list(known), n=1)
    raise UsageError(f"unknown experiment {spec!r}{f' (did you mean {close[0]!r}?)' if close else ''}; "
                     f"known: {', '.join(sorted(known)) or '(none)'} (searched: {searched})")


@dataclasses.dataclass
class _Outline:
    """What a file defines at top level, read without importing it."""

    doc: str
    has_main: bool
    has_config: bool
    error: str | None = None


def _outline(path: Path) -> _Outline:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, OSError) as e:
        return _Outline("", False, False, f"cannot parse: {e}")
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name):
                    names.add(t.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return _Outline(_summary(ast.get_docstring(tree) or ""), "main" in names, "Config" in names or "config" in names)


def _summary(doc: str) -> str:
    """The docstring's summary: its first line, continued to the end of the sentence when a long
    first sentence wraps onto the next lines."""
    para = " ".join(doc.strip().split("\n\n", 1)[0].split())
    m = re.search(r"[.!?](\s|$)", para)
    return para[: m.start() + 1] if m else para


# ---------------------------------------------------------------------------- loading


@dataclasses.dataclass
class Experiment:
    """A loaded experiment: its module, default config and optional ``check``."""

    name: str
    path: Path
    module: Any
    default: Any  # the default config (a dataclass instance)

    @property
    def runner(self):
        """The library's runner of this config type (``None`` when the file defines ``main``)."""
        if callable(getattr(self.module, "main", None)):
            return None
        from jaxrl_llm.training.runners import runner_for

        return runner_for(self.default)

    @property
    def check(self):
        fn = getattr(self.module, "check", None)
        if callable(fn):
            return fn
        runner = self.runner
        return None if runner is None else runner.check

    def main(self, cfg):
        fn = getattr(self.module, "main", None)
        return fn(cfg) if callable(fn) else self.runner.run(cfg)


def _import(path: Path):
    name = "_jaxrl_llm_experiment_" + re.sub(r"\W", "_", path.stem)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot import {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    folder = str(path.resolve().parent)
    if folder not in sys.path:  # as `python experiments/x.py` would: sibling modules import
        sys.path.insert(0, folder)
    sys.modules[name] = module  # dataclasses and typing resolve annotations through it
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def load_experiment(path: str | os.PathLike) -> Experiment:
    """Import an experiment file and build its default config.

    Raises :class:`UsageError` when the file has no config, or a config that no runner runs
    and no ``main``; exceptions raised by the module itself (while importing, or in
    ``config()`` / ``Config()``) propagate.
    """
    path = Path(path)
    module = _import(path)
    problems = []
    factory = getattr(module, "config", None)
    cls = getattr(module, "Config", None)
    use_factory = callable(factory) and not isinstance(factory, type)
    if not use_factory:
        if cls is None:
            problems.append("no Config dataclass or config() function")
        elif not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            problems.append(f"Config is a {type(cls).__name__}, not a dataclass")
    if problems:
        raise UsageError(f"{path} is not an experiment: it defines {' and '.join(problems)}")
    if use_factory:
        cfg = factory()
        if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
            raise UsageError(f"{path}: config() returned a {type(cfg).__name__}, not a dataclass instance")
    else:
        missing = [f.name for f in dataclasses.fields(cls) if f.init and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise UsageError(f"{path}: Config has fields without defaults ({', '.join(missing)}); give them "
                             f"defaults or define config()")
        cfg = cls()
    exp = Experiment(path.stem, path, module, cfg)
    try:
        exp.runner
    except TypeError as e:
        raise UsageError(f"{path} is not an experiment: {e}") from None
    return exp


# ---------------------------------------------------------------------------- commands


def _describe_diff(cfg, default) -> str:
    diff = config_diff(cfg, default)
    if not diff:
        return "defaults"
    return ", ".join(f"{k}={json.dumps(new, default=str)} (default {json.dumps(old, default=str)})"
                     for k, (old, new) in diff.items())


def _json_default(o):
    try:
        return o.item()
    except Exception:
        return str(o)


_SCRIPT = "a script, not a CLI experiment: no Config or config()"


def cmd_list(args) -> int:
    exps = find_experiments()
    if not exps:
        dirs = ", ".join(str(d) for d in experiment_dirs()) or "./experiments (missing)"
        print(f"no experiments found (searched: {dirs})")
        return 0
    width = max(len(n) for n in exps)
    for name, path in exps.items():
        o = _outline(path)
        note = ""
        if o.error:
            note = f"  [{o.error}]"
        elif not o.has_config:
            note = f"  [{_SCRIPT}]"
        print(f"{name:<{width}}  {o.doc}{note}")
    return 0


def cmd_train(args) -> int:
    try:
        exp = load_experiment(resolve_experiment(args.experiment))
        overrides = list(args.overrides) + (["run.force=true"] if args.force else [])
        cfg = apply_overrides(exp.default, overrides, config_files=args.config or ())
    except (UsageError, ConfigError) as e:
        return _usage_error(e)
    if args.print_config:
        sys.stdout.write(to_yaml(cfg))
        return 0
    if args.multihost or os.environ.get("JAXRL_COORDINATOR"):
        from jaxrl_llm.parallel import initialize

        try:
            initialize()  # before anything touches a JAX backend
        except (ValueError, RuntimeError) as e:
            return _usage_error(UsageError(f"--multihost: could not join the other processes: {e}"))
    print(f"jaxrl-llm: {exp.name} ({exp.path}) with {_describe_diff(cfg, exp.default)}", file=sys.stderr)
    try:
        if exp.check is not None:
            exp.check(cfg)
        if args.dry_run:
            print(f"jaxrl-llm: dry run: config resolved{', check() passed' if exp.check else ''}; not training",
                  file=sys.stderr)
            return 0
        result = exp.main(cfg)
    except ConfigError as e:  # a mistake in the config found by a check or at the start of the run
        return _usage_error(e)
    except Exception as e:
        # run.out holds checkpoints, none of them readable: one line (the module is loaded if it raised)
        ckpt = sys.modules.get("jaxrl_llm.training.checkpoint")
        if ckpt is not None and isinstance(e, ckpt.UnreadableCheckpoint):
            print(f"jaxrl-llm: error: {e}", file=sys.stderr)
            return 1
        raise
    if result is not None:
        print(json.dumps(result, indent=1, default=_json_default))
    return 0


def cmd_check(args) -> int:
    if args.experiments:
        try:
            targets = [(spec, resolve_experiment(spec)) for spec in args.experiments]
        except UsageError as e:
            return _usage_error(e)
    else:
        targets = []
        for name, path in find_experiments().items():
            o = _outline(path)
            if o.has_config or o.error:
                targets.append((name, path))  # a broken experiment fails below, with its reason
            else:
                print(f"skip  {name}: {_SCRIPT}")
        if not targets:
            print("no experiments to check")
    n_usage = n_raised = 0
    for spec, path in targets:
        try:
            exp = load_experiment(path)
            cfg = apply_overrides(exp.default, [])  # the config must be a valid structured config
            if exp.check is not None:
                exp.check(cfg)
        except (UsageError, ConfigError) as e:
            n_usage += 1
            print(f"FAIL  {spec}: {e}")
            continue
        except Exception as e:
            n_raised += 1
            traceback.print_exc()
            print(f"FAIL  {spec}: {type(e).__name__}: {e}")
            continue
        print(f"ok    {spec}: {'check() passed' if exp.check else 'config resolved (no check())'}")
    if n_usage or n_raised:
        print(f"{n_usage + n_raised} of {len(targets)} experiments failed", file=sys.stderr)
    return 1 if n_raised else 2 if n_usage else 0


def cmd_methods(args) -> int:
    from jaxrl_llm.training.catalog import catalog, markdown

    if args.markdown:
        sys.stdout.write(markdown())
        return 0
    rows = catalog()
    if args.kind is not None:
        keys = sorted({r["key"] for r in rows})
        if args.kind not in keys:
            close = difflib.get_close_matches(args.kind, keys, n=1)
            return _usage_error(UsageError(f"--kind {args.kind!r} is not a config key of the catalogue"
                                           f"{f' (did you mean {close[0]!r}?)' if close else ''}; keys: "
                                           f"{', '.join(keys)}"))
        rows = [r for r in rows if r["key"] == args.kind]
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
        return 0
    key = None
    for r in rows:
        if r["key"] != key:
            key = r["key"]
            print(f"\n{r['kind']} ({key}=<name>)")
        seed = f" [#{', #'.join(map(str, r['methods']))}]" if r["methods"] else ""
        print(f"  {r['name']:<26} {r['paper'] or '-'}{seed}")
        detail = ", ".join(x for x in (("core: " + ", ".join(r["core"])) if r["core"] else "",
                                       ("requires: " + ", ".join(r["requires"])) if r["requires"] else "",
                                       f"verified: {r['verified']}" if r["verified"] else "") if x)
        if detail:
            print(f"  {'':<26} {detail}")
    return 0


def _usage_error(e: Exception) -> int:
    print(f"jaxrl-llm: error: {e}", file=sys.stderr)
    return 2


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    top = argparse.ArgumentParser(
        prog="jaxrl-llm", description="Run, list and check jaxrl_llm experiments.",
        epilog="An experiment is a .py file defining config() (or a Config dataclass); its config type picks the "
               "runner. See `python -m jaxrl_llm train -h`.")
    sub = top.add_subparsers(dest="command", metavar="{train,list,check,plan,methods}")
    p_list = sub.add_parser("list", help="list experiments with the first line of their docstring")
    p_train = sub.add_parser(
        "train", help="run an experiment with config overrides",
        description="Resolve the experiment's config (defaults, then --config files, then key=value overrides), "
                    "check it, then run it with the runner of its config type (or the file's main(cfg)).")
    p_train.add_argument("experiment", help="a name in experiments/ or a path to a .py file")
    p_train.add_argument("overrides", nargs="*", metavar="key=value",
                         help="config overrides: lr=1e-4 model.layers=4 buckets=[32,64] limit=null")
    p_train.add_argument("--config", action="append", metavar="FILE.yaml",
                         help="YAML file of config keys, merged before the overrides (repeatable)")
    p_train.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    p_train.add_argument("--dry-run", action="store_true", help="resolve the config, run check(cfg) and exit")
    p_train.add_argument("--force", action="store_true",
                         help="start even if the preflight plans more memory than the devices have (run.force=true)")
    p_train.add_argument("--multihost", action="store_true",
                         help="join the other processes first (jaxrl_llm.parallel.initialize: $JAXRL_COORDINATOR, "
                              "$JAXRL_NUM_PROCESSES, $JAXRL_PROCESS_ID, or TPU-pod/SLURM auto-detection); "
                              "implied when those variables are set")
    p_check = sub.add_parser("check", help="resolve configs and run each experiment's check(cfg)")
    p_check.add_argument("experiments", nargs="*", metavar="experiment",
                         help="names or paths (default: every experiment found)")
    p_plan = sub.add_parser(
        "plan", help="compile the train step and sampler for a model, batch and mesh; report per-device memory",
        description="Ahead-of-time plan (jaxrl_llm.plan): lower and compile the train step and the sampler on "
                    "abstract shapes for a (data, fsdp, tensor) mesh and report per-device memory, FLOPs and a "
                    "roofline step time for a chip. Without enough devices on a CPU host it re-runs itself on "
                    "simulated CPU devices.")
    p_plan.add_argument("experiment", nargs="?", default=None,
                        help="an experiment (name or .py file) whose config is planned; without one, the flags below "
                             "describe the model, batch and mesh")
    p_plan.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides of the experiment")
    p_plan.add_argument("--config", action="append", metavar="FILE.yaml", help="YAML config files (as train)")
    p_plan.add_argument("--model", default="smollm2-135m", help="a jaxrl_llm.models.PRESETS name")
    p_plan.add_argument("--mesh", default="1,1,1",
                        help="data,fsdp,tensor[,expert] (e.g. 8,8,1; 4,2,1,8: experts split 8 ways)")
    p_plan.add_argument("--rows", type=int, default=8, help="global rows of one train step")
    p_plan.add_argument("--seq-len", type=int, default=256, help="tokens per training row")
    p_plan.add_argument("--microbatches", type=int, default=1)
    p_plan.add_argument("--prompts", type=int, default=1, help="sampler prompts (0: skip the sampler)")
    p_plan.add_argument("--samples", type=int, default=8, help="samples per prompt")
    p_plan.add_argument("--prompt-len", type=int, default=64)
    p_plan.add_argument("--new-tokens", type=int, default=192)
    p_plan.add_argument("--param-dtype", default=None, help="override the preset's (float32, bfloat16, ...)")
    p_plan.add_argument("--dtype", default=None, help="compute dtype override")
    p_plan.add_argument("--remat", default=None, choices=("none", "full", "dots"))
    p_plan.add_argument("--moe-capacity", type=float, default=None,
                        help="mixture of experts: capacity factor of the expert buffers (default: the model's; "
                             "dropless)")
    p_plan.add_argument("--optimizer", default="adamw", choices=("adamw", "sgd"))
    p_plan.add_argument("--reference", default="none", choices=("none", "device", "host"),
                        help="a KL recipe's frozen reference policy: none, resident on the devices, or in host "
                             "memory (model.offload_reference)")
    p_plan.add_argument("--chip", default=None, help="for the time estimate: " + ", ".join(_chips()))
    p_plan.add_argument("--peak-tflops", type=float, default=None)
    p_plan.add_argument("--hbm-gbs", type=float, default=None)
    p_plan.add_argument("--hbm-gib", type=float, default=None)
    p_plan.add_argument("--context", type=int, default=None,
                        help="context parallelism: split each row's tokens over a context mesh axis of this size "
                             "(default: the experiment's mesh.context, else 1)")
    p_plan.add_argument("--attention", default=None, choices=("auto", "dense", "blockwise", "splash", "cudnn"),
                        help="attention implementation (default: the model's; auto resolves for the target)")
    p_plan.add_argument("--target", default=None,
                        help="compile for these chips with their own compiler on this host: tpu-v5e:8x8, v5e-64, "
                             "v5p-16, tpu-v6e:4x4, ... (needs libtpu: bash scripts/setup_tpu_compiler.sh) or h100:8 "
                             "(bash scripts/setup_gpu_compiler.sh); reports whether the step fits the chip's memory")
    p_plan.add_argument("--search", action="store_true",
                        help="find the remat policy, context split and micro-batches that fit (needs --target, "
                             "--chip or --hbm-gib); the mesh's fsdp axis takes the remaining devices")
    p_plan.add_argument("--json", action="store_true", help="print the report as JSON instead of Markdown")
    p_methods = sub.add_parser(
        "methods", help="every method part (estimators, losses, KL, corrections, shaping, filters, preference "
                        "losses, recipe presets) with its config key, paper, core functions and tests",
        description="The catalogue of jaxrl_llm.training.catalog, generated from the registries.")
    p_methods.add_argument("--json", action="store_true", help="print the records as JSON")
    p_methods.add_argument("--markdown", action="store_true", help="print docs/methods.md")
    p_methods.add_argument("--kind", default=None, help="only the parts of one config key, e.g. recipe.advantage")
    return top, {"list": p_list, "train": p_train, "check": p_check, "plan": p_plan, "methods": p_methods}


def _chips() -> list[str]:
    from jaxrl_llm.plan import CHIPS

    return list(CHIPS)


PLAN_CHILD = "JAXRL_LLM_PLAN_SIMULATED"


def _plan_spec(args):
    """The PlanSpec of ``jaxrl-llm plan``: from an experiment's config (the same object ``train``
    runs) or, without one, from the flags."""
    from jaxrl_llm.plan import PlanSpec

    chip = dict(chip=args.chip, peak_tflops=args.peak_tflops, hbm_gbs=args.hbm_gbs, hbm_gib=args.hbm_gib,
                target=args.target)
    extra = {k: v for k, v in (("context", args.context), ("attention", args.attention)) if v is not None}
    if args.experiment is not None:
        exp = load_experiment(resolve_experiment(args.experiment))
        cfg = apply_overrides(exp.default, args.overrides, config_files=args.config or ())
        runner = exp.runner
        if runner is None or runner.plan is None:
            raise UsageError(f"{exp.name}: a {type(cfg).__name__} config has no plan (jaxrl-llm plan plans RL runs)")
        return dataclasses.replace(runner.plan(cfg), **chip, **extra)
    try:
        mesh = tuple(int(x) for x in args.mesh.split(","))
    except ValueError:
        raise UsageError(f"--mesh must be integers data,fsdp,tensor[,expert], got {args.mesh!r}") from None
    if len(mesh) not in (3, 4):
        raise UsageError(f"--mesh must be three or four integers data,fsdp,tensor[,expert], got {args.mesh!r}")
    return PlanSpec(model=args.model, mesh=mesh, rows=args.rows, seq_len=args.seq_len,
                    num_microbatches=args.microbatches, prompts=args.prompts, num_samples=args.samples,
                    prompt_len=args.prompt_len, new_tokens=args.new_tokens, param_dtype=args.param_dtype,
                    dtype=args.dtype, remat=args.remat, moe_capacity_factor=args.moe_capacity,
                    optimizer=args.optimizer, reference=args.reference, **chip, **extra)


PLAN_TARGET_CHILD = "JAXRL_LLM_PLAN_TARGET"


def _compiler_python(platform: str) -> str | None:
    """A Python that can compile for ``platform`` ("tpu": has libtpu; "gpu": has jax-cuda12-plugin):
    this one, ``$JAXRL_LLM_<TPU|GPU>_PYTHON``, or the project's ``.venv-<tpu|gpu>`` (made by
    ``scripts/setup_<tpu|gpu>_compiler.sh``)."""
    import importlib.util
    from pathlib import Path

    module = "libtpu" if platform == "tpu" else "jax_cuda12_plugin"
    if importlib.util.find_spec(module) is not None:
        return sys.executable
    env = os.environ.get(f"JAXRL_LLM_{platform.upper()}_PYTHON")
    if env:
        return env
    venv = Path(__file__).resolve().parents[1] / f".venv-{platform}" / "bin" / "python"
    return str(venv) if venv.exists() else None


def _run_for_target(args, target) -> int:
    """Re-run ``plan`` in a process set up to compile for ``target`` on this host: JAX on the CPU
    (nothing runs on the chips), libtpu told it has no TPU to talk to, GPU autotuning off."""
    import subprocess

    py = _compiler_python(target.platform)
    if py is None:
        script = f"scripts/setup_{target.platform}_compiler.sh"
        return _usage_error(UsageError(f"--target {target.name}: compiling for {target.platform.upper()} needs "
                                       f"{'libtpu' if target.platform == 'tpu' else 'jax-cuda12-plugin'}; run "
                                       f"`bash {script}` (it makes .venv-{target.platform}), then this command again"))
    env = dict(os.environ, JAX_PLATFORMS="cpu", **{PLAN_TARGET_CHILD: "1"})
    if target.platform == "tpu":
        env.setdefault("TPU_SKIP_MDS_QUERY", "1")
        env.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
        env.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-1")
    else:
        flags = env.get("XLA_FLAGS", "")
        if "xla_gpu_autotune_level" not in flags:
            env["XLA_FLAGS"] = (flags + " --xla_gpu_autotune_level=0").strip()
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    print(f"(compiling for {target.name}: {target.devices} {target.chip} devices, with "
          f"{'libtpu' if target.platform == 'tpu' else 'the XLA GPU compiler'} on this host)", file=sys.stderr,
          flush=True)
    return subprocess.call([py, "-m", "jaxrl_llm", "plan", *args.argv], env=env)


def _format_search(res: dict) -> str:
    from jaxrl_llm.plan import format_plan

    lines = [f"Search over remat, context and micro-batches ({res['usable_hbm_gib']:.2f} GiB usable per device):",
             "", "| remat | context | fsdp | micro-batches | peak GiB | fits |", "|---|---|---|---|---|---|"]
    for t in res["tried"]:
        peak = "refused" if t["refused"] else f"{t['peak_gib']:.2f}"
        lines.append(f"| {t['remat']} | {t['context']} | {t['fsdp']} | {t['num_microbatches']} | {peak} | "
                     f"{'yes' if t['fits'] else 'no'} |")
    if res["best"] is None:
        lines += ["", "Nothing tried fits: use more devices, fewer rows per step or shorter rows."]
    else:
        b = res["best_settings"]
        lines += ["", f"Chosen: model.remat={b['remat']} mesh.context={b['context']} mesh.fsdp={b['fsdp']} "
                      f"optim.num_microbatches={b['num_microbatches']}", "", format_plan(res["best"])]
    return "\n".join(lines)


def cmd_plan(args) -> int:
    from jaxrl_llm.plan import check_spec, format_plan, parse_target, plan, search

    try:
        spec = _plan_spec(args)
        target = parse_target(spec.target) if spec.target is not None else None
        if target is not None and not args.search and spec.devices != target.devices:
            raise UsageError(f"the mesh has {spec.devices} devices, the target {target.name} has {target.devices}: "
                             "set the mesh (--mesh / mesh.fsdp=... / --context) to use them all, or --search")
        if args.search and target is None and spec.chip is None and spec.hbm_gib is None:
            raise UsageError("--search needs the devices' memory: --target, --chip or --hbm-gib")
        check_spec(spec)
        mesh = spec.mesh_shape
    except (UsageError, ConfigError, ValueError, TypeError) as e:
        return _usage_error(e)
    if target is not None:
        if not os.environ.get(PLAN_TARGET_CHILD):
            return _run_for_target(args, target)
        try:
            if args.search:
                res = search(spec, log=lambda row: print(f"  tried {row}", file=sys.stderr, flush=True))
                print(json.dumps(res, indent=1, default=str) if args.json else _format_search(res))
                return 0
            report = plan(spec)
        except ValueError as e:
            return _usage_error(e)
        print(json.dumps(report, indent=1) if args.json else format_plan(report))
        return 0
    import math

    import jax

    n = math.prod(mesh)

    if jax.device_count() < n:
        if jax.default_backend() != "cpu" or os.environ.get(PLAN_CHILD):
            return _usage_error(UsageError(f"mesh {','.join(map(str, mesh))} needs {n} devices, this host has "
                                           f"{jax.device_count()} {jax.default_backend()} devices"))
        import subprocess

        flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "force_host_platform_device_count" not in f]
        env = dict(os.environ, XLA_FLAGS=" ".join(flags + [f"--xla_force_host_platform_device_count={n}"]),
                   JAX_PLATFORMS="cpu", **{PLAN_CHILD: "1"})
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # XLA's SPMD warnings on simulated devices
        print(f"(planning on {n} simulated CPU devices)", file=sys.stderr, flush=True)
        return subprocess.call([sys.executable, "-m", "jaxrl_llm", "plan", *args.argv], env=env)
    if args.search:
        res = search(spec, log=lambda row: print(f"  tried {row}", file=sys.stderr, flush=True))
        print(json.dumps(res, indent=1, default=str) if args.json else _format_search(res))
        return 0
    report = plan(spec)
    print(json.dumps(report, indent=1) if args.json else format_plan(report))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top, subs = _parser()
    if not argv or argv[0] not in subs:
        if argv and argv[0] in ("-h", "--help"):
            top.print_help()
            return 0
        top.print_usage(sys.stderr)
        what = f"unknown command {argv[0]!r}" if argv else "a command is required"
        print(f"jaxrl-llm: error: {what} (choose from train, list, check, plan, methods)", file=sys.stderr)
        return 2
    # intermixed: options may come before, between or after the key=value overrides
    args = subs[argv[0]].parse_intermixed_args(argv[1:])
    args.argv = argv[1:]  # `plan` re-runs itself with them on simulated devices
    return {"list": cmd_list, "train": cmd_train, "check": cmd_check, "plan": cmd_plan,
            "methods": cmd_methods}[argv[0]](args)


def entry() -> None:
    """The console script: with ``JAXRL_LLM_HUGEPAGES=1``, first re-executes itself with large
    allocations on huge pages (:mod:`jaxrl_llm.launch`); then :func:`main`."""
    from jaxrl_llm.launch import reexec_with_hugepages

    reexec_with_hugepages()
    sys.exit(main())


if __name__ == "__main__":
    entry()
