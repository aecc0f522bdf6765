"""grain pipelines: streaming sources, exact resumption, sharding, errors with file and line."""

import dataclasses
import json
import tracemalloc

import numpy as np
import pytest

from jaxrl_llm.data import (ArrowSource, DataError, JsonlSource, ListSource, ParquetSource, PreferenceDataConfig,
                            PromptDataConfig, SFTDataConfig, load_gsm8k, open_source, preference_dataset,
                            prompt_dataset, repeat_columns, sft_dataset)
from jaxrl_llm.rewards import math_reward

ONE_HOST = dict(process_index=0, process_count=1)


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


@pytest.fixture(scope="module")
def big_jsonl(tmp_path_factory):
    """100k rows (~32 MB)."""
    path = tmp_path_factory.mktemp("big") / "big.jsonl"
    with open(path, "w") as f:
        for i in range(100_000):
            f.write(json.dumps({"prompt": f"Problem {i}: what is {i} + {i % 7}? " + "pad " * (20 + i % 80),
                                "answer": str(i + i % 7), "id": i}) + "\n")
    return path


def test_100k_jsonl_streams_without_loading_it(big_jsonl):
    size = big_jsonl.stat().st_size
    tracemalloc.start()
    src = JsonlSource(big_jsonl)
    it = prompt_dataset(src, tok := _CharTok(), PromptDataConfig(batch_size=64, chat=False, seed=1), **ONE_HOST)
    for _ in range(20):
        next(it)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(src) == 100_000
    assert peak < size / 4, f"peak {peak / 1e6:.1f} MB for a {size / 1e6:.1f} MB file"
    del tok


@pytest.mark.parametrize("threads", [0, 4])
def test_resumes_at_the_exact_next_element(big_jsonl, threads):
    cfg = PromptDataConfig(batch_size=16, chat=False, seed=7, max_prompt_tokens=90, prefetch_threads=threads)
    it = prompt_dataset(JsonlSource(big_jsonl), _CharTok(), cfg, **ONE_HOST)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(it.get_state()))  # JSON-able, as a checkpoint stores it
    want = [next(it).columns["id"] for _ in range(3)]
    again = prompt_dataset(JsonlSource(big_jsonl), _CharTok(), cfg, **ONE_HOST)
    again.set_state(state)
    got = [next(again).columns["id"] for _ in range(3)]
    assert got == want
    assert again.stats == it.stats and it.stats["filtered_too_long"] > 0
    # a fresh iterator with the same seed replays the same order; another seed does not
    fresh = prompt_dataset(JsonlSource(big_jsonl), _CharTok(), cfg, **ONE_HOST)
    first = next(fresh).columns["id"]
    other = prompt_dataset(JsonlSource(big_jsonl), _CharTok(), dataclasses.replace(cfg, seed=8), **ONE_HOST)
    assert next(other).columns["id"] != first


class _CharTok:
    """A stand-in tokenizer for speed on 100k rows: one id per word."""

    pad_token_id = 0
    eos_token_id = 1

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [hash(w) % 1000 + 2 for w in text.split()]}


def test_epochs_reshuffle_and_cover_everything():
    rows = [{"prompt": f"p{i}", "id": i} for i in range(10)]
    it = prompt_dataset(ListSource(rows), _CharTok(), PromptDataConfig(batch_size=5, chat=False, num_epochs=2),
                        **ONE_HOST)
    epochs = [sum((next(it).columns["id"] for _ in range(2)), []) for _ in range(2)]
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(10))
    assert epochs[0] != epochs[1]
    with pytest.raises(StopIteration):
        next(it)


def test_hosts_get_disjoint_shares_of_each_global_batch():
    rows = [{"prompt": f"p{i}", "id": i} for i in range(64)]
    cfg = PromptDataConfig(batch_size=8, chat=False, seed=3)
    one = prompt_dataset(ListSource(rows), _CharTok(), cfg, **ONE_HOST)
    hosts = [prompt_dataset(ListSource(rows), _CharTok(), cfg, process_index=i, process_count=2) for i in range(2)]
    for _ in range(4):
        full = next(one).columns["id"]
        parts = [next(h).columns["id"] for h in hosts]
        assert all(len(p) == 4 for p in parts)
        assert not set(parts[0]) & set(parts[1])
        assert sorted(parts[0] + parts[1]) == sorted(full)
    with pytest.raises(ValueError, match="divisible by the number of hosts"):
        prompt_dataset(ListSource(rows), _CharTok(), PromptDataConfig(batch_size=3), process_index=0, process_count=2)


def test_malformed_rows_name_file_and_line_or_are_skipped(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "answer": "1"}, "", "{not json",
                                               {"question": "no prompt"}, {"prompt": "b", "answer": "2"}, "[1, 2]",
                                               {"prompt": "c"}, {"prompt": "d", "answer": "4"}])
    with pytest.raises(DataError, match=r"d\.jsonl:3: invalid JSON"):
        for _ in prompt_dataset(JsonlSource(path), _CharTok(), PromptDataConfig(batch_size=1, shuffle=False,
                                                                                chat=False), **ONE_HOST):
            pass
    src = JsonlSource(path, on_error="skip")
    assert len(src) == 7  # the blank line is not a record
    it = prompt_dataset(src, _CharTok(), PromptDataConfig(batch_size=1, shuffle=False, chat=False, num_epochs=1,
                                                          on_error="skip", required=("answer",)), **ONE_HOST)
    got = [b.raw_prompts[0] for b in it]
    assert got == ["a", "b", "d"]
    assert it.stats["skipped_malformed"] == 4 and it.stats["examples"] == 3
    reasons = "\n".join(it.stats["skip_examples"])
    assert "d.jsonl:3: invalid JSON" in reasons
    assert "d.jsonl:4: missing field 'prompt' (the row has ['question'])" in reasons
    assert "d.jsonl:6: invalid JSON (expected a JSON object" in reasons or "d.jsonl:6: invalid JSON" in reasons
    assert "d.jsonl:7: missing field 'answer'" in reasons
    with pytest.raises(DataError, match=r"d\.jsonl:4: missing field 'prompt'"):
        list(prompt_dataset(JsonlSource(path, on_error="skip"), _CharTok(),
                            PromptDataConfig(batch_size=1, shuffle=False, chat=False, num_epochs=1,
                                             required=("answer",)), **ONE_HOST))


def test_length_filter_is_counted_and_chat_template_applied(tmp_path, smollm2_tokenizer):
    tok = smollm2_tokenizer
    rows = [{"prompt": "What is 2+3?", "answer": "5"}, {"prompt": "word " * 300, "answer": "x"},
            {"prompt": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}],
             "answer": "hi"}]
    it = prompt_dataset(ListSource(rows), tok, PromptDataConfig(batch_size=2, shuffle=False, max_prompt_tokens=100,
                                                                num_epochs=1), **ONE_HOST)
    b = next(it)
    assert it.stats["filtered_too_long"] == 1 and "rows:1: prompt has" in it.stats["skip_examples"][0]
    want = tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], tokenize=True,
                                   add_generation_prompt=True)
    want = want["input_ids"] if hasattr(want, "keys") else list(want)
    assert b.prompt_ids[0] == list(want)
    assert b.prompts[1].endswith("<|im_start|>assistant\n") and "Be terse." in b.prompts[1]
    assert b.columns == {"answer": ["5", "hi"]}
    assert repeat_columns(b.columns, 2) == {"answer": ["5", "5", "hi", "hi"]}


def test_parquet_and_saved_hf_dataset(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt": f"p{i}", "answer": str(i)} for i in range(25)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet", row_group_size=7)
    src = open_source(tmp_path / "train.parquet")
    assert isinstance(src, ParquetSource) and len(src) == 25
    assert src[15]["prompt"] == "p15" and "row group 2, row 1" in src[15]["__where__"]

    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(rows),
                               "test": datasets.Dataset.from_list(rows[:5])})
    dd.save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(ValueError, match="DatasetDict with splits"):
        open_source(tmp_path / "saved")
    src = open_source(tmp_path / "saved", split="train")
    assert isinstance(src, ArrowSource) and len(src) == 25 and src[24]["answer"] == "24"
    it = prompt_dataset(src, _CharTok(), PromptDataConfig(batch_size=5, chat=False, num_epochs=1), **ONE_HOST)
    assert sorted(sum((b.columns["answer"] for b in it), [])) == sorted(r["answer"] for r in rows)
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="unknown data format '.csv'"):
        open_source(tmp_path / "x.csv")


GSM8K_ROWS = [
    {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                 "How many clips did Natalia sell altogether in April and May?",
     "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
               "altogether in April and May.\n#### 72"},
    {"question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
                 "How much did she earn?",
     "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = "
               "$<<0.2*50=10>>10.\n#### 10"},
    {"question": "A big number?", "answer": "It is large.\n#### 1,250,000"},
]


def test_gsm8k_loader_on_a_fixture_file(tmp_path):
    (tmp_path / "main").mkdir()
    write_jsonl(tmp_path / "main" / "train.jsonl", GSM8K_ROWS)
    src = load_gsm8k(tmp_path / "main" / "train.jsonl")
    assert [src[i]["answer"] for i in range(3)] == ["72", "10", "1250000"]
    assert src[0]["prompt"].startswith("Natalia") and src[0]["prompt"].endswith("\\boxed{}.")
    sol = [src[i]["solution"] for i in range(3)]
    assert math_reward([""] * 3, sol, answer=[src[i]["answer"] for i in range(3)]) == [1.0, 1.0, 1.0]
    assert load_gsm8k(tmp_path, split="train")[1]["answer"] == "10"  # a folder with split files
    write_jsonl(tmp_path / "bad.jsonl", GSM8K_ROWS[:1] + [{"question": "q", "answer": "no final"}])
    with pytest.raises(DataError, match=r"bad\.jsonl:2: GSM8K answer has no '####'"):
        load_gsm8k(tmp_path / "bad.jsonl")[1]
    assert load_gsm8k(tmp_path / "bad.jsonl", on_error="skip")[1].reason.startswith(str(tmp_path / "bad.jsonl:2"))


def test_preference_batches(smollm2_tokenizer):
    tok = smollm2_tokenizer
    rows = [{"prompt": "2+2?", "chosen": "4", "rejected": "5, I think"},
            {"prompt": [{"role": "user", "content": "Hi"}], "chosen": [{"role": "assistant", "content": "Hello!"}],
             "rejected": [{"role": "assistant", "content": "Go away."}]}]
    it = preference_dataset(ListSource(rows), tok, PreferenceDataConfig(batch_size=2, shuffle=False), **ONE_HOST)
    b = next(it)
    assert b.tokens.shape[0] == 4 and b.num_pairs == 2 and b.tokens.shape[1] == 64
    end = tok.convert_tokens_to_ids("<|im_end|>")
    for row, text in [(0, "4"), (2, "5, I think"), (1, "Hello!"), (3, "Go away.")]:
        answer = b.tokens[row][b.loss_mask[row]].tolist()
        assert answer == tok(text, add_special_tokens=False)["input_ids"] + [end]
    # the chosen and rejected rows of a pair share the prompt
    p = (~b.loss_mask[0] & b.mask[0]).sum()
    assert (b.tokens[0, :p] == b.tokens[2, :p]).all()


def test_sft_messages_match_the_chat_template(smollm2_tokenizer):
    tok = smollm2_tokenizer
    msgs = [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "5"},
            {"role": "user", "content": "And 2+4?"}, {"role": "assistant", "content": "6"}]
    it = sft_dataset(ListSource([{"messages": msgs}]), tok, SFTDataConfig(messages_field="messages", batch_size=1),
                     **ONE_HOST)
    b = next(it)
    full = tok(tok.apply_chat_template(msgs, tokenize=False), add_special_tokens=False)["input_ids"]
    n = int(b.mask[0].sum())
    assert b.tokens[0, :n].tolist() == full
    trained = tok.decode(b.tokens[0][b.loss_mask[0]])
    assert trained == "5<|im_end|>6<|im_end|>"
    it = sft_dataset(ListSource([{"prompt": "Q", "completion": "A"}]), tok, SFTDataConfig(batch_size=1), **ONE_HOST)
    b = next(it)
    assert tok.decode(b.tokens[0][b.loss_mask[0]]) == "A<|im_end|>"
    with pytest.raises(DataError, match="rows:0: field 'messages' has no assistant message"):
        next(sft_dataset(ListSource([{"messages": msgs[:1]}]), tok,
                         SFTDataConfig(messages_field="messages", batch_size=1), **ONE_HOST))


def test_config_errors(tmp_path):
    with pytest.raises(ValueError, match="batch_size"):
        PromptDataConfig(batch_size=0)
    with pytest.raises(ValueError, match="on_error"):
        PromptDataConfig(on_error="ignore")
    with pytest.raises(ValueError, match="SFTDataConfig.max_length must be >= 1"):
        SFTDataConfig(max_length=0)
    with pytest.raises(ValueError, match="PreferenceDataConfig.num_epochs"):
        PreferenceDataConfig(num_epochs=0)
    with pytest.raises(FileNotFoundError, match="no such data file"):
        JsonlSource("/nonexistent/x.jsonl")
    src = JsonlSource(write_jsonl(tmp_path / "two.jsonl", [{"a": 1}, {"a": 2}]))
    with pytest.raises(IndexError, match="record 5 out of range for 2"):
        src[5]


def test_char_tokenizer_round_trip():
    from jaxrl_llm.data.char_tokenizer import char_tokenizer

    tok = char_tokenizer()
    s = "What is 35 + 6?\n<answer>41</answer>"
    ids = tok(s)["input_ids"]
    assert len(ids) == len(s) and tok.decode(ids) == s
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == s
    assert tok("é")["input_ids"] == [tok.unk_token_id] and len(tok) == 95
