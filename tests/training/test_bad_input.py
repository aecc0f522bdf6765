"""Bad configs, tried as a new user would: ``jaxrl-llm train`` prints one line that names the key,
the value and the fix, and exits with code 2 (no traceback)."""

import pytest

from jaxrl_llm import cli

TINY = ["sft.steps=0", "run.steps=1", "run.eval_every=0", "run.plot=false", "run.export_hf=false",
        "run.tensorboard=false", "run.progress=false", "data.train_rows=64", "data.eval_rows=8"]


def train(overrides, capsys, tmp_path):
    code = cli.main(["train", "tiny_grpo", f"run.out={tmp_path / 'out'}", *TINY, *overrides])
    err = capsys.readouterr().err.strip().splitlines()
    return code, [line for line in err if not line.startswith("jaxrl-llm: tiny_grpo (")]


CASES = [
    (["rollout.num_samples=0"], "rollout.num_samples must be an int >= 1, got 0"),
    (["rollout.temperature=0"], "rollout.temperature must be > 0, got 0.0"),
    (["data.dataset=/tmp/x.jsonl"], "data.eval_dataset is required with data.dataset='/tmp/x.jsonl'"),
    (["model.source=/no/such/dir"], "model.source='/no/such/dir': no such file or directory"),
    (["rollout.num_samples=1"], "recipe.advantage=grpo compares the samples of one prompt with each other: "
                                "rollout.num_samples must be >= 2, got 1"),
    (["recipe.advantage=gpro"], "recipe.advantage: unknown advantage estimator 'gpro'; valid: .*did you mean .*'grpo'"),
    (["recipe.loss.clip_lo=0.1"], "recipe.loss=ppo: unknown argument 'clip_lo'.*did you mean 'clip_low'"),
    (["recipe.kl.coef=-1"], "recipe.kl.coef must be >= 0, got -1.0"),
    (["recipe.kl.placement=reward", "recipe.kl.coef=0.1"], "recipe.kl.placement=reward subtracts the KL from token "
                                                           "rewards, but recipe.advantage=grpo reads sequence scores"),
    (["recipe.is_weights=tis"], "recipe.is_weights / recipe.rejection compare .* set recipe.old_logp=recompute"),
    (["recipe.loss=dro"], "recipe.loss=dro: argument 'beta' has no default and must be set \\(recipe.loss.beta=...\\)"),
    (["recipe.name=grpo2"], "recipe.name: unknown recipe 'grpo2'.*did you mean 'grpo'"),
    # long sequences: lengths, packing, the context axis, an attention the backend lacks
    (["rollout.max_new_tokens=100000"], "rows of up to 100032 tokens .* exceed the model's max_position_embeddings="
                                        "512: lower rollout.max_new_tokens"),
    (["train.max_tokens_per_microbatch=16"], "train.max_tokens_per_microbatch=16 is smaller than one row: the longest "
                                             "row has 38 tokens"),
    (["mesh.context=3"], r"mesh.context=3 must divide every row length: prompt bucket 32 \+ rollout.max_new_tokens=6"),
    (["model.attention=splash"], r"model.attention=splash runs on TPU only \(this backend: cpu\)"),
    (["model.attention=cudnn"], r"model.attention=cudnn runs on GPU only \(this backend: cpu\)"),
    (["model.attention=flash"], "model.attention must be one of"),
    (["train.max_tokens_per_microbatch=64", "optim.num_microbatches=2"],
     r"optim.num_microbatches=2 and train.max_tokens_per_microbatch \(packing\) both set the micro-batches"),
    (["train.max_tokens_per_microbatch=64", "train.shared_prefix=true"],
     r"train.shared_prefix=true and train.max_tokens_per_microbatch \(packing\) cannot be combined"),
]


@pytest.mark.parametrize("overrides,message", CASES, ids=[c[0][0] for c in CASES])
def test_config_mistakes_are_one_line_with_exit_code_2(overrides, message, capsys, tmp_path):
    import re

    code, err = train(overrides, capsys, tmp_path)
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("jaxrl-llm: error: "), err
    assert re.search(message, err[0]), err[0]


def test_empty_data_file_and_prompt_longer_than_the_buckets(capsys, tmp_path):
    empty, one = tmp_path / "empty.jsonl", tmp_path / "one.jsonl"
    empty.write_text("")
    one.write_text('{"question": "What is 1 + 1?", "answer": "#### 2"}\n')
    code, err = train([f"data.dataset={empty}", f"data.eval_dataset={one}"], capsys, tmp_path)
    assert code == 2 and err == [f"jaxrl-llm: error: data.dataset='{empty}' has no rows"], err
    code, err = train(["rollout.prompt_buckets=[4]"], capsys, tmp_path)
    assert code == 2 and len(err) == 1, err
    assert "longer than the largest of rollout.prompt_buckets=[4]: add a larger bucket (rollout.prompt_buckets=[4, " \
           in err[0] and "data.max_prompt_tokens=4" in err[0], err[0]


def test_an_error_inside_the_experiment_still_has_its_traceback(capsys, tmp_path, monkeypatch):
    """Only config mistakes are one line: a bug raised while training is re-raised as is."""
    import jaxrl_llm.training.runner as runner

    def boom(cfg):
        raise RuntimeError("a bug")
    monkeypatch.setattr(runner, "_run_rl", boom)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["train", "tiny_grpo", f"run.out={tmp_path}", *TINY])
