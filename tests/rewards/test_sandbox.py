"""The code sandbox: normal grading, and hostile code that must be contained.

Every hostile case checks three things: the parent (this pytest process) survives, the score
is 0, and the attack had no effect outside the sandbox (file absent, no connection received,
secret not leaked, process count bounded, no process left behind). Hostile cases run in up to
three modes: all layers (``default``), the OS layers alone (``os_only``: no audit hook, needs
namespaces) and the audit hook without namespaces (``hook_only``).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

resource = pytest.importorskip("resource")  # POSIX only

from jaxrl_llm.rewards import sandbox as sb
from jaxrl_llm.rewards.sandbox import (
    SandboxConfig,
    SandboxResult,
    code_reward,
    extract_code,
    run_code,
    sandbox_capabilities,
)

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the sandbox needs POSIX")

CAPS = sandbox_capabilities()
LINUX = sys.platform.startswith("linux")
FAST = SandboxConfig(timeout_s=2.0, cpu_s=2, memory_mb=256)


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def _parent_chain(pid: int) -> list[tuple[int, int]]:
    """``(pid, ppid)`` from ``pid`` up to (not including) init; shorter when unreadable."""
    out: list[tuple[int, int]] = []
    seen: set[int] = set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/status") as f:
                ppid = int(re.search(r"^PPid:\s+(\d+)", f.read(), re.M).group(1))
        except (OSError, AttributeError):
            break
        out.append((pid, ppid))
        pid = ppid
    return out


def _ancestors(pid: int) -> set[int]:
    """The parent chain of ``pid`` (empty when it cannot be read)."""
    return {p for p, _ in _parent_chain(pid)}


def _run_by_a_sibling_worker(pid: int) -> bool:
    """True when ``pid`` descends from another child of this process's parent: under
    pytest-xdist, a sandbox another worker is running right now (e.g. the agents' python tool).
    Orphans (reparented to init or a subreaper) are not excluded: a leak is what we look for."""
    me, parent = os.getpid(), os.getppid()
    return any(p != me and pp == parent for p, pp in _parent_chain(pid)[1:])


def _sandbox_processes(mine_only: bool = False) -> list[tuple[int, str]]:
    """Live processes that belong to some sandbox run: their command line carries the harness
    script's path (forks of it inherit it), or (as root) their uid is in the per-run range.
    ``mine_only``: only descendants of this process (another pytest worker's sandboxes, e.g. the
    agents' python tool, run at the same time). Otherwise every sandbox process except those a
    sibling pytest worker is running: descendants of this process and orphans."""
    if not LINUX:
        return []
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{name}/status") as f:
                status = f.read()
        except OSError:
            continue
        state = re.search(r"^State:\s+(\S)", status, re.M)
        uid = int(re.search(r"^Uid:\s+(\d+)", status, re.M).group(1))
        if state and state.group(1) in "ZX":
            continue
        if os.fsencode(sb._CHILD_SCRIPT) in cmd or sb._UID_BASE <= uid < sb._UID_BASE + sb._UID_SPAN:
            if mine_only and me not in _ancestors(int(name)):
                continue
            if not mine_only and _run_by_a_sibling_worker(int(name)):
                continue
            found.append((int(name), state.group(1) if state else "?"))
    return found


def assert_no_sandbox_processes_left() -> None:
    deadline = time.monotonic() + 3.0
    while _sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _sandbox_processes()
    # On failure, say whose they are: the parent chain names the run that leaked them.
    assert left == [], [(pid, state, _parent_chain(pid)) for pid, state in left]


class PeakSandboxProcesses:
    """Samples the number of live sandbox processes in a background thread."""

    def __enter__(self) -> "PeakSandboxProcesses":
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, len(_sandbox_processes(mine_only=True)))
            time.sleep(0.01)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _parent_still_works() -> None:
    assert subprocess.run(["true"], check=False).returncode == 0


_readable_python: dict[str, str | None] = {}


def _python_without_namespaces() -> str | None:
    """An interpreter that works without namespaces (as root: readable by an unprivileged uid)."""
    if "p" not in _readable_python:
        _readable_python["p"] = None
        for cand in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
            if cand and os.path.exists(cand):
                cfg = SandboxConfig(use_namespaces=False, python=cand, timeout_s=20)
                if run_code("import fractions, json", config=cfg).error is None:
                    _readable_python["p"] = cand
                    break
    return _readable_python["p"]


@pytest.fixture(params=["default", "os_only", "hook_only"])
def mode(request: pytest.FixtureRequest) -> tuple[str, SandboxConfig]:
    name = request.param
    if name == "default":
        return name, FAST
    if name == "os_only":
        if not (CAPS["namespaces"] and CAPS["process_cleanup"]):
            pytest.skip("OS-only containment needs Linux namespaces")
        return name, dataclasses.replace(FAST, audit_hook=False)
    python = _python_without_namespaces()
    if python is None:
        pytest.skip("no interpreter usable without namespaces (as root: none readable by another uid)")
    return name, dataclasses.replace(FAST, use_namespaces=False, python=python)


# --------------------------------------------------------------------------------------
# normal grading
# --------------------------------------------------------------------------------------

ADD = "def add(a, b):\n    return a + b\n"
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4", "assert add(0, 0) == 0"]


def test_correct_code_scores_one():
    r = run_code(ADD, ADD_TESTS)
    assert isinstance(r, SandboxResult)
    assert (r.passed, r.total, r.error, r.timed_out) == (4, 4, None, False)
    assert r.score == 1.0 and r.returncode == 0


def test_wrong_code_scores_zero():
    r = run_code("def add(a, b):\n    return a - b - 1\n", ADD_TESTS)
    assert (r.passed, r.total, r.error) == (0, 4, None)
    assert r.score == 0.0
    assert r.stderr.count("[sandbox] test") == 4


def test_partial_credit_is_fraction_passed():
    # a * b agrees with a + b only on (2, 2) and (0, 0)
    r = run_code("def add(a, b):\n    return a * b\n", ADD_TESTS)
    assert (r.passed, r.total, r.error) == (2, 4, None)
    assert r.score == 0.5


def test_syntax_error_scores_zero():
    r = run_code("def add(a, b)\n    return a + b\n", ADD_TESTS)
    assert r.score == 0.0 and r.passed == 0
    assert "SyntaxError" in r.error


def test_code_raising_at_import_scores_zero():
    r = run_code(ADD + "raise RuntimeError('boom')\n", ADD_TESTS)
    assert r.score == 0.0 and r.passed == 0
    assert "RuntimeError: boom" in r.error and "RuntimeError: boom" in r.stderr


def test_test_snippets_are_isolated_and_can_fail_to_compile():
    code = ADD + "counter = []\n"
    tests = ["counter.append(1)\nassert len(counter) == 1", "x = 5", "assert 'x' not in globals()", "assert (", ]
    r = run_code(code, tests)
    # names a test defines do not leak into the next one; a test that does not compile fails
    assert (r.passed, r.total) == (3, 4)
    assert "does not compile" in r.stderr


def test_without_tests_runs_as_main_and_reads_stdin():
    code = "import sys\nif __name__ == '__main__':\n    print(sum(int(x) for x in sys.stdin.read().split()))\n"
    r = run_code(code, stdin="1 2 3\n")
    assert (r.stdout, r.error, r.score, r.total) == ("6\n", None, 1.0, 0)
    r = run_code("raise SystemExit(3)")
    assert r.score == 0.0 and "SystemExit" in r.error


def test_with_tests_the_main_block_does_not_run():
    r = run_code(ADD + "if __name__ == '__main__':\n    input()\n", ADD_TESTS[:1])
    assert r.score == 1.0


def test_stdout_and_stderr_are_captured():
    r = run_code("import sys\nprint('hello')\nprint('warn', file=sys.stderr)\n" + ADD, ADD_TESTS[:1])
    assert r.stdout == "hello\n"
    assert r.stderr == "warn\n"
    assert not r.output_truncated and r.score == 1.0


def test_output_is_truncated_without_stopping_the_program():
    cfg = SandboxConfig(max_output_bytes=1000)
    r = run_code("import sys\nprint('x' * 300_000)\nsys.stderr.write('y' * 300_000)\n" + ADD, ADD_TESTS, config=cfg)
    assert len(r.stdout.encode()) == 1000 and set(r.stdout) == {"x"}
    assert len(r.stderr.encode()) == 1000 and set(r.stderr) == {"y"}
    assert r.output_truncated and r.score == 1.0


def test_endless_output_is_capped_and_timed_out():
    cfg = dataclasses.replace(FAST, timeout_s=1.0, max_output_bytes=5000)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = run_code("while True:\n    print('spam' * 1000)\n", ["assert True"], config=cfg)
    assert r.timed_out and r.score == 0.0 and "timeout" in r.error
    assert len(r.stdout) == 5000 and r.output_truncated
    # ru_maxrss is in KiB on Linux: the parent did not buffer the stream
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50_000
    assert_no_sandbox_processes_left()


def test_working_dir_is_fresh_and_removed_even_after_chmod():
    code = (
        "import os\n"
        "print(os.getcwd())\n"
        "os.makedirs('a/b')\n"
        "open('a/b/f', 'w').write('data')\n"
        "os.chmod('a/b/f', 0)\nos.chmod('a/b', 0)\nos.chmod('a', 0)\n"
        "assert os.environ['HOME'] == os.getcwd()\n"
    )
    r = run_code(code)
    assert r.error is None, r.stderr
    workdir = r.stdout.strip()
    assert workdir and workdir != os.getcwd() and "jaxrl_sandbox_" in workdir
    assert not os.path.exists(workdir)


def test_removal_of_chmodded_deep_trees():
    # exercised directly: with namespaces the sandbox's files live in a tmpfs the host never sees
    import tempfile

    root = tempfile.mkdtemp()
    d = root
    for _ in range(1500):  # deeper than the recursion limit of shutil.rmtree
        d = os.path.join(d, "d")
        os.mkdir(d)
    Path(d, "f").write_text("x")
    os.chmod(d, 0)
    os.chmod(os.path.join(root, "d"), 0o500)
    assert sb._rmtree(root) is None
    assert not os.path.exists(root)


def test_bad_arguments_name_the_argument():
    with pytest.raises(TypeError, match="code"):
        run_code(b"print(1)")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tests"):
        run_code(ADD, "assert add(1, 2) == 3")  # a bare str is not a list of tests
    with pytest.raises(TypeError, match=r"tests\[1\]"):
        run_code(ADD, ["assert True", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="stdin"):
        run_code(ADD, stdin=b"1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="config"):
        run_code(ADD, config={"timeout_s": 1})  # type: ignore[arg-type]
    for field, value in [("timeout_s", 0), ("timeout_s", float("nan")), ("cpu_s", 0), ("memory_mb", 1),
                         ("max_procs", 0), ("max_output_bytes", -1), ("python", ""), ("use_namespaces", "yes")]:
        with pytest.raises(ValueError, match=field):
            SandboxConfig(**{field: value})


def test_missing_interpreter_is_an_error_result_not_an_exception():
    r = run_code(ADD, ADD_TESTS, config=SandboxConfig(python="/nonexistent/python", use_namespaces=False))
    assert r.score == 0.0 and r.error is not None


def test_capabilities_are_reported():
    assert set(CAPS) == {"fresh_interpreter", "clean_environment", "rlimits", "privilege_drop", "namespaces",
                         "private_tmp", "network_isolation", "audit_hook", "process_cleanup"}
    assert all(isinstance(v, bool) for v in CAPS.values())
    assert CAPS["fresh_interpreter"] and CAPS["clean_environment"] and CAPS["audit_hook"]
    assert CAPS["privilege_drop"] == (os.geteuid() == 0)
    assert sandbox_capabilities(SandboxConfig(use_namespaces=False))["namespaces"] is False
    assert sandbox_capabilities(SandboxConfig(audit_hook=False))["audit_hook"] is False


@pytest.mark.skipif(not CAPS["namespaces"], reason="needs Linux namespaces")
def test_namespace_layer_is_active():
    code = (
        "import os, socket\n"
        "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "print(os.getpid(), pids, sorted(name for _, name in socket.if_nameindex()))\n"
    )
    r = run_code(code, config=dataclasses.replace(FAST, audit_hook=False))
    assert r.error is None, r.stderr
    pid, pids, ifaces = r.stdout.split(" ", 2)
    assert pid == "1" and pids == "[1]"  # own PID namespace, own /proc
    assert ifaces.strip() == "['lo']"  # own network namespace: only a loopback


# --------------------------------------------------------------------------------------
# markdown extraction and the reward function
# --------------------------------------------------------------------------------------


def test_extract_code():
    md = "Here:\n```python\nx = 1\n```\nthen output\n```text\n1\n```\nfinal:\n```py\nx = 2\n```\n"
    assert extract_code(md) == "x = 2\n"
    assert extract_code("```\nplain = 1\n```") == "plain = 1\n"
    assert extract_code("```js\nlet a = 1\n```") is None  # another language is never run
    assert extract_code("no code at all") is None
    assert extract_code("```python\ndef f():\n    return 1\n") == "def f():\n    return 1\n"  # unclosed fence
    assert extract_code("1. step\n   ```python\n   y = 3\n   ```\n") == "y = 3\n"  # indented fence
    assert extract_code("~~~python\nz = 4\n~~~") == "z = 4\n"
    assert extract_code("```python\na\n```\n```\nb\n```") == "a\n"  # tagged beats untagged
    assert extract_code("```rust\nfn main() {}\n```", language="rust") == "fn main() {}\n"
    with pytest.raises(TypeError, match="completion"):
        extract_code(None)  # type: ignore[arg-type]


def test_code_reward_on_markdown_completions():
    good = "Sure!\n```python\n" + ADD + "```\n"
    wrong = "```python\ndef add(a, b):\n    return a - b - 1\n```"
    partial = "```python\ndef add(a, b):\n    return a * b\n```"
    chat = [{"role": "assistant", "content": good}]
    completions = [good, wrong, "I cannot write code.", partial, chat, "```python\nwhile True: pass\n```"]
    tests = [ADD_TESTS] * 5 + ["assert add(1, 2) == 3"]  # a single str is one test
    scores = code_reward(
        ["p"] * 6, completions, tests=tests, config=SandboxConfig(timeout_s=1.0),
        max_workers=2, trainer_state=None, some_column=[0] * 6,
    )
    assert scores == [1.0, 0.0, 0.0, 0.5, 1.0, 0.0]
    assert_no_sandbox_processes_left()


def test_code_reward_bad_arguments():
    with pytest.raises(ValueError, match="tests"):
        code_reward(["p"], ["x"], tests=[["assert True"], ["assert True"]])
    with pytest.raises(ValueError, match=r"tests\[0\]"):
        code_reward(["p"], ["x"], tests=[[]])
    with pytest.raises(ValueError, match="prompts"):
        code_reward(["p", "q"], ["x"], tests=[["assert True"]])
    with pytest.raises(TypeError, match=r"completions\[0\]"):
        code_reward(None, [3], tests=[["assert True"]])
    with pytest.raises(ValueError, match="max_workers"):
        code_reward(None, ["x"], tests=[["assert True"]], max_workers=0)


# --------------------------------------------------------------------------------------
# hostile code
# --------------------------------------------------------------------------------------


def test_infinite_loop(mode):
    # The wall-clock limit is under test: with the CPU limit equal to it, a busy loop on an idle
    # machine races the two and is sometimes killed by RLIMIT_CPU first (test_cpu_limit covers that).
    cfg = dataclasses.replace(mode[1], cpu_s=int(mode[1].timeout_s) + 10)
    t0 = time.monotonic()
    r = run_code("while True:\n    pass\n", ["assert True"], config=cfg)
    elapsed = time.monotonic() - t0
    assert r.timed_out and r.score == 0.0 and "timeout" in r.error
    assert elapsed < cfg.timeout_s + 2.0
    _parent_still_works()
    assert_no_sandbox_processes_left()


def test_cpu_limit(mode):
    cfg = dataclasses.replace(mode[1], timeout_s=60.0, cpu_s=1)
    t0 = time.monotonic()
    r = run_code("while True:\n    pass\n", ["assert True"], config=cfg)
    assert time.monotonic() - t0 < 30.0  # stopped by the CPU limit, long before the wall clock
    assert not r.timed_out and r.score == 0.0 and r.passed == 0 and r.error
    if r.returncode is not None and r.returncode < 0:  # no namespace: the killed process is ours
        assert "SIGKILL" in r.error and "CPU" in r.error
    _parent_still_works()
    assert_no_sandbox_processes_left()


FORK_BOMB = """
import os
while True:
    try:
        os.fork()
    except BaseException:
        pass
"""


def test_fork_bomb(mode):
    name, cfg = mode
    with PeakSandboxProcesses() as peak:
        r = run_code(FORK_BOMB, ["assert True"], config=cfg)
    assert r.score == 0.0 and r.timed_out
    _parent_still_works()
    if LINUX:
        # unshare + the harness + its forks, bounded by RLIMIT_NPROC (the audit hook stops the
        # very first fork); the count of processes actually seen proves the bomb was contained
        assert peak.peak >= 1
        limit = 3 if cfg.audit_hook else cfg.max_procs + 2
        assert peak.peak <= limit, (name, peak.peak)
    assert_no_sandbox_processes_left()


MEMORY_BOMB = """
blocks = []
try:
    blocks.append(bytearray(4 * 1024 ** 3))
    print("ALLOCATED 4 GiB", flush=True)
except MemoryError:
    pass
while True:
    blocks.append(bytearray(32 * 1024 ** 2))
    print("HOLDING", 32 * len(blocks), flush=True)
"""


def test_memory_bomb(mode):
    # The memory limit is under test, not the clock: on a loaded CI machine 128 MiB of page
    # faults can take longer than the fast config's 2 s, so the clock limits are widened here.
    cfg = dataclasses.replace(mode[1], timeout_s=30.0, cpu_s=20)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = run_code(MEMORY_BOMB, ["assert True"], config=cfg)
    assert r.score == 0.0 and "MemoryError" in r.error, (r.error, r.stderr[-500:])
    assert "ALLOCATED" not in r.stdout
    held = [int(x) for x in re.findall(r"HOLDING (\d+)", r.stdout)]
    assert held and max(held) <= cfg.memory_mb  # got memory up to the limit, not beyond
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # KiB
    _parent_still_works()
    assert_no_sandbox_processes_left()


DISK_BOMB = """
import os
written = 0
try:
    for i in range(10_000):
        with open("f%d" % i, "wb") as f:
            for _ in range(4):
                f.write(b"x" * 2 ** 20)
                f.flush()
                written += 1
finally:
    print("WROTE_MB", written, flush=True)
"""


@pytest.mark.skipif(not CAPS["namespaces"], reason="the disk quota is a tmpfs in the mount namespace")
def test_disk_bomb_is_bounded():
    cfg = dataclasses.replace(FAST, disk_mb=8, timeout_s=30.0, cpu_s=20)  # the quota is under test
    r = run_code(DISK_BOMB, ["assert True"], config=cfg)
    assert r.score == 0.0 and "No space left" in r.error, r.error
    written = int(re.search(r"WROTE_MB (\d+)", r.stdout).group(1))
    assert 4 <= written <= 8
    _parent_still_works()


def test_file_size_limit():
    cfg = dataclasses.replace(FAST, max_file_mb=1)
    r = run_code("open('big', 'wb').write(b'x' * 3 * 2 ** 20)", ["assert True"], config=cfg)
    assert r.score == 0.0 and r.error is not None  # EFBIG / SIGXFSZ


WRITE_OUTSIDE = """
import os, pathlib, shutil, subprocess
HITS = {{}}
open("inside.txt", "w").write("fine")
for target in {targets!r}:
    attempts = {{
        "open": lambda: open(target, "w").write("pwned"),
        "pathlib": lambda: pathlib.Path(target).write_text("pwned"),
        "os.open": lambda: os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o666)),
        "dir_fd": lambda: os.close(os.open(os.path.basename(target), os.O_CREAT | os.O_WRONLY, 0o666,
                                           dir_fd=os.open(os.path.dirname(target), os.O_RDONLY))),
        "rename": lambda: os.rename("inside.txt", target),
        "copy": lambda: shutil.copy("inside.txt", target),
        "link": lambda: os.link("inside.txt", target),
        "symlink": lambda: os.symlink(target, "escape") or open("escape", "w").write("pwned"),
        "shell": lambda: subprocess.run("echo pwned > " + target, shell=True, check=True),
        "system": lambda: os.system("echo pwned > " + target) == 0 or 1 / 0,
    }}
    HITS[target] = []
    for how, attempt in attempts.items():
        try:
            attempt()
            if os.path.exists(target):
                HITS[target].append(how)
        except BaseException as e:
            print("blocked", how, type(e).__name__, e)
print("HITS", HITS)
"""


def test_write_outside_working_dir(mode, tmp_path):
    name, cfg = mode
    inside_parent_tmp = tmp_path / "pwned.txt"
    in_tmp = Path("/tmp") / f"jaxrl_pwned_{secrets.token_hex(6)}"
    targets = [str(inside_parent_tmp), str(in_tmp)]
    # the test can only pass if a write to pytest's tmp_path (owned by the parent) worked
    r = run_code(WRITE_OUTSIDE.format(targets=targets), [f"assert HITS[{targets[0]!r}]"], config=cfg)
    try:
        assert r.error is None, (r.error, r.stderr[-800:])
        assert r.score == 0.0
        assert not inside_parent_tmp.exists()
        assert not in_tmp.exists()
        assert "HITS" in r.stdout
        if name != "os_only":
            # with the hook every write to /tmp is refused; without it (os_only) the write lands
            # in the sandbox's private tmpfs: the code sees its file, the host does not (above)
            assert f"{targets[1]!r}: []" in r.stdout, r.stdout
    finally:
        for p in (inside_parent_tmp, in_tmp):
            if p.exists() or p.is_symlink():
                p.unlink()
    _parent_still_works()


READ_PARENT_ENV = """
import os, glob
seen = []
seen.append(repr(dict(os.environ)))
paths = ["/proc/self/environ", "/proc/%d/environ" % os.getppid(), "/proc/1/environ"]
paths += glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/task/*/environ")
paths += ["/proc/%d/environ" % pid for pid in {parent_pids!r}]
for path in paths:
    try:
        with open(path, "rb") as f:
            seen.append(f.read().decode("utf-8", "replace"))
    except BaseException as e:
        print("blocked", path, type(e).__name__)
for pid in {parent_pids!r}:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            seen.append(f.read().decode("utf-8", "replace"))
    except BaseException as e:
        print("blocked cmdline", pid, type(e).__name__)
text = "\\n".join(seen)
FOUND = "JAXRL_SANDBOX_TEST_SECRET" in text
print(text)
"""


def test_read_parent_environment(mode, monkeypatch):
    _, cfg = mode
    secret = secrets.token_hex(16)
    monkeypatch.setenv("JAXRL_SANDBOX_TEST_SECRET", secret)
    code = READ_PARENT_ENV.format(parent_pids=[os.getpid(), os.getppid()])
    r = run_code(code, ["assert FOUND"], config=cfg)
    assert r.error is None, (r.error, r.stderr[-800:])
    assert r.score == 0.0
    assert secret not in r.stdout and secret not in r.stderr
    assert "JAXRL_SANDBOX_TEST_SECRET" not in r.stdout
    _parent_still_works()


NETWORK = """
import socket, urllib.request
CONNECTED = False
attempts = {{
    "create_connection": lambda: socket.create_connection(("127.0.0.1", {port}), timeout=1),
    "raw": lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).connect(("127.0.0.1", {port})),
    "urllib": lambda: urllib.request.urlopen("http://127.0.0.1:{port}/", timeout=1),
    "udp": lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", {port})),
}}
for how, attempt in attempts.items():
    try:
        attempt()
        CONNECTED = True
        print("connected", how)
    except BaseException as e:
        print("blocked", how, type(e).__name__, e)
"""


@pytest.fixture
def listener():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.setblocking(False)
    yield srv
    srv.close()


def _connections(srv: socket.socket) -> int:
    n = 0
    while True:
        try:
            conn, _ = srv.accept()
        except BlockingIOError:
            return n
        conn.close()
        n += 1


def test_listener_detects_a_connection(listener):
    # control for test_network: the check below does see a real connection
    with socket.create_connection(listener.getsockname(), timeout=1):
        time.sleep(0.05)
    assert _connections(listener) == 1


def test_network(mode, listener):
    _, cfg = mode
    port = listener.getsockname()[1]
    r = run_code(NETWORK.format(port=port), ["assert CONNECTED"], config=cfg)
    assert r.error is None, (r.error, r.stderr[-800:])
    assert r.score == 0.0
    assert not re.search("^connected", r.stdout, re.M)
    assert len(re.findall("^blocked", r.stdout, re.M)) == 4
    time.sleep(0.05)
    assert _connections(listener) == 0
    _parent_still_works()


FORGERY = """
import builtins, os, re, sys
found = set()
f = sys._getframe()
while f is not None:
    for d in (f.f_locals, f.f_globals):
        for k, v in list(d.items()):
            if isinstance(v, str) and re.fullmatch(r"[0-9a-f]{{32}}", v):
                found.add(v)
            if k == "tests" and isinstance(v, list):
                v[:] = [compile("pass", "x", "exec")] * len(v)
        d["passed"] = 99
    f = f.f_back
sys.addaudithook(lambda *a: print("HOOKED", flush=True))  # silently refused
for attempt in (lambda: sys.audit("jaxrl_sandbox.report", 1, 1, ""),
                lambda: __import__("gc").get_objects(),
                lambda: sys.settrace(lambda *a: None)):
    try:
        attempt()
    except BaseException as e:
        print("blocked", type(e).__name__)
lines = [n + " 1 1 \\n" for n in found] + ["0123456789abcdef0123456789abcdef 1 1 \\n", "PASSED 1/1\\n"]
for fd in range(1, 64):
    for line in lines:
        try:
            os.write(fd, line.encode())
        except OSError:
            pass
print("FOUND", len(found), flush=True)
builtins.exec = lambda *a, **k: None
builtins.compile = lambda *a, **k: None
{ending}
"""


@pytest.mark.parametrize("ending", ["os._exit(0)", "sys.exit(0)", "pass"])
def test_forged_reports_score_zero(ending):
    r = run_code(FORGERY.format(ending=ending), ["assert False"], config=FAST)
    assert r.score == 0.0 and r.passed == 0
    assert "FOUND 0" in r.stdout  # the nonce was not reachable from the code's frames
    assert len(re.findall("^blocked", r.stdout, re.M)) == 2  # gc, settrace (sys.audit is merely ignored)
    assert "HOOKED" not in r.stdout


def test_monkeypatching_builtins_does_not_skip_tests():
    code = "import builtins\nbuiltins.exec = lambda *a, **k: None\nbuiltins.compile = lambda *a, **k: None\n"
    r = run_code(code, ["assert False", "assert 1 == 2"])
    assert (r.passed, r.score) == (0, 0.0)


def test_library_code_still_works_under_the_audit_hook():
    code = (
        "import collections, dataclasses, enum, logging, typing, json, re, tempfile, threading, asyncio\n"
        "P = collections.namedtuple('P', 'x y')\n"
        "class E(enum.Enum):\n    A = 1\n"
        "logging.getLogger('t').warning('log ok')\n"
        "with tempfile.TemporaryDirectory() as d:\n"
        "    open(d + '/f', 'w').write('x')\n"
        "t = threading.Thread(target=lambda: None); t.start(); t.join()\n"
        "async def main():\n    return 3\n"
        "RESULT = asyncio.run(main())\n"
    )
    r = run_code(code, ["assert RESULT == 3 and P(1, 2).y == 2 and E.A.value == 1"])
    assert r.error is None and r.score == 1.0, r.stderr


def test_code_patching_the_harness_module_does_not_change_the_score():
    # the harness is `__main__` in the sandbox: its functions' code and its globals are within
    # reach, so after the code has started it must not depend on any of them for the score
    code = """
import sys
main = sys.modules["__main__"]
def fake(*args, **kwargs):
    return ""
swapped = []
for name, obj in list(vars(main).items()):
    if hasattr(obj, "__code__"):
        obj.__code__ = fake.__code__
        swapped.append(name)
    elif not name.startswith("__"):
        setattr(main, name, fake)
SWAPPED = {"_describe", "_make_reporter", "_main"} <= set(swapped)
"""
    r = run_code(code, ["assert SWAPPED", "assert False", "assert False"])
    assert (r.passed, r.total, r.error) == (1, 3, None), (r.error, r.stderr)


# --------------------------------------------------------------------------------------
# the harness script, run by its path outside the sandbox layers (no namespace, no uid
# change: trusted code only); its helpers are tested in test_sandbox_child.py
# --------------------------------------------------------------------------------------

NONCE = "0123456789abcdef" * 2


def _run_child(payload: dict, python: str = sys.executable) -> tuple[subprocess.CompletedProcess, bytes]:
    payload_fd = sb._anonymous_file(json.dumps(payload).encode("utf-8"))
    report_r, report_w = os.pipe()
    try:
        proc = subprocess.run(
            [python, "-I", "-B", sb._CHILD_SCRIPT, str(payload_fd), str(report_w)],
            pass_fds=(payload_fd, report_w), cwd="/", env={}, stdin=subprocess.DEVNULL,
            capture_output=True, timeout=60, check=False,
        )
        os.close(report_w)
        report_w = -1
        with os.fdopen(report_r, "rb", closefd=False) as f:
            report = f.read()
    finally:
        os.close(payload_fd)
        os.close(report_r)
        if report_w >= 0:
            os.close(report_w)
    return proc, report


def _payload(workdir: Path, code: str, tests: list[str], hook: bool) -> dict:
    return {
        "nonce": NONCE, "code": code, "tests": tests, "workdir": str(workdir), "mount": False,
        "drop": None, "drop_caps": False, "linux": LINUX, "hook": hook, "disk_mb": 1,
        "limits": [["RLIMIT_CORE", 0], ["RLIMIT_NOFILE", sb._NOFILE], ["RLIMIT_NOT_HERE", 1]],
        "module_name": "solution" if tests else "__main__",
    }


@pytest.mark.parametrize("hook", [True, False])
def test_harness_script_grades_a_tiny_program(tmp_path, hook):
    code = (
        "import os, resource, sys\n"
        "def add(a, b):\n    return a + b\n"
        "print('cwd', os.path.basename(os.getcwd()))\n"
        "print('limits', resource.getrlimit(resource.RLIMIT_NOFILE), __name__, sys.argv)\n"
    )
    tests = ["assert add(1, 2) == 3", "assert add(1, 1) == 3", "assert (", "print('test', __name__)"]
    proc, report = _run_child(_payload(tmp_path, code, tests, hook))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode() == (
        f"cwd {tmp_path.name}\nlimits ({sb._NOFILE}, {sb._NOFILE}) solution ['<solution>']\ntest solution\n"
    )
    compile_error, failure = proc.stderr.decode().splitlines()
    assert compile_error.startswith("[sandbox] test 2 does not compile: SyntaxError: ")
    assert failure == "[sandbox] test 1 failed: AssertionError: "
    assert report == (NONCE + " 2 4 \n").encode()
    assert sb._parse_report(report, NONCE, 4) == (2, "")


@pytest.mark.parametrize("hook", [True, False])
def test_harness_script_reports_code_that_raises(tmp_path, hook):
    code = "def f():\n    raise ValueError('multi\\nline')\nf()\n"
    proc, report = _run_child(_payload(tmp_path, code, ["assert True"], hook))
    assert proc.returncode == 0
    assert report == (NONCE + " 0 1 ValueError: multi line\n").encode()
    assert sb._parse_report(report, NONCE, 1) == (0, "the code raised ValueError: multi line")
    # the traceback starts at the code's frames: none of the harness's
    stderr = proc.stderr.decode()
    assert stderr.startswith('Traceback (most recent call last):\n  File "<solution>", line 3, in <module>\n')
    assert '  File "<solution>", line 2, in f\n' in stderr and stderr.endswith("\nValueError: multi\nline\n")
    assert "_main" not in stderr and "_sandbox_child" not in stderr
    proc, report = _run_child(_payload(tmp_path, "def f(:\n", [], hook))
    assert report.startswith((NONCE + " 0 0 SyntaxError: ").encode()) and report.endswith(b"(<solution>, line 1)\n")
    assert proc.stderr.decode().startswith('  File "<solution>", line 1\n    def f(:\n')


def test_harness_script_reports_a_failed_setup(tmp_path):
    missing = tmp_path / "missing"
    proc, report = _run_child(_payload(missing, "print('never')", ["assert True"], True))
    assert proc.returncode == 70 and proc.stdout == b""
    passed, error = sb._parse_report(report, NONCE, 1)
    assert passed == 0 and error.startswith("sandbox setup failed: FileNotFoundError: ")
    assert str(missing) in error


def _interpreter(minor: int) -> str | None:
    """A working python3.<minor> (on PATH or under pyenv), else None."""
    cands = [shutil.which(f"python3.{minor}")]
    cands += sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/3.{minor}.*/bin/python3.{minor}")))
    for cand in cands:
        if not cand:
            continue
        try:
            out = subprocess.run([cand, "-I", "-c", "import sys; print(sys.version_info[:2])"],
                                 capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode == 0 and out.stdout.strip() == f"(3, {minor})".encode():
            return cand
    return None


@pytest.mark.parametrize("minor", [8, 9, 10])
def test_harness_script_runs_on_older_interpreters(tmp_path, minor):
    # SandboxConfig.python may name another interpreter: the harness keeps to Python 3.8
    python = _interpreter(minor)
    if python is None:
        pytest.skip(f"no python3.{minor} here")
    code = "def add(a, b):\n    return a + b\nadd(1, None)\n"
    proc, report = _run_child(_payload(tmp_path, code, ["assert True"], True), python=python)
    assert proc.returncode == 0, proc.stderr
    assert report.startswith((NONCE + " 0 1 TypeError: unsupported operand").encode())
    stderr = proc.stderr.decode()  # the traceback is printed before 3.10 too
    assert stderr.startswith("Traceback (most recent call last):\n  File \"<solution>\", line 3, in <module>\n")
    assert stderr.rstrip().splitlines()[-1].startswith("TypeError: unsupported operand")
    proc, report = _run_child(_payload(tmp_path, "def add(a, b):\n    return a + b\n", ["assert add(1, 2) == 3"], False),
                              python=python)
    assert (proc.returncode, report) == (0, (NONCE + " 1 1 \n").encode())
