"""Orbax checkpoints: bitwise round trip, retention, atomicity under SIGKILL, SIGTERM guard."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxrl_llm.models import ModelConfig, Transformer
from jaxrl_llm.training import init_train_state
from jaxrl_llm.training.checkpoint import Checkpointer, PreemptionGuard, UnreadableCheckpoint

CFG = ModelConfig(vocab_size=31, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=8,
                  intermediate_size=24)


def make_state(seed=0, dtype="float32"):
    _, params = nnx.split(Transformer(CFG.replace(param_dtype=dtype), rngs=nnx.Rngs(seed)))
    opt = optax.adam(1e-3)
    state = init_train_state(params, opt, seed=seed)
    grads = jax.tree.map(lambda p: jnp.ones_like(p) * 0.5, params)  # non-trivial optimiser moments
    updates, opt_state = opt.update(grads, state.opt_state, params)
    return state._replace(params=optax.apply_updates(params, updates), opt_state=opt_state,
                          step=jnp.int32(7), skipped=jnp.int32(2))


def leaves_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y))
                                      for x, y in zip(la, lb))


def test_round_trip_is_bitwise_with_the_run_record(tmp_path):
    state = make_state(1, "bfloat16")
    with Checkpointer(tmp_path / "ckpt") as ck:
        ck.save(7, state, data_state={"grain": {"next_index": 42}, "stats": {"examples": 40}},
                loop={"key": np.array([1, 2], np.uint32), "epoch": 3}, config={"lr": 1e-3, "name": "x"},
                history=[{"step": 1, "reward": 0.5}])
    ck = Checkpointer(tmp_path / "ckpt")
    assert ck.latest_step() == 7
    restored, record = ck.restore(make_state(0, "bfloat16"))  # template values differ: restored wins
    assert leaves_equal(restored, state)
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    assert record["data_state"] == {"grain": {"next_index": 42}, "stats": {"examples": 40}}
    assert record["loop"] == {"key": [1, 2], "epoch": 3} and record["history"][0]["reward"] == 0.5
    assert record["config"] == {"lr": 1e-3, "name": "x"}
    ck.close()


def test_keep_last_and_keep_best(tmp_path):
    state = make_state()
    with Checkpointer(tmp_path / "c", keep_last=2, keep_best=1, best_metric="acc") as ck:
        for step, acc in zip([1, 2, 3, 4, 5], [0.1, 0.9, 0.3, 0.2, 0.4]):
            ck.save(step, state, metrics={"acc": acc})
            ck.wait()
        assert sorted(ck.all_steps()) == [2, 4, 5]
    with pytest.raises(ValueError, match="keep_best needs best_metric"):
        Checkpointer(tmp_path / "d", keep_best=1)
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        Checkpointer(tmp_path / "empty").restore(state)


def test_sigkill_during_a_save_leaves_the_previous_checkpoint_usable(tmp_path):
    """A child saves step 1, then starts saving a large step 2 and is SIGKILLed mid-write."""
    d = tmp_path / "ck"
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        import jax.numpy as jnp, numpy as np
        from jaxrl_llm.training.checkpoint import Checkpointer
        ck = Checkpointer({str(d)!r})
        ck.save(1, {{"w": jnp.arange(1000, dtype=jnp.float32)}})
        ck.wait()
        big = {{"w": jnp.asarray(np.random.default_rng(0).normal(size=(64, 1024, 1024)).astype(np.float32))}}
        ck.save(2, big)  # asynchronous: 256 MB being written
        time.sleep(0.3)
        print("killing", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    assert "killing" in p.stdout
    ck = Checkpointer(d)
    assert ck.latest_step() == 1
    restored, _ = ck.restore({"w": jnp.zeros(1000, jnp.float32)})
    assert np.array_equal(np.asarray(restored["w"]), np.arange(1000, dtype=np.float32))
    # and the run can go on saving
    ck.save(2, {"w": jnp.ones(1000, jnp.float32)})
    ck.wait()
    assert ck.latest_step() == 2
    ck.close()


def _largest_array_file(step_dir):
    files = [f for f in (step_dir / "state").rglob("*") if f.is_file() and "ocdbt.process" in str(f)
             and f.parent.name == "d"]
    return max(files, key=lambda f: f.stat().st_size)


def _truncate(step_dir):
    f = _largest_array_file(step_dir)
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


DAMAGE = {
    "truncated array file": _truncate,
    "missing array file": lambda d: _largest_array_file(d).unlink(),
    "missing metadata": lambda d: (d / "state" / "_METADATA").unlink(),
    "unparsable record": lambda d: (d / "record" / "metadata").write_text('{"data_state": '),
    "deleted item directory": lambda d: shutil.rmtree(d / "state"),
    "deleted step directory": lambda d: shutil.rmtree(d),
}


def _save_steps(d, steps):
    states = {}
    with Checkpointer(d, keep_last=5) as ck:
        for s in steps:
            states[s] = make_state(s)
            ck.save(s, states[s], data_state={"next": s}, loop={"iteration": s}, history=[{"step": s}])
            ck.wait()
    return states


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_newest_checkpoint_falls_back_to_the_newest_readable_one(tmp_path, damage, caplog):
    d = tmp_path / "ck"
    states = _save_steps(d, [2, 4])
    ck = Checkpointer(d)  # lists steps 2 and 4, then step 4 is damaged
    DAMAGE[damage](d / "4")
    with caplog.at_level("WARNING", logger="jaxrl_llm"):
        restored, record = ck.restore(make_state(0))
    # step 2 whole: its arrays and its record together
    assert leaves_equal(restored, states[2])
    assert record["data_state"] == {"next": 2} and record["loop"]["iteration"] == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert warnings[0].startswith(f"checkpoint step 4 in {d} is unreadable: ")
    assert warnings[0].endswith("; resuming from step 2")
    if damage == "deleted step directory":
        assert "its directory is gone" in warnings[0] and not (d / "4.unreadable").exists()
    else:  # kept for inspection, out of the next save's way
        assert f"moved to {d / '4.unreadable'}" in warnings[0] and (d / "4.unreadable").is_dir()
    # the run goes on: step 4 is saved again and is the newest
    ck.save(4, states[4], data_state={"next": 4})
    ck.wait()
    assert ck.latest_step() == 4 and leaves_equal(ck.restore(make_state(0))[0], states[4])
    ck.close()


def test_no_readable_checkpoint_is_one_line_and_moves_nothing(tmp_path):
    d = tmp_path / "ck"
    _save_steps(d, [2, 4])
    _truncate(d / "4")
    (d / "2" / "state" / "_METADATA").unlink()
    ck = Checkpointer(d)
    with pytest.raises(UnreadableCheckpoint) as e:
        ck.restore(make_state(0))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"no checkpoint in {d} could be read (all left in place): step 4: ")
    assert "; step 2: " in msg
    assert (d / "4").is_dir() and (d / "2").is_dir() and not list(d.glob("*.unreadable"))
    # an explicit step is read or refused, never replaced by another
    with pytest.raises(UnreadableCheckpoint, match="checkpoint step 5 .* is missing"):
        ck.restore(make_state(0), step=5)
    ck.close()


def test_a_template_that_does_not_fit_fails_every_step_and_moves_nothing(tmp_path):
    """Another model or recipe (a config mistake) is not damage: every step fails alike, the
    error names the cause, the checkpoints stay where they are."""
    d = tmp_path / "ck"
    _save_steps(d, [2, 4])
    other = make_state(0)._replace(step=jnp.zeros(3, jnp.int32))  # a leaf of another shape
    ck = Checkpointer(d)
    with pytest.raises(UnreadableCheckpoint, match=r"could be read \(all left in place\): step 4: .*; step 2: "):
        ck.restore(other)
    assert sorted(ck.all_steps()) == [2, 4] and not list(d.glob("*.unreadable"))
    ck.close()


def test_a_step_the_trainer_rejects_falls_back_and_the_older_step_is_applied_whole(tmp_path, caplog):
    d = tmp_path / "ck"
    states = _save_steps(d, [2, 4])
    applied = {}

    def apply(state, record):
        applied.update(state=state, iteration=record["loop"]["iteration"])  # set, then rejected below
        if record["loop"]["iteration"] == 4:
            raise ValueError("this record does not fit the trainer")

    ck = Checkpointer(d)
    with caplog.at_level("WARNING", logger="jaxrl_llm"):
        ck.restore(make_state(0), apply=apply)
    assert applied["iteration"] == 2 and leaves_equal(applied["state"], states[2])
    assert "ValueError: this record does not fit the trainer" in caplog.records[-1].getMessage()
    ck.close()


def test_preemption_guard_turns_sigterm_into_a_flag():
    with PreemptionGuard() as guard:
        assert not guard.should_stop()
        os.kill(os.getpid(), signal.SIGTERM)
        assert guard.requested and guard.should_stop()
    assert signal.getsignal(signal.SIGTERM) is not guard._handler
