"""Checkpoints in and out: `load` (Hugging Face directory, GGUF file, or an ``import-hf`` directory) and `save`.

``load(path) -> (cfg, params)``: ``params`` is the ``nnx.State`` that `jaxformer.models.init_params`
makes for ``cfg``, so ``apply(init_params(cfg, 0)[0], params, tokens)`` runs the checkpoint.
``save(cfg, params, out)`` writes a directory that ``transformers`` loads (``config.json`` +
``model.safetensors``, float32). Both go through the family's `Rule`s (`jaxformer.hf.layout`),
so in → out → in reproduces every parameter bit for bit.

An ``import-hf`` directory (`write_imported`) holds ``model.yaml`` (the ``model:`` section, usable
as a config file by ``count``/``generate``/``train``), ``params.safetensors`` (jaxformer's
parameter names), ``hf.json`` (the source's config.json) and ``tokenizer.json`` and ``tokenizer_config.json``
(special tokens, chat template) and ``generation_config.json`` (transformers' generation defaults: stop tokens,
sampling) when the source has them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import yaml
from flax import nnx

from jaxformer.architecture import ModelConfig
from jaxformer.files import write_json_atomic, write_text_atomic
from jaxformer.hf import families
from jaxformer.hf.metadata import (TOKENIZER, json_object, read_generation_config, tokenizer_config_of,
                                   write_generation_config, write_tokenizer)
from jaxformer.hf.tensors import read_safetensors, read_tensors, write_safetensors

IMPORTED_PARAMS, IMPORTED_MODEL, IMPORTED_SOURCE = "params.safetensors", "model.yaml", "hf.json"
# token ids a source checkpoint's config carries, kept through an import and written on export
TOKEN_ID_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "forced_eos_token_id")


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint holds: the model, its parameters, the source config.json, a tokenizer (JSON text), its
    ``tokenizer_config.json`` fields (special tokens, chat template) and its ``generation_config.json`` (None
    without one)."""

    cfg: ModelConfig
    params: nnx.State
    hf_config: dict[str, Any]
    tokenizer_json: str | None
    tokenizer_config: dict[str, Any] | None = None
    generation_config: dict[str, Any] | None = None


def _abstract_params(cfg: ModelConfig) -> nnx.State:
    from jaxformer.models.pure import init_params

    return nnx.eval_shape(lambda: init_params(cfg, 0))[1]


def _dotted(path: tuple) -> str:
    return ".".join(str(getattr(key, "key", getattr(key, "idx", key))) for key in path)


def flat_params(params: nnx.State) -> dict[str, np.ndarray]:
    """``{"decoder.blocks.0.attention.wq": array, …}`` of a params state (float32 numpy)."""
    leaves = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(params))[0]
    return {_dotted(path): np.asarray(leaf, np.float32) for path, leaf in leaves}


def params_from_flat(cfg: ModelConfig, flat: Mapping[str, np.ndarray], *, source: str) -> nnx.State:
    """The params state of ``cfg`` filled from dotted names; a missing, extra or misshapen array raises."""
    abstract = _abstract_params(cfg)
    pure = nnx.to_pure_dict(abstract)
    expected = {_dotted(path): leaf.shape for path, leaf in jax.tree_util.tree_flatten_with_path(pure)[0]}
    missing, extra = sorted(expected.keys() - flat.keys()), sorted(flat.keys() - expected.keys())
    if missing:
        raise ValueError(f"{source}: no tensor for parameter {missing[0]} ({len(missing)} missing)")
    if extra:
        raise ValueError(f"{source}: parameter {extra[0]} is not part of this model ({len(extra)} extra)")
    for name, shape in expected.items():
        if tuple(flat[name].shape) != tuple(shape):
            raise ValueError(f"{source}: {name} has shape {tuple(flat[name].shape)}, the model needs {tuple(shape)}")

    def fill(node: dict, prefix: str) -> dict:
        return {key: fill(value, f"{prefix}{key}.") if isinstance(value, dict)
                else jnp.asarray(flat[f"{prefix}{key}"], jnp.float32) for key, value in node.items()}

    nnx.replace_by_pure_dict(abstract, fill(pure, ""))
    return abstract


def _lookup(tensors: Mapping[str, np.ndarray], name: str, family) -> str | None:
    """The checkpoint's name for ``name``: as is, without the base-model prefix, or an old alias."""
    candidates = [name]
    if family.PREFIX and name.startswith(family.PREFIX):
        candidates.append(name[len(family.PREFIX):])
    for new, old in getattr(family, "ALIASES", {}).items():
        candidates += [c.replace(new, old) for c in candidates if new in c]
    return next((c for c in candidates if c in tensors), None)


def params_from_tensors(cfg: ModelConfig, family, tensors: Mapping[str, np.ndarray], *, source: str) -> nnx.State:
    """Applies ``family``'s rules to checkpoint tensors (Hugging Face names); unused tensors are noted."""
    flat: dict[str, np.ndarray] = {}
    used: set[str] = set()
    for rule in family.rules(cfg):
        names = [_lookup(tensors, name, family) for name in rule.hf]
        if None in names:
            raise ValueError(f"{source}: the checkpoint has no tensor {rule.hf[names.index(None)]}")
        used.update(names)
        arrays = [tensors[name] for name in names]
        try:
            flat.update(zip(rule.ours, rule.load(arrays)))
        except ValueError as error:
            if not str(error).startswith("cannot reshape array"):  # a rule's own refusal names its tensors
                raise
            # a config whose sizes are not the tensors': numpy's reshape names neither
            shapes = ", ".join(f"{name} {tuple(np.shape(a))}" for name, a in zip(names, arrays))
            raise ValueError(f"{source}: {shapes} does not fit the model its config describes ({error})") from None
    if cfg.tie_embeddings:
        _check_tied_copies(family, tensors, source)
    unused = sorted(name for name in tensors if name not in used and not any(part in name for part in family.IGNORED))
    if unused:
        warnings.warn(f"{source}: {len(unused)} tensors not used by the jaxformer model, e.g. {unused[0]}",
                      stacklevel=2)
    return params_from_flat(cfg, flat, source=source)


def _check_tied_copies(family, tensors: Mapping[str, np.ndarray], source: str) -> None:
    """Refuses a tied model's checkpoint holding a tied copy (``family.TIED``: an ``lm_head.weight``) with numbers
    of its own, which the tied model would leave unread: transformers 5 unties such a pair ("both are present in the
    checkpoints with different values", ``PreTrainedModel.tie_weights``), so its outputs would not be jaxformer's."""
    for copy, original in family.TIED.items():
        names = _lookup(tensors, copy, family), _lookup(tensors, original, family)
        if None not in names and names[0] != names[1] and not np.array_equal(tensors[names[0]], tensors[names[1]]):
            raise ValueError(f"{source}: config.json: tie_word_embeddings=True, but its {names[0]} differs from "
                             f"{names[1]} (transformers 5 then unties them, as with tie_word_embeddings=false)")


def _is_imported(path: Path) -> bool:
    return path.is_dir() and (path / IMPORTED_PARAMS).is_file() and (path / IMPORTED_MODEL).is_file()


def _gguf_file(path: Path) -> Path | None:
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and not (path / "config.json").is_file():
        found = sorted(path.glob("*.gguf"))
        if len(found) == 1:
            return found[0]
    return None


def _open(path: Path) -> tuple[dict[str, Any], Mapping[str, np.ndarray], str | None, dict[str, Any] | None, str]:
    """``(config.json fields, lazy tensors by Hugging Face name, tokenizer.json, tokenizer_config.json fields,
    source name)`` of a Hugging Face directory or a GGUF file."""
    gguf_path = _gguf_file(path)
    if gguf_path is not None:
        from jaxformer.hf.gguf import read_gguf

        hf_config, tensors, tokenizer_json, tokenizer_config = read_gguf(gguf_path)
        return hf_config, tensors, tokenizer_json, tokenizer_config, str(gguf_path)
    config_path = _config_file(path)
    tokenizer_path = path / TOKENIZER
    return (json_object(config_path), read_tensors(path),
            tokenizer_path.read_text() if tokenizer_path.is_file() else None, tokenizer_config_of(path), str(path))


def _config_file(path: Path) -> Path:
    """A Hugging Face directory's ``config.json``; one line naming ``path`` when it has none."""
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a Hugging Face model directory (no config.json), "
                                "a .gguf file or an import-hf directory")
    return path / "config.json"


def _existing(path: str | Path) -> Path:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    return path


@contextlib.contextmanager
def _reading(path: Path) -> Iterator[None]:
    """One line naming ``path`` for what a malformed checkpoint raises while it is read (a config.json that is no
    object, a safetensors or GGUF file cut short or garbled …); this module's own errors pass as they are."""
    try:
        yield
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: a JSON file of it is not valid JSON ({error})") from None
    except (ValueError, FileNotFoundError):
        raise
    except Exception as error:  # whatever json, safetensors or gguf raise on such a file
        raise ValueError(f"{path}: not a readable checkpoint ({type(error).__name__}: {error})") from None


def _check_tokenizer(path: Path, tokenizer_json: str) -> None:
    """Refuses, naming ``path``, a tokenizer.json that is JSON but no tokenizer ``tokenizers`` reads."""
    from tokenizers import Tokenizer

    try:
        Tokenizer.from_str(tokenizer_json)
    except Exception as error:  # noqa: BLE001 - tokenizers raises a plain Exception ("Model missing. at …")
        raise ValueError(f"{path}: its tokenizer.json is not a tokenizer the tokenizers library reads "
                         f"({error})") from None


def read_config(path: str | Path) -> ModelConfig:
    """The `ModelConfig` of a checkpoint `load` reads, without reading its tensors."""
    path = _existing(path)
    with _reading(path):
        if _is_imported(path):
            return _imported_config(path)
        hf_config, tensors, *_ = _open(path)
        return families.for_model_type(hf_config.get("model_type")).to_config(hf_config, set(tensors))


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Everything `load` reads, plus the source config.json and the tokenizer (see the module docstring)."""
    path = _existing(path)
    with _reading(path):
        if _is_imported(path):
            return _read_imported(path)
        hf_config, tensors, tokenizer_json, tokenizer_config, source = _open(path)
        if tokenizer_json is not None:  # a garbled tokenizer.json is refused here, not when text is first encoded
            json.loads(tokenizer_json)
            _check_tokenizer(path, tokenizer_json)
        family = families.for_model_type(hf_config.get("model_type"))
        cfg = family.to_config(hf_config, set(tensors))
        return Checkpoint(cfg, params_from_tensors(cfg, family, tensors, source=source), hf_config, tokenizer_json,
                          tokenizer_config, read_generation_config(path))


def read_token_metadata(path: str | Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``(source config.json, tokenizer_config.json fields)`` of a checkpoint, its tensors unread: what its
    tokens mean (special token ids, chat template). A directory holding ``hf.json`` (an ``import-hf`` directory,
    or a run fine-tuned from a checkpoint: `copy_token_metadata`) answers with that."""
    path = _existing(path)
    with _reading(path):
        if _gguf_file(path) is not None:  # its metadata is read; its tensors stay lazy
            hf_config, _, _, tokenizer_config, _ = _open(path)
            return hf_config, tokenizer_config
        source = path / IMPORTED_SOURCE if (path / IMPORTED_SOURCE).is_file() else _config_file(path)
        return json_object(source), tokenizer_config_of(path)


def kept_token_metadata(run_dir: str | Path) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
    """What `copy_token_metadata` kept in a run trained from a checkpoint with its tokenizer; None in other runs."""
    return read_token_metadata(run_dir) if (Path(run_dir) / IMPORTED_SOURCE).is_file() else None


def copy_token_metadata(source: str | Path, out: Path) -> None:
    """``out/hf.json``, ``out/tokenizer_config.json`` (`read_token_metadata`) and ``out/generation_config.json`` of
    ``source``: a run that trains from a checkpoint with its tokenizer keeps them, so its export and its samples end
    at the source's EOS (and transformers generates from the export as from the source)."""
    hf_config, tokenizer_config = read_token_metadata(source)
    _write_source(out, hf_config)
    write_tokenizer(out, None, tokenizer_config)
    write_generation_config(out, read_generation_config(source))


def load(path: str | Path) -> tuple[ModelConfig, nnx.State]:
    """``(cfg, params)`` of a Hugging Face model directory (``config.json`` with ``model.safetensors`` or
    ``pytorch_model.bin``), a ``.gguf`` file (dequantised to float32) or an ``import-hf`` directory.

    Families: GPT-2, Llama/Mistral/Qwen2, BERT, Marian, T5. An unsupported ``model_type`` or option
    raises ``ValueError`` in one line naming the config field.
    """
    checkpoint = read_checkpoint(path)
    return checkpoint.cfg, checkpoint.params


def hf_tensors(cfg: ModelConfig, params: nnx.State) -> dict[str, np.ndarray]:
    """The Hugging Face tensors of a jaxformer model (the family's rules, saving direction)."""
    family = families.for_config(cfg)
    family.check_export(cfg)
    flat = flat_params(params)
    tensors: dict[str, np.ndarray] = {}
    for rule in family.rules(cfg):
        tensors.update(zip(rule.hf, rule.save([flat[name] for name in rule.ours])))
    if getattr(family, "is_bare", lambda _: False)(cfg):  # a base-model class: names without its prefix
        tensors = {name.removeprefix(family.PREFIX): array for name, array in tensors.items()}
    return tensors


def save(cfg: ModelConfig, params: nnx.State, out: str | Path, *, tokenizer_json: str | None = None,
         source_config: dict[str, Any] | None = None, tokenizer_config: dict[str, Any] | None = None,
         generation_config: dict[str, Any] | None = None) -> Path:
    """Writes a ``transformers`` directory for the model: ``config.json``, ``model.safetensors``, and
    ``tokenizer.json``, ``tokenizer_config.json`` (special tokens, chat template) and ``generation_config.json``
    when given. ``source_config``
    (an imported checkpoint's config.json) supplies its special token ids. A model with no Hugging Face
    equivalent raises naming the field. ``out`` (absent, or an empty directory) is written whole or not at all."""
    out = _new_directory_path(out)
    family = families.for_config(cfg)
    family.check_export(cfg)
    tensors = hf_tensors(cfg, params)
    config = family.hf_config(cfg)
    for name in TOKEN_ID_FIELDS:
        if source_config and source_config.get(name) is not None:
            config[name] = source_config[name]
        elif name in ("bos_token_id", "eos_token_id"):  # none, as jaxformer's: not the class's (GPT-2's 50256)
            config.setdefault(name, None)
    if cfg.family == "encoder_decoder":
        config.setdefault("decoder_start_token_id", 0)  # what jaxformer.generate starts from
        config.setdefault("pad_token_id", config["decoder_start_token_id"])
    config["dtype"] = "float32"
    with _new_directory(out) as directory:
        write_safetensors(directory / "model.safetensors", tensors)
        write_json_atomic(directory / "config.json", config, sort_keys=True)
        write_tokenizer(directory, tokenizer_json, tokenizer_config)
        write_generation_config(directory, generation_config)
    return out


def _new_directory_path(out: str | Path) -> Path:
    """``out`` as a `Path`, refused before any work unless it is absent or an empty directory (``FileExistsError``:
    nothing the user keeps there is replaced or mixed with the new files)."""
    out = Path(out)
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise FileExistsError(errno.EEXIST, "exists and is not an empty directory", str(out))
    return out


@contextlib.contextmanager
def _new_directory(out: Path) -> Iterator[Path]:
    """A temporary directory beside ``out`` to fill, renamed to ``out`` (absent, or an empty directory) when the
    block ends; on any error it is removed, so ``out`` is never left half-written. An ``OSError`` names ``out``
    (or the file in it), not the temporary directory."""
    out = Path(os.path.abspath(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        temporary = tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.")
    except OSError as error:
        raise type(error)(error.errno, error.strerror, str(out)) from None
    try:
        yield Path(temporary)
        os.chmod(temporary, 0o755)  # mkdtemp creates 0700; the files in it are 0644
        os.replace(temporary, out)
    except BaseException as error:
        shutil.rmtree(temporary, ignore_errors=True)
        if isinstance(error, OSError) and error.errno and str(error.filename).startswith(temporary):
            named = str(out) + str(error.filename)[len(temporary):]
            raise type(error)(error.errno, error.strerror, named) from None
        raise


def _write_source(out: Path, hf_config: dict[str, Any]) -> None:
    write_json_atomic(out / IMPORTED_SOURCE, hf_config, sort_keys=True)


def write_imported(checkpoint: Checkpoint, out: str | Path) -> Path:
    """An ``import-hf`` directory (module docstring) at ``out`` (absent, or empty), written whole or not at all."""
    out = _new_directory_path(out)
    with _new_directory(out) as directory:
        write_safetensors(directory / IMPORTED_PARAMS, flat_params(checkpoint.params))
        _write_source(directory, checkpoint.hf_config)
        write_tokenizer(directory, checkpoint.tokenizer_json, checkpoint.tokenizer_config)
        write_generation_config(directory, checkpoint.generation_config)
        model = {"model": dataclasses.asdict(checkpoint.cfg)}
        write_text_atomic(directory / IMPORTED_MODEL, yaml.safe_dump(model, sort_keys=False))
    return out


def _imported_config(path: Path) -> ModelConfig:
    from jaxformer.configs import load_yaml
    from jaxformer.models.presets import model_config_from_dict

    return model_config_from_dict(load_yaml(path / IMPORTED_MODEL)["model"])


def _read_imported(path: Path) -> Checkpoint:
    cfg = _imported_config(path)
    tensors = read_safetensors(path / IMPORTED_PARAMS)
    params = params_from_flat(cfg, {name: tensors[name] for name in tensors}, source=str(path))
    source = path / IMPORTED_SOURCE
    tokenizer = path / TOKENIZER
    return Checkpoint(cfg, params, json_object(source) if source.is_file() else {},
                      tokenizer.read_text() if tokenizer.is_file() else None, tokenizer_config_of(path),
                      read_generation_config(path))

