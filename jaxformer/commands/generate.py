"""`jaxformer generate`: sample text from a run directory, a config file, a preset or a Hugging Face checkpoint.

Where the model comes from:

- ``--preset NAME`` or ``CONFIG.yaml`` (a ``model:`` section or a bare model mapping):
  an untrained model initialised from ``--seed`` — useful to exercise the decoding path;
- ``RUN_DIR`` (a training run): ``RUN_DIR/config.yaml`` gives the model; trained
  parameters come from ``RUN_DIR/checkpoints/`` (`jaxformer.train.restore`, read-only), and
  prompts are encoded with the run's own tokenizer (bytes, or the BPE it saved; a run trained
  from a checkpoint with its tokenizer stops, as the checkpoint does, at its EOS);
- ``--hf DIR``: a local Hugging Face checkpoint (``config.json`` + weights), a ``.gguf`` file or
  an ``import-hf`` directory (`jaxformer.hf`), with the checkpoint's own ``tokenizer.json``
  (read by ``tokenizers``; for a GGUF file, rebuilt from its vocabulary).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jaxformer.arguments import integer, number
from jaxformer.configs import shown
from jaxformer.models.presets import resolve_model


def encode_text(text: str) -> list[int]:
    """Byte-level tokens: the UTF-8 bytes of ``text`` (vocabulary 256)."""
    return list(text.encode("utf-8"))


def decode_tokens(ids) -> str:
    """Inverse of :func:`encode_text`; ids past the byte range (a larger vocabulary) print as ``<id>``."""
    out, pending = [], bytearray()
    for token in (int(i) for i in ids):
        if token < 256:
            pending.append(token)
            continue
        out.append(pending.decode("utf-8", errors="replace") + f"<{token}>")
        pending = bytearray()
    return "".join(out) + pending.decode("utf-8", errors="replace")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", nargs="?", help="a training run directory, or a YAML file with a model section")
    parser.add_argument("--preset", help="an untrained preset instead, e.g. tiny, gpt2")
    parser.add_argument("--hf", metavar="DIR", help="a Hugging Face checkpoint directory, a .gguf file or an "
                        "import-hf directory, with its own tokenizer")
    parser.add_argument("--prompt", required=True,
                        help="text to continue (encoded as UTF-8 bytes, or with the run's or checkpoint's tokenizer)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=number(minimum=0), default=1.0, help="0 = greedy")
    parser.add_argument("--top-k", type=int, help="sample among the k most likely tokens")
    parser.add_argument("--top-p", type=float, help="sample from the nucleus of probability mass p, in (0, 1]")
    parser.add_argument("--seed", type=integer(0, 2**32 - 1), default=0, help="sampling seed (and init seed of an untrained model)")


def load_model(source: str | None, preset: str | None, seed: int):
    """``(model, tokenizer)`` to sample from: a run directory's, a config file's or a preset's (module docstring).

    A run directory is only read (`jaxformer.train.restore`); a model from a config or a
    preset is untrained and byte-level (tokenizer None).
    """
    from flax import nnx

    from jaxformer.models.build import build_model

    path = None if source is None else Path(source)
    if path is not None and not path.exists():
        raise FileNotFoundError(f"no run directory or config file at {path}")
    if path is None or not path.is_dir():
        return build_model(resolve_model(source, preset), rngs=nnx.Rngs(params=seed)), None
    if preset is not None:
        raise ValueError("give a run directory or --preset, not both")
    from jaxformer.train.checkpoint import CheckpointError
    from jaxformer.train.restore import load_run_config, restore_params, run_tokenizer

    config = load_run_config(path)
    model = build_model(config.model, rngs=nnx.Rngs(params=seed), kernel=config.kernel)
    try:
        restored = restore_params(path, config)
    except CheckpointError as error:  # unreadable checkpoints of a run: a bad source, reported in one line
        raise ValueError(str(error)) from None
    if restored is None and (path / "final.json").is_file():  # finished, its parameters gone: no model to sample
        raise ValueError(f"{path} finished training but holds no checkpoint to sample from (checkpoints/ is gone)")
    if restored is None:
        print(f"note: {path} has no checkpoint yet; sampling from the untrained model", file=sys.stderr)
    else:
        print(f"restored {path} at step {restored[0]}", file=sys.stderr)
        graphdef, _ = nnx.split(model)
        model = nnx.merge(graphdef, restored[1])
    return model, run_tokenizer(path, config)


class _CheckpointTokenizer:
    """A checkpoint's ``tokenizer.json`` (``tokenizers``), with the encode/decode of the run tokenizers."""

    def __init__(self, tokenizer_json: str) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_str(tokenizer_json)

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text).ids

    def decode(self, ids) -> str:
        return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)


def load_hf(path: str):
    """``(model, tokenizer, start_token, stop_tokens)`` of a checkpoint `jaxformer.hf` reads: its
    ``decoder_start_token_id`` (default 0) and ``eos_token_id`` (one id or a list; none: no stop)."""
    from flax import nnx

    from jaxformer.hf import read_checkpoint
    from jaxformer.models.build import build_model

    checkpoint = read_checkpoint(path)
    if checkpoint.tokenizer_json is None:
        raise ValueError(f"{path} has no tokenizer.json (nor a GGUF vocabulary jaxformer can rebuild)")
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: build_model(checkpoint.cfg, rngs=nnx.Rngs(0))))
    start = checkpoint.hf_config.get("decoder_start_token_id")
    return (nnx.merge(graphdef, checkpoint.params), _CheckpointTokenizer(checkpoint.tokenizer_json),
            0 if start is None else int(start), stop_tokens_of(checkpoint.hf_config, checkpoint.generation_config))


def stop_tokens_of(hf_config: dict, generation_config: dict | None = None) -> tuple[int, ...]:
    """A checkpoint's stop tokens: ``eos_token_id`` (one id or a list; none: no stop) of its
    ``generation_config.json`` where that sets one, as transformers' ``generate`` reads it (Qwen2.5 stops at
    two there, one in config.json), else of its config."""
    eos = (generation_config or {}).get("eos_token_id")
    source = "generation_config.json" if eos is not None else "config.json"
    eos = hf_config.get("eos_token_id") if eos is None else eos
    ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ValueError(f"{source}: eos_token_id must be a token id or a list of them, got {shown(eos)}")
    return tuple(ids)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from jaxformer.models.generate import check_sampling, generate

    if args.hf is not None and (args.source is not None or args.preset is not None):
        raise ValueError("give --hf DIR, a run directory, a config file or --preset: only one")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    if not args.prompt:
        raise ValueError("--prompt must not be empty")
    cfg = resolve_model(None, args.preset) if args.preset and args.source is None else None
    if cfg is not None:  # fail on bad sampling options before building a large preset
        check_sampling(args.temperature, args.top_k, args.top_p, cfg.vocab_size)
    start_token, stop_tokens = 0, ()
    if args.hf is not None:
        model, tokenizer, start_token, stop_tokens = load_hf(args.hf)
    else:
        model, tokenizer = load_model(args.source, args.preset, args.seed)
        if args.source is not None:
            from jaxformer.hf import kept_token_metadata, read_generation_config

            kept = kept_token_metadata(args.source)  # a run trained from a checkpoint: its EOS
            stop_tokens = stop_tokens_of(kept[0], read_generation_config(args.source)) if kept else ()
    try:
        prompt = encode_text(args.prompt) if tokenizer is None else [int(t) for t in tokenizer.encode(args.prompt)]
    except Exception as error:  # noqa: BLE001 - tokenizers' plain Exception: a vocabulary without its [UNK] token …
        raise ValueError(f"{args.source or args.hf}: its tokenizer cannot encode --prompt ({error})") from None
    new_tokens = generate(model, prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                          top_k=args.top_k, top_p=args.top_p, seed=args.seed, start_token=start_token,
                          stop_tokens=stop_tokens)
    ended = [i for i, token in enumerate(np.asarray(new_tokens).tolist()) if token in stop_tokens]
    new_tokens = [int(t) for t in (new_tokens[:ended[0]] if ended else new_tokens)]  # cut where the EOS came
    if tokenizer is None:
        print(args.prompt + decode_tokens(new_tokens))
    elif model.cfg.family == "encoder_decoder":  # a translation model answers its prompt rather than continuing it
        print(tokenizer.decode(new_tokens))
    else:
        print(args.prompt + continuation_text(tokenizer, prompt, new_tokens))
    return 0


def continuation_text(tokenizer, prompt: list[int], new_tokens: list[int]) -> str:
    """The text ``new_tokens`` add after ``prompt``. Decoded alone, a continuation can lose what the tokens before
    it give it (SentencePiece decoders strip the first piece's leading space), so it is decoded after the
    prompt, less the prompt's own text."""
    before, whole = tokenizer.decode(prompt), tokenizer.decode(prompt + new_tokens)
    return whole[len(before):] if whole.startswith(before) else tokenizer.decode(new_tokens)
