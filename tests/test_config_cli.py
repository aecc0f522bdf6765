"""Config overrides (jaxrl_llm.config) and the jaxrl-llm command (jaxrl_llm.cli).

The command is run as ``python -m jaxrl_llm`` in subprocesses against small experiments
written into a temporary folder; the subprocesses of the module are started together (each
spends ~1-2 s importing jax) and the tests read their results. Error paths that need no new
process run ``cli.main`` in-process.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap
from typing import Callable, Literal, Optional

import pytest
import yaml

from jaxrl_llm import cli
from jaxrl_llm.config import ConfigError, apply_overrides, config_diff, to_dict, to_yaml

# ---------------------------------------------------------------------------- config


class Color(enum.Enum):
    RED = 1
    BLUE = 2


@dataclasses.dataclass(frozen=True)
class Optim:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    schedule: Literal["constant", "cosine"] = "constant"


@dataclasses.dataclass(frozen=True)
class Cfg:
    name: str = "run"
    seed: int = 0
    optim: Optim = dataclasses.field(default_factory=Optim)
    buckets: tuple[int, ...] = (32,)
    limit: Optional[int] = None
    tag: Optional[str] = "x"
    color: Color = Color.RED
    out: pathlib.Path = pathlib.Path("runs/a")
    weights: dict[str, float] = dataclasses.field(default_factory=dict)
    verbose: bool = False


def test_overrides_of_every_kind():
    base = Cfg()
    cfg = apply_overrides(base, ["optim.lr=1e-4", "seed=3", "buckets=[32,64]", "limit=5", "tag=null",
                                 "color=BLUE", "out=/tmp/b", "weights.fmt=0.2", "optim.betas=[0.8,0.95]",
                                 "optim.schedule=cosine", "verbose=true"])
    assert type(cfg) is Cfg and type(cfg.optim) is Optim
    assert cfg.optim.lr == 1e-4 and isinstance(cfg.optim.lr, float)
    assert cfg.seed == 3 and cfg.limit == 5 and cfg.tag is None and cfg.verbose is True
    assert cfg.buckets == (32, 64) and isinstance(cfg.buckets, tuple)
    assert cfg.optim.betas == (0.8, 0.95) and isinstance(cfg.optim.betas, tuple)
    assert cfg.color is Color.BLUE and cfg.out == pathlib.Path("/tmp/b") and cfg.weights == {"fmt": 0.2}
    assert cfg.optim.schedule == "cosine"
    assert base == Cfg()  # the input is untouched
    assert apply_overrides(base, []) == base


def test_text_fields_take_the_raw_text():
    # YAML would read these as 7, True and 1000.0; a str field means the text
    cfg = apply_overrides(Cfg(), ["name=007", "tag=yes", "out=1e3"])
    assert (cfg.name, cfg.tag, cfg.out) == ("007", "yes", pathlib.Path("1e3"))
    assert apply_overrides(Cfg(), ["name='a b'"]).name == "a b"
    assert apply_overrides(Cfg(), ["name=x=y"]).name == "x=y"


@pytest.mark.parametrize("override, expect", [
    ("seed=abc", ["'seed'", "'abc'", "int"]),
    ("optim.lr=fast", ["'optim.lr'", "'fast'", "float"]),
    ("limit=1.5", ["'limit'", "1.5"]),
    ("seed=null", ["'seed'", "None"]),
    ("optim.betas=[1,2,3]", ["'optim.betas'", "[1, 2, 3]", "length"]),
    ("optim.betas=[1,x]", ["'optim.betas'", "'x'"]),
    ("buckets=5", ["'buckets'", "5"]),
    ("optim.schedule=linear", ["'optim.schedule'", "'linear'", "constant", "cosine"]),
    ("color=GREEN", ["'color'", "'GREEN'", "RED", "BLUE"]),
    ("weights.fmt=big", ["'weights.fmt'", "'big'"]),
])
def test_type_errors_name_the_field_and_the_value(override, expect):
    with pytest.raises(ConfigError) as e:
        apply_overrides(Cfg(), [override])
    msg = str(e.value)
    assert "\n" not in msg and f"override {override!r}" in msg
    for part in expect:
        assert part in msg, (part, msg)


def test_unknown_keys_list_the_valid_keys_and_close_matches():
    with pytest.raises(ConfigError, match=r"unknown key 'optim\.lrr'.*valid keys of 'optim' \(Optim\): lr, betas, "
                                          r"schedule; did you mean 'optim\.lr'\?"):
        apply_overrides(Cfg(), ["optim.lrr=1"])
    with pytest.raises(ConfigError, match=r"unknown key 'sed'.*name, seed, optim.*did you mean 'seed'"):
        apply_overrides(Cfg(), ["sed=1"])
    with pytest.raises(ConfigError, match=r"unknown key 'lr'.*did you mean 'optim\.lr'"):  # right name, wrong level
        apply_overrides(Cfg(), ["lr=1"])
    with pytest.raises(ConfigError, match=r"unknown key 'zzz'") as e:
        apply_overrides(Cfg(), ["zzz=1"])
    assert "did you mean" not in str(e.value)
    with pytest.raises(ConfigError, match=r"'seed' is a field of type int, it has no key 'x'"):
        apply_overrides(Cfg(), ["seed.x=1"])


@pytest.mark.parametrize("bad", ["seed", "=3", "a..b=1", "optim.=1"])
def test_malformed_overrides(bad):
    with pytest.raises(ConfigError, match=r"key=value|dotted field name"):
        apply_overrides(Cfg(), [bad])


def test_yaml_files_merge_before_the_overrides(tmp_path):
    a = tmp_path / "a.yaml"
    a.write_text("seed: 5\noptim:\n  lr: 1e-4\n  betas: [0.5, 0.6]\nname: from_a\n")
    b = tmp_path / "b.yaml"
    b.write_text("name: from_b\n")
    cfg = apply_overrides(Cfg(), ["seed=7"], config_files=[a, str(b)])
    assert cfg.seed == 7 and cfg.name == "from_b"  # later files, then overrides, win
    assert cfg.optim.lr == 1e-4 and cfg.optim.betas == (0.5, 0.6)  # 1e-4 is a float (PyYAML alone: a string)
    assert cfg.optim.schedule == "constant"  # untouched sibling in a partially given block


def test_yaml_file_errors(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("optim:\n  lrr: 1\n")
    with pytest.raises(ConfigError, match=r"unknown key 'optim\.lrr' in config file '.*c\.yaml'.*did you mean 'optim\.lr'"):
        apply_overrides(Cfg(), config_files=[f])
    f.write_text("seed: abc\n")
    with pytest.raises(ConfigError, match=r"invalid value 'abc' for 'seed' \(type int\) in config file '.*c\.yaml'"):
        apply_overrides(Cfg(), config_files=[f])
    f.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match=r"must hold a mapping"):
        apply_overrides(Cfg(), config_files=[f])
    f.write_text("seed: [1\n")
    with pytest.raises(ConfigError, match=r"not valid YAML"):
        apply_overrides(Cfg(), config_files=[f])
    with pytest.raises(ConfigError, match=r"config file not found: '.*nope\.yaml'"):
        apply_overrides(Cfg(), config_files=[tmp_path / "nope.yaml"])


def test_to_dict_to_yaml_and_back(tmp_path):
    cfg = apply_overrides(Cfg(), ["buckets=[8,16]", "color=BLUE", "weights.a=1.5", "limit=3", "name=007"])
    d = to_dict(cfg)
    assert json.loads(json.dumps(d)) == d
    assert d["buckets"] == [8, 16] and d["color"] == "BLUE" and d["out"] == "runs/a" and d["optim"]["betas"] == [0.9, 0.999]
    text = to_yaml(cfg)
    assert "buckets: [8, 16]" in text and "optim:\n  lr: 0.001" in text
    f = tmp_path / "cfg.yaml"
    f.write_text(text)
    assert apply_overrides(Cfg(), config_files=[f]) == cfg  # the printed config is a valid config file


def test_config_diff():
    cfg = apply_overrides(Cfg(), ["optim.lr=1e-4", "buckets=[8]", "weights.a=2"])
    assert config_diff(cfg) == {"optim.lr": (1e-3, 1e-4), "buckets": ([32], [8]), "weights.a": ("<unset>", 2.0)}
    assert config_diff(Cfg()) == {}
    assert config_diff(cfg, default=cfg) == {}


def test_field_types_a_config_cannot_hold():
    @dataclasses.dataclass(frozen=True)
    class WithFn:
        fn: Callable = print

    with pytest.raises(ConfigError, match=r"WithFn\.fn cannot be held in a config"):
        apply_overrides(WithFn(), [])
    with pytest.raises(TypeError, match="dataclass instance"):
        apply_overrides(Cfg, ["seed=1"])
    with pytest.raises(TypeError, match="list of 'key=value'"):
        apply_overrides(Cfg(), "seed=1")


def test_future_annotations_module_types_resolve(tmp_path):
    # experiments use `from __future__ import annotations`; the CLI loads them as registered modules
    f = tmp_path / "fut.py"
    f.write_text("from __future__ import annotations\nimport dataclasses\n"
                 "@dataclasses.dataclass(frozen=True)\nclass Config:\n    n: int = 1\n    b: tuple[int, ...] = (1,)\n"
                 "def main(cfg):\n    return cfg\n")
    exp = cli.load_experiment(f)
    cfg = apply_overrides(exp.default, ["n=4", "b=[2,3]"])
    assert (cfg.n, cfg.b) == (4, (2, 3))
    with pytest.raises(ConfigError, match="'n'.*'x'"):
        apply_overrides(exp.default, ["n=x"])


# ---------------------------------------------------------------------------- CLI

DUMMY = '''
"""A dummy experiment for the CLI tests, whose summary
spans two lines.

More text that list does not show.
"""
import dataclasses
import json
import os


@dataclasses.dataclass(frozen=True)
class Optim:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)


@dataclasses.dataclass(frozen=True)
class Config:
    out: str = "main_out.json"
    steps: int = 3
    optim: Optim = dataclasses.field(default_factory=Optim)
    buckets: tuple[int, ...] = (32,)
    fail: bool = False


def check(cfg):
    with open(os.environ.get("CHECK_LOG", "check.log"), "a") as f:
        f.write(f"check steps={cfg.steps}\\n")


def main(cfg):
    if cfg.fail:
        raise RuntimeError("boom from the experiment")
    with open(cfg.out, "w") as f:
        json.dump({"cls": type(cfg).__name__, "steps": cfg.steps, "lr": cfg.optim.lr,
                   "betas": list(cfg.optim.betas), "betas_tuple": isinstance(cfg.optim.betas, tuple),
                   "buckets": list(cfg.buckets)}, f)
    return {"done": cfg.steps}
'''

FACTORY = '''
"""Built by a config() function."""
import dataclasses


@dataclasses.dataclass
class C:
    width: int = 1


def config():
    return C(width=8)


def main(cfg):
    return {"width": cfg.width}
'''

BAD_CHECK = '''
"""Its check() rejects the config."""
import dataclasses


@dataclasses.dataclass(frozen=True)
class Config:
    devices: int = 256


def check(cfg):
    raise ValueError(f"needs {cfg.devices} devices, this host has 1")


def main(cfg):
    raise AssertionError("main must not run")
'''

SCRIPT = '''"""A plain script: no Config."""
def main(argv=None):
    pass
'''

NO_MAIN = '''"""Config but no main."""
import dataclasses


@dataclasses.dataclass
class Config:
    x: int = 0
'''


def _write_experiments(root: pathlib.Path) -> pathlib.Path:
    d = root / "experiments"
    d.mkdir(parents=True)
    for name, text in [("dummy", DUMMY), ("factory", FACTORY), ("bad_check", BAD_CHECK), ("script", SCRIPT),
                       ("no_main", NO_MAIN)]:
        (d / f"{name}.py").write_text(textwrap.dedent(text).lstrip())
    return d


class _Runs:
    """Subprocesses of ``python -m jaxrl_llm`` started together; ``get(name)`` waits for one."""

    def __init__(self, root: pathlib.Path):
        self.root, self.procs, self.done = root, {}, {}

    def start(self, name: str, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != cli.ENV_DIRS}
        env["CHECK_LOG"] = str(self.root / f"{name}.check.log")
        env["JAX_PLATFORMS"] = "cpu"
        self.procs[name] = subprocess.Popen([sys.executable, "-m", "jaxrl_llm", *args], cwd=self.root, env=env,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def get(self, name: str) -> subprocess.CompletedProcess:
        if name not in self.done:
            p = self.procs[name]
            out, err = p.communicate(timeout=120)
            self.done[name] = subprocess.CompletedProcess(p.args, p.returncode, out, err)
        return self.done[name]

    def check_log(self, name: str) -> str:
        f = self.root / f"{name}.check.log"
        return f.read_text() if f.exists() else ""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    _write_experiments(root)
    (root / "over.yaml").write_text("steps: 5\noptim:\n  lr: 2e-4\n")
    r = _Runs(root)
    r.start("list", "list")
    r.start("train", "train", "dummy", "steps=7", "--config", "over.yaml", "buckets=[32,64]",
            "optim.betas=[0.5,0.6]", "out=train_out.json")
    r.start("print", "train", "dummy", "--print-config", "optim.lr=1e-5", "out=print_out.json")
    r.start("check", "check", "dummy", "factory", "bad_check")
    r.start("unknown", "train", "dummyy")
    r.start("raises", "train", "experiments/dummy.py", "fail=true", "out=raises_out.json")
    yield r
    for p in r.procs.values():
        if p.poll() is None:
            p.kill()
            p.wait()


def test_cli_list(runs):
    r = runs.get("list")
    assert r.returncode == 0, r.stderr
    lines = {line.split()[0]: line for line in r.stdout.splitlines() if line.strip()}
    assert "A dummy experiment for the CLI tests, whose summary spans two lines." in lines["dummy"]
    assert "More text" not in r.stdout
    assert "Built by a config() function." in lines["factory"]
    assert "not a CLI experiment" in lines["script"] and "[" not in lines["no_main"]  # its config type decides
    assert "[" not in lines["dummy"] and "[" not in lines["factory"]


def test_cli_train_overrides_reach_main(runs):
    r = runs.get("train")
    assert r.returncode == 0, r.stderr
    got = json.loads((runs.root / "train_out.json").read_text())
    # the file set steps=5 and lr; the later override steps=7 wins
    assert got == {"cls": "Config", "steps": 7, "lr": 2e-4, "betas": [0.5, 0.6], "betas_tuple": True,
                   "buckets": [32, 64]}
    assert json.loads(r.stdout) == {"done": 7}  # what main returned
    assert "steps=7 (default 3)" in r.stderr and "optim.lr=0.0002 (default 0.001)" in r.stderr
    assert runs.check_log("train") == "check steps=7\n"  # train runs check(cfg) before main


def test_cli_print_config(runs):
    r = runs.get("print")
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout) == {"out": "print_out.json", "steps": 3, "optim": {"lr": 1e-5, "betas": [0.9, 0.999]},
                                        "buckets": [32], "fail": False}
    assert not (runs.root / "print_out.json").exists() and runs.check_log("print") == ""


def test_cli_check_calls_check(runs):
    r = runs.get("check")
    assert r.returncode == 1, (r.stdout, r.stderr)  # bad_check's check() raised
    assert runs.check_log("check") == "check steps=3\n"
    assert "ok    dummy: check() passed" in r.stdout
    assert "ok    factory: config resolved (no check())" in r.stdout
    assert "FAIL  bad_check: ValueError: needs 256 devices, this host has 1" in r.stdout
    assert "Traceback" in r.stderr and "1 of 3 experiments failed" in r.stderr


def test_cli_unknown_experiment(runs):
    r = runs.get("unknown")
    assert r.returncode == 2
    assert r.stderr.startswith("jaxrl-llm: error: unknown experiment 'dummyy' (did you mean 'dummy'?); known: ")
    assert "bad_check, dummy, factory" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_cli_experiment_exception_propagates(runs):
    r = runs.get("raises")
    assert r.returncode == 1
    assert "Traceback" in r.stderr and "RuntimeError: boom from the experiment" in r.stderr


# in-process: the same entry point without starting another interpreter


@pytest.fixture
def exp_dir(tmp_path, monkeypatch):
    d = _write_experiments(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(cli.ENV_DIRS, str(d))
    monkeypatch.setenv("CHECK_LOG", str(tmp_path / "check.log"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    return d


@pytest.mark.parametrize("argv, pattern", [
    (["train", "dummy", "steps=abc"],
     r"^jaxrl-llm: error: invalid value 'abc' for 'steps' \(type int\) in override 'steps=abc': .*Integer$"),
    (["train", "dummy", "optim.lrr=1"],
     r"^jaxrl-llm: error: unknown key 'optim\.lrr' .* lr, betas; did you mean 'optim\.lr'\?$"),
    (["train", "dummy", "steps"], r"^jaxrl-llm: error: override 'steps' is not key=value"),
    (["train", "dummy", "--config", "missing.yaml"], r"^jaxrl-llm: error: config file not found: 'missing\.yaml'$"),
    (["train", "no_main"], r"^jaxrl-llm: error: .*no_main\.py is not an experiment: no runner for a Config config: jaxrl-llm runs "
                          r"RLRunConfig, PreferenceRunConfig, ToyRunConfig, AgentRunConfig configs \(or define main\(cfg\)"),
    (["train", "script"], r"^jaxrl-llm: error: .*script\.py is not an experiment: it defines no Config dataclass"),
    (["train", "nothere/x.py"], r"^jaxrl-llm: error: experiment file not found: nothere/x\.py$"),
    (["frobnicate"], r"unknown command 'frobnicate'"),
])
def test_cli_usage_errors_exit_2(exp_dir, capsys, argv, pattern):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert any(re.search(pattern, line) for line in err), err
    assert not any("Traceback" in line for line in err)


def test_cli_dry_run_and_check_all(exp_dir, capsys):
    assert cli.main(["train", "dummy", "--dry-run", "steps=11", "out=dry.json"]) == 0
    assert (exp_dir.parent / "check.log").read_text() == "check steps=11\n"
    assert not (exp_dir.parent / "dry.json").exists()
    assert "dry run" in capsys.readouterr().err
    # every experiment found: scripts skipped, a file without main and a failing check() fail
    assert cli.main(["check"]) == 1
    out = capsys.readouterr().out
    assert "skip  script:" in out and "FAIL  no_main:" in out and "FAIL  bad_check:" in out
    assert "ok    dummy" in out and "ok    factory" in out


def test_cli_factory_config_and_paths(exp_dir, capsys):
    assert cli.main(["train", str(exp_dir / "factory.py"), "width=3"]) == 0
    assert json.loads(capsys.readouterr().out) == {"width": 3}
    assert cli.main(["train", "factory", "--print-config"]) == 0
    assert capsys.readouterr().out == "width: 8\n"  # config() supplies the defaults


# ---------------------------------------------------------------------------- Choice fields


from jaxrl_llm.config import Choice  # noqa: E402


@dataclasses.dataclass(frozen=True)
class ChoiceRecipe:
    loss: Choice = dataclasses.field(default_factory=lambda: Choice("ppo", {"clip_low": 0.2}))
    agg: str = "token-mean"


@dataclasses.dataclass(frozen=True)
class ChoiceConfig:
    recipe: ChoiceRecipe = dataclasses.field(default_factory=ChoiceRecipe)


def test_choice_fields_select_a_part_and_set_its_arguments(tmp_path):
    C = ChoiceConfig
    c = apply_overrides(C(), ["recipe.loss.clip_high=0.28"])  # an argument: the choice is kept
    assert c.recipe.loss == Choice("ppo", {"clip_low": 0.2, "clip_high": 0.28})
    c = apply_overrides(C(), ["recipe.loss=gspo", "recipe.loss.clip_low=3e-4", "recipe.loss.variant=sequence"])
    assert c.recipe.loss == Choice("gspo", {"clip_low": 3e-4, "variant": "sequence"})  # selecting resets
    assert apply_overrides(c, ["recipe.loss=null"]).recipe.loss == Choice(None, {})
    assert apply_overrides(C(), ["recipe.loss.name=cispo"]).recipe.loss == Choice("cispo", {})
    # YAML: a name, or a mapping of the name and arguments; --print-config's YAML loads back
    f = tmp_path / "c.yaml"
    f.write_text("recipe:\n  loss: {name: cispo, clip_high: 5.0}\n  agg: seq-mean-token-mean\n")
    c = apply_overrides(C(), config_files=[f])
    assert c.recipe.loss == Choice("cispo", {"clip_high": 5.0}) and c.recipe.agg == "seq-mean-token-mean"
    f.write_text(to_yaml(c))
    assert apply_overrides(C(), config_files=[f]) == c
    assert to_dict(c)["recipe"]["loss"] == {"name": "cispo", "args": {"clip_high": 5.0}}
    with pytest.raises(ConfigError, match="unknown key 'recipe.los'.*did you mean 'recipe.loss'"):
        apply_overrides(C(), ["recipe.los=gspo"])
    with pytest.raises(ConfigError, match="set one argument of a choice at a time"):
        apply_overrides(C(), ["recipe.loss.args=3"])


def test_cli_no_readable_checkpoint_is_one_line_exit_1(exp_dir, capsys):
    (exp_dir / "damaged.py").write_text(textwrap.dedent('''
        import dataclasses

        @dataclasses.dataclass
        class Config:
            x: int = 0

        def main(cfg):
            from jaxrl_llm.training.checkpoint import UnreadableCheckpoint
            raise UnreadableCheckpoint("no checkpoint in runs/x/ckpt could be read (all left in place): step 4: x")
    ''').lstrip())
    assert cli.main(["train", "damaged"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "jaxrl-llm: error: no checkpoint in runs/x/ckpt could be read (all left in place): step 4: x"
    assert not any("Traceback" in line for line in err)
