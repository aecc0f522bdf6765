"""load_config reads a complete Llama / Qwen2 / Qwen3 config.json without transformers (a launch then
imports neither it nor torch) and gives the same ModelConfig as transformers' AutoConfig; every
other file (Mistral, GPT-2, Gemma, scaled rope, sliding windows, keys left to a class default)
still goes through AutoConfig."""

import json
import subprocess
import sys

import pytest

from jaxrl_llm.models import PRESETS
from jaxrl_llm.models.config import _plain_config, from_hf_config, load_config, to_hf_config


def via_auto(path):
    from transformers import AutoConfig

    return from_hf_config(AutoConfig.from_pretrained(str(path), local_files_only=True))


def saved(tmp_path, name, architecture="causal_lm", edit=None):
    d = tmp_path / name
    to_hf_config(PRESETS[name], architecture).save_pretrained(str(d))
    if edit is not None:
        cfg = json.loads((d / "config.json").read_text())
        edit(cfg)
        (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_exported_reads_back_the_same_either_way(tmp_path, name):
    d = saved(tmp_path, name)
    plain = _plain_config(json.loads((d / "config.json").read_text())) is not None
    assert plain == (PRESETS[name].family in ("llama", "qwen2", "qwen3")
                     and not PRESETS[name].rope_scaling and not PRESETS[name].sliding_window)
    assert load_config(d) == via_auto(d)


def _drop(*keys):
    return lambda c: [c.pop(k, None) for k in keys]


@pytest.mark.parametrize("name,edit,plain", [
    ("qwen3-0.6b", _drop("head_dim"), False),                      # Qwen3's class default (128) decides
    ("qwen2.5-0.5b", _drop("rms_norm_eps"), False),                # a key left to the class default
    ("qwen2.5-0.5b", lambda c: c.update(use_sliding_window=True, max_window_layers=1, sliding_window=64,
                                        layer_types=None), False),  # transformers works out the layer types
    ("qwen2.5-0.5b", lambda c: c.update(rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                         "rope_theta": 1e6}), False),
    ("qwen2.5-0.5b", _drop("attention_bias", "mlp_bias", "pad_token_id"), True),
    ("qwen2.5-0.5b", lambda c: c.update(rope_parameters=None, rope_theta=5e5), True),  # the legacy layout
    ("smollm2-135m", _drop("rope_parameters"), False),
])
def test_edited_files_read_the_same_either_way(tmp_path, name, edit, plain):
    d = saved(tmp_path, name, edit=edit)
    assert (_plain_config(json.loads((d / "config.json").read_text())) is not None) == plain
    assert load_config(d) == via_auto(d)


def test_a_score_head_keeps_its_labels(tmp_path):
    d = saved(tmp_path, "qwen2.5-0.5b", "sequence_classification",
              edit=lambda c: c.update(id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0}))
    assert load_config(d).num_labels == via_auto(d).num_labels == 1
    d = saved(tmp_path, "llama3.2-1b")
    assert load_config(d).num_labels == via_auto(d).num_labels


def test_loading_a_complete_file_imports_neither_transformers_nor_torch(tmp_path):
    pytest.importorskip("torch")
    d = saved(tmp_path, "qwen2.5-0.5b")
    code = ("import sys; from jaxrl_llm.models.config import load_config; load_config(sys.argv[1]); "
            "print(sorted(m for m in ('torch', 'transformers.configuration_utils') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
