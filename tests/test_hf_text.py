"""A checkpoint's text: what `jaxformer generate --hf` prints with its own tokenizer (against transformers' decode),
and what its tokens mean (special token ids, chat template) read without its weights."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from hf_helpers import VOCAB, hf_model

from jaxformer.cli import main
from jaxformer.hf import read_token_metadata


def test_generate_prints_the_space_a_sentencepiece_decoder_strips_from_a_continuation_decoded_alone(tmp_path, capsys):
    """Llama-2-style tokenizers decode "▁w7" at the start of a text as "w7": the printed continuation of a prompt
    is the text the whole sequence decodes to, as transformers' decode of its generate output gives."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "▁Hello": 3, **{f"▁w{i}": i for i in range(4, VOCAB)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Strip(" ", 1, 0)])
    model = hf_model("llama")
    model.generation_config.eos_token_id = None
    model.save_pretrained(tmp_path / "src")
    tokenizer.save(str(tmp_path / "src" / "tokenizer.json"))
    ids = tokenizer.encode("Hello").ids
    with torch.no_grad():
        expected = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                  max_new_tokens=3, do_sample=False, pad_token_id=0)[0].tolist()
    assert main(["generate", "--hf", str(tmp_path / "src"), "--prompt", "Hello", "--max-new-tokens", "3",
                 "--temperature", "0"]) == 0
    printed = capsys.readouterr().out
    assert printed == tokenizer.decode(expected) + "\n"
    assert printed != "Hello" + tokenizer.decode(expected[len(ids):]) + "\n"  # the continuation decoded alone


def test_a_checkpoints_token_metadata_is_read_without_its_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "eos_token_id": 2}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    assert read_token_metadata(tmp_path) == ({"model_type": "llama", "eos_token_id": 2},
                                             {"chat_template": "{{ messages }}"})  # no weight file at all
