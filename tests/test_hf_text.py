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


def test_generate_stops_at_the_eos_tokens_of_the_generation_config_as_transformers_does(tmp_path, capsys):
    """Qwen2.5-style checkpoints list two EOS ids in generation_config.json and one in config.json; transformers'
    generate stops at either of the two. `jaxformer generate --hf` read config.json's alone and ran past the other."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "Hello": 1, **{f"w{i}": i for i in range(2, VOCAB)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    model = hf_model("qwen2")
    ids = tokenizer.encode("Hello w5 w9 w13").ids  # a prompt this model continues with varied tokens
    mask = torch.ones(1, len(ids), dtype=torch.long)
    with torch.no_grad():  # the greedy continuation; its stop: a token it makes first at the third step or later
        free = model.generate(torch.tensor([ids]), attention_mask=mask, max_new_tokens=8, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
    stop = next(k for k in range(2, 8) if free[k] not in free[:k])
    other = next(t for t in range(VOCAB) if t not in free)  # config.json's EOS, never generated
    model.config.eos_token_id = other
    model.generation_config.eos_token_id = [other, free[stop]]
    model.save_pretrained(tmp_path / "src")
    tokenizer.save(str(tmp_path / "src" / "tokenizer.json"))
    reloaded = type(model).from_pretrained(tmp_path / "src").eval()
    with torch.no_grad():  # transformers, with the saved files: stops at the generation config's second EOS
        theirs = reloaded.generate(torch.tensor([ids]), attention_mask=mask, max_new_tokens=8, do_sample=False,
                                   pad_token_id=0)[0, len(ids):].tolist()
    assert theirs == free[:stop + 1]
    assert main(["generate", "--hf", str(tmp_path / "src"), "--prompt", "Hello w5 w9 w13", "--max-new-tokens", "8",
                 "--temperature", "0"]) == 0
    assert capsys.readouterr().out == tokenizer.decode(ids + free[:stop]) + "\n"


def test_generate_prints_a_translation_models_answer_as_transformers_decodes_it(tmp_path, capsys):
    """An encoder–decoder (Marian) answers its prompt rather than continuing it: `jaxformer generate --hf` prints
    the decoded answer alone, the greedy tokens transformers' generate gives after the decoder's start token (this
    model's answer depends on its source, EOS included: another prompt, or none, gives another)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"</s>": 0, **{f"w{i}": i for i in range(1, VOCAB - 1)}, "<pad>": VOCAB - 1}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w1"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(["</s>", "<pad>"])
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 0)])
    model = hf_model("marian", seed=5)
    with torch.no_grad():
        model.final_logits_bias.zero_()  # with it, every answer is one token repeated
    model.save_pretrained(tmp_path / "src")
    tokenizer.save(str(tmp_path / "src" / "tokenizer.json"))
    prompt = "w30 w31 w32 w33 w34 w35"
    ids = tokenizer.encode(prompt).ids  # ends with its EOS, as Marian's tokenizer ends a source
    with torch.no_grad():
        answer = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                max_new_tokens=12, do_sample=False)[0, 1:].tolist()
    assert 0 not in answer and len(set(answer)) >= 2, answer
    assert main(["generate", "--hf", str(tmp_path / "src"), "--prompt", prompt, "--max-new-tokens", "12",
                 "--temperature", "0"]) == 0
    assert capsys.readouterr().out == tokenizer.decode(answer) + "\n"
