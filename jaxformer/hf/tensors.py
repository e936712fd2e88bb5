"""Reading and writing checkpoint tensors: safetensors (single or sharded), ``pytorch_model.bin``.

`TensorFile` is a lazy mapping name -> float32 numpy array over a Hugging Face directory's
weights; tensors are read only when asked for. Writing produces one ``model.safetensors``
(float32, ``format: pt`` metadata, which ``transformers`` expects), atomically.
"""

from __future__ import annotations

import errno
import os
import pickle
import re
import reprlib
import warnings
from pathlib import Path
from typing import Iterator, Mapping

import numpy as np

from jaxformer.files import load_json

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_BIN = "pytorch_model.bin"
PYTORCH_INDEX = "pytorch_model.bin.index.json"


class TensorFile(Mapping[str, np.ndarray]):
    """Name -> float32 array of a checkpoint's tensors (integer buffers keep their dtype)."""

    def __init__(self, files: dict[str, Path], loader) -> None:
        self._files, self._loader = files, loader  # name -> file holding it; loader(file, name) -> array

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._files:
            raise KeyError(name)
        array = self._loader(self._files[name], name)
        return array.astype(np.float32) if np.issubdtype(array.dtype, np.floating) else array

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)


def _safetensors_loader():
    from safetensors import safe_open

    handles: dict[tuple[Path, str], object] = {}

    def load(path: Path, name: str) -> np.ndarray:
        def handle(framework: str):
            if (path, framework) not in handles:
                handles[(path, framework)] = safe_open(str(path), framework=framework)
            return handles[(path, framework)]

        if handle("numpy").get_slice(name).get_dtype() == "BF16":  # numpy has no bfloat16: through JAX
            return np.asarray(handle("flax").get_tensor(name), np.float32)
        return handle("numpy").get_tensor(name)

    return load


def _safetensors_names(path: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        return list(f.keys())


class _TorchFiles:
    """``pytorch_model.bin`` files, each unpickled once (``weights_only``: tensors, no code)."""

    def __init__(self) -> None:
        try:
            import torch
        except ImportError:
            raise ValueError(f"reading {PYTORCH_BIN} needs PyTorch (pip install torch), "
                             "or give the checkpoint as model.safetensors") from None
        self._torch, self._states = torch, {}

    def state(self, path: Path) -> dict:
        if path not in self._states:
            with warnings.catch_warnings():  # the unpickler's notes on pickle protocols: not the user's concern
                warnings.simplefilter("ignore", UserWarning)
                try:
                    self._states[path] = self._torch.load(str(path), map_location="cpu", weights_only=True)
                except pickle.UnpicklingError as error:
                    raise ValueError(f"{path}: refused by PyTorch's weights-only loader, nothing in it was run "
                                     f"({_unpickler_reason(str(error))})") from None
        return self._states[path]

    def __call__(self, path: Path, name: str) -> np.ndarray:
        tensor = self.state(path)[name]
        return (tensor.float() if tensor.is_floating_point() else tensor).numpy()


def _unpickler_reason(message: str) -> str:
    """What torch's weights-only unpickler refused. Its message is a page: the reason follows "error:", or (a
    ``torch.save`` file) is the paragraph after one that advises loading with ``weights_only=False``, which runs
    the file's code and which this command offers no way to do."""
    if "WeightsUnpickler error:" in message:
        message = message.split("WeightsUnpickler error:", 1)[1]
    paragraphs = [part.strip() for part in message.split("\n\n") if part.strip()]
    if len(paragraphs) > 1 and paragraphs[0].startswith("Weights only load failed"):
        paragraphs = paragraphs[1:]
    return paragraphs[0].splitlines()[0] if paragraphs else "no reason given"


def read_tensors(directory: Path) -> TensorFile:
    """The weights of a Hugging Face model directory: ``model.safetensors``, else its sharded index, else
    ``pytorch_model.bin``, else its index: transformers' order (a model saved unsharded where it was saved sharded
    keeps the old index). Raises ``FileNotFoundError`` naming what was looked for."""
    directory = Path(directory)
    for index_name, single, kind in ((SAFETENSORS_INDEX, SAFETENSORS, "safetensors"),
                                     (PYTORCH_INDEX, PYTORCH_BIN, "torch")):
        index, path = directory / index_name, directory / single
        if path.is_file():
            files = None
        elif index.is_file():
            files = _shard_files(directory, index)
        else:
            continue
        if kind == "safetensors":
            return read_safetensors(path) if files is None else TensorFile(files, _safetensors_loader())
        torch_files = _TorchFiles()
        if files is None:
            files = {name: path for name in torch_files.state(path)}
        return TensorFile(files, torch_files)
    raise FileNotFoundError(f"{directory} has no {SAFETENSORS} or {PYTORCH_BIN} (nor a sharded index of either)")


def _shard_files(directory: Path, index: Path) -> dict[str, Path]:
    """Tensor name -> the shard holding it, of a sharded checkpoint's ``index``. A shard must be a file inside
    ``directory``: a name that is absolute or climbs out (``..``) is refused naming the index, the tensor and the name,
    as transformers refuses it (``_check_shard_filenames_stay_in_model_dir`` in ``transformers.utils.hub``). Like
    transformers, the names are checked, not resolved: the Hub's cache links each shard to its blob outside the
    snapshot directory (``snapshots/REV/x.safetensors -> ../../blobs/SHA``)."""
    fields = load_json(index)
    weight_map = fields.get("weight_map") if isinstance(fields, dict) else None
    if not isinstance(weight_map, dict):
        raise ValueError(f"{index}: weight_map={reprlib.repr(weight_map)} is not an object (tensor name -> shard file)")
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard or Path(shard).anchor or ".." in Path(shard).parts:
            raise ValueError(f"{index}: weight_map[{name!r}]={shard!r} is not a file inside {directory}")
    return {name: directory / shard for name, shard in weight_map.items()}


def read_safetensors(path: Path) -> TensorFile:
    """One safetensors file's tensors."""
    return TensorFile({name: Path(path) for name in _safetensors_names(Path(path))}, _safetensors_loader())


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
    """Writes ``tensors`` to ``path`` atomically (a temporary file renamed into place, mode 0644 like the files
    `jaxformer.files.write_atomically` writes). A failed write (a full disk, a file too large) removes the temporary
    file and raises ``OSError`` naming ``path``, with the errno safetensors reports (EIO when it gives none)."""
    from safetensors import SafetensorError
    from safetensors.numpy import save_file

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        save_file({name: np.ascontiguousarray(array) for name, array in tensors.items()}, str(tmp),
                  metadata={"format": "pt", **(metadata or {})})
        os.chmod(tmp, 0o644)  # the Rust writer creates it 0600
        os.replace(tmp, path)
    except BaseException as error:
        tmp.unlink(missing_ok=True)
        if isinstance(error, SafetensorError):
            raise _write_error(error, path) from None
        raise


def _write_error(error: Exception, path: Path) -> OSError:
    """The ``OSError`` of a safetensors write that failed: its message ends "(os error N)" when the system refused."""
    match = re.search(r"\(os error (\d+)\)", str(error))
    code = int(match.group(1)) if match else errno.EIO
    return OSError(code, os.strerror(code) if match else str(error), str(path))
