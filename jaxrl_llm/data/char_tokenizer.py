"""A character-level tokenizer for tiny models (built in code, nothing to download).

A ``transformers.PreTrainedTokenizerFast`` over a fixed alphabet: one token per character,
plus ``<pad>`` (0), ``<eos>`` (1), ``<bos>`` (2), ``<unk>`` (3). With a vocabulary of ~100
instead of tens of thousands, a few-layer model trains in seconds on a CPU: the tiny preset
and the notebooks use it with the built-in tasks.
"""

from __future__ import annotations

import string

__all__ = ["char_tokenizer", "DEFAULT_ALPHABET"]

DEFAULT_ALPHABET = string.digits + string.ascii_letters + " .,:;!?+-*/=()<>[]{}'\"#%&_\\|\n"


def char_tokenizer(alphabet: str = DEFAULT_ALPHABET):
    """The tokenizer (``vocab_size = len(set(alphabet)) + 4``); unknown characters map to
    ``<unk>``; ``decode`` joins characters back without spaces."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    chars = list(dict.fromkeys(alphabet))
    if any(len(c) != 1 for c in chars):
        raise ValueError("alphabet must be a string of single characters")
    vocab = {t: i for i, t in enumerate(specials + chars)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                                   unk_token="<unk>")
