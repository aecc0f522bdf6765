"""The jaxrl-llm command's process set-up (jaxrl_llm/launch.py): when it re-executes itself with
large allocations on huge pages (opt-in, JAXRL_LLM_HUGEPAGES=1), that the re-executed process
has the setting, and that the package itself imports without JAX."""

import os
import subprocess
import sys
import textwrap

import pytest

from jaxrl_llm.launch import OPT_IN, TUNABLE, _thp_mode, malloc_environment

NEW = (2, 36)


def test_sets_the_tunable_keeping_the_others():
    env = malloc_environment({"PATH": "/bin", OPT_IN: "1"}, glibc=NEW, thp="madvise")
    assert env == {"PATH": "/bin", OPT_IN: "1", "GLIBC_TUNABLES": f"{TUNABLE}=1"}
    env = malloc_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", OPT_IN: "yes"}, glibc=NEW,
                             thp="always")
    assert env["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{TUNABLE}=1"


@pytest.mark.parametrize("environ,glibc,thp", [
    ({}, NEW, "madvise"),  # opt-in: not asked for
    ({OPT_IN: "0"}, NEW, "madvise"),
    ({OPT_IN: "off"}, NEW, "madvise"),
    ({OPT_IN: "1", "GLIBC_TUNABLES": f"{TUNABLE}=0"}, NEW, "madvise"),  # the user's own value wins
    ({OPT_IN: "1", "GLIBC_TUNABLES": f"glibc.malloc.arena_max=2:{TUNABLE}=2"}, NEW, "madvise"),
    ({OPT_IN: "1"}, (2, 34), "madvise"),  # the tunable is new in glibc 2.35
    ({OPT_IN: "1"}, None, "madvise"),  # musl, macOS
    ({OPT_IN: "1"}, NEW, "never"),
    ({OPT_IN: "1"}, NEW, None),  # no transparent huge pages
])
def test_nothing_to_do(environ, glibc, thp):
    assert malloc_environment(environ, glibc=glibc, thp=thp) is None


def test_thp_mode_reads_the_bracketed_word(tmp_path):
    p = tmp_path / "enabled"
    p.write_text("always [madvise] never\n")
    assert _thp_mode(str(p)) == "madvise"
    p.write_text("[always] madvise never\n")
    assert _thp_mode(str(p)) == "always"
    assert _thp_mode(str(tmp_path / "missing")) is None


def test_the_command_reexecutes_itself_once_with_the_setting(tmp_path):
    """`JAXRL_LLM_HUGEPAGES=1 python -m jaxrl_llm train <file>` runs the file's config() in the re-executed process: it
    sees the tunable (when this machine supports it), the same argv, and no second re-exec."""
    exp = tmp_path / "show_env.py"
    out = tmp_path / "seen.txt"
    exp.write_text(textwrap.dedent(f"""
        import os, sys
        def config():
            with open({str(out)!r}, "a") as f:
                f.write(repr((os.environ.get("GLIBC_TUNABLES"), os.getpid(), sys.argv[1:])) + "\\n")
            raise SystemExit(0)
    """))
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", OPT_IN)}
    p = subprocess.run([sys.executable, "-m", "jaxrl_llm", "train", str(exp)], env=dict(env, **{OPT_IN: "1"}),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = out.read_text().splitlines()
    assert len(lines) == 1  # config() ran once: the process was replaced before, not after
    tunables, _pid, argv = eval(lines[0])
    assert argv == ["train", str(exp)]
    expected = malloc_environment(dict(env, **{OPT_IN: "1"}))
    assert tunables == (expected["GLIBC_TUNABLES"] if expected else None)
    # not asked for (the default): the environment as given
    out.unlink()
    p = subprocess.run([sys.executable, "-m", "jaxrl_llm", "train", str(exp)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert eval(out.read_text().splitlines()[0])[0] is None


def test_importing_the_command_does_not_import_jax():
    code = "import sys, jaxrl_llm.cli, jaxrl_llm.launch; print('jax' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == "False", p.stderr
    code = "import jaxrl_llm; print(jaxrl_llm.grpo_advantages.__module__, 'core' in dir(jaxrl_llm))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.stdout.split() == ["jaxrl_llm.core.advantages", "True"], p.stderr
