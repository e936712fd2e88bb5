"""`Extension`: a C++ XLA FFI kernel from ``jaxformer/csrc``, compiled on first use and registered with ``jax.ffi``.

Build: the source is compiled with ``$CXX`` (default ``g++``) against ``jax.ffi.include_dir()`` (and the
extension's own include and library directories, e.g. oneDNN's), into ``$JAXFORMER_EXT_CACHE`` (default
``~/.cache/jaxformer/ext``) under a name keyed by the source, the jaxlib version, the compiler, its flags
and the CPU's flags, so an upgrade of jaxlib or a different machine builds afresh. The library is written
to a temporary name and renamed, so concurrent processes never load a half-written file; a file in the cache
that does not load as the kernel (truncated, emptied) is deleted and built once more. An environment
variable per extension names a prebuilt library to load instead (no build). A cache directory another user owns
or every user may write is not used (its libraries would run as this user's code): the plain path computes.

If the build or the load fails, :meth:`Extension.available` is False, one warning says why
(:meth:`Extension.unavailable_reason`), and the callers compute with their plain path.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Callable

import jax

from jaxformer.files import others_may_write

CSRC = Path(__file__).resolve().parent.parent / "csrc"
CACHE_ENV = "JAXFORMER_EXT_CACHE"
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno")
ARCH_FLAGS = ("-march=native",)


def cpu_flags() -> str:
    """The CPU's feature flags (``-march=native`` compiles for them), '' where /proc/cpuinfo is absent."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _compiler() -> str:
    return os.environ.get("CXX", "g++")


@dataclasses.dataclass
class Extension:
    """One kernel library: ``csrc/<name>.cc`` exporting ``jaxformer_<name>_version()`` and FFI handlers.

    targets: FFI target name → exported handler symbol. batch_partitionable: every operand and result
    of every target leads with the batch axis (a data-parallel mesh may split the calls by batch).
    link_flags: called at build time, returns the extra compiler arguments (include and library
    directories, libraries); it raises to say a dependency is missing.
    """

    name: str
    abi_version: int
    library_env: str
    targets: dict[str, str]
    batch_partitionable: bool = False
    link_flags: Callable[[], tuple[str, ...]] = tuple
    description: str = ""
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)
    _state: dict = dataclasses.field(default_factory=lambda: {"tried": False, "available": False, "reason": None,
                                                              "path": None, "library": None}, repr=False)

    @property
    def source(self) -> Path:
        return CSRC / f"{self.name}.cc"

    def library_path(self, extra_flags: tuple[str, ...] = ()) -> Path:
        """Where the library built for this source, jaxlib, compiler, flags and CPU lives (it may not exist yet)."""
        import jaxlib

        key = hashlib.sha256()
        for part in (self.source.read_bytes(), jaxlib.__version__.encode(), _compiler().encode(),
                     " ".join(FLAGS + extra_flags).encode(), platform.machine().encode(), cpu_flags().encode()):
            key.update(part)
            key.update(b"\0")
        cache = Path(os.environ.get(CACHE_ENV, "~/.cache/jaxformer/ext")).expanduser()
        return cache / f"{self.name}-{key.hexdigest()[:16]}.so"

    def build(self, path: Path, extra_flags: tuple[str, ...] = ()) -> Path:
        """Compiles the library to ``path`` (atomically); raises ``RuntimeError`` with the compiler's message."""
        compiler = _compiler()
        if shutil.which(compiler) is None:
            raise RuntimeError(f"no C++ compiler: {compiler!r} is not on PATH (set CXX)")
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=path.stem + ".", suffix=".tmp.so", dir=path.parent)
        os.close(handle)
        errors = []
        try:
            for arch in (ARCH_FLAGS, ()):  # -march=native first; a compiler without it gets the baseline ISA
                command = [compiler, *FLAGS, *arch, "-isystem", jax.ffi.include_dir(), str(self.source),
                           *extra_flags, "-o", temporary]
                result = subprocess.run(command, capture_output=True, text=True)
                if result.returncode == 0:
                    os.replace(temporary, path)
                    return path
                errors.append(f"{' '.join(command)}: {result.stderr.strip()[-2000:]}")
            raise RuntimeError(f"compiling the {self.description or self.name} kernel failed:\n" + "\n".join(errors))
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)

    def _open(self, path: Path) -> ctypes.CDLL:
        """The library at ``path``, checked to be this kernel's version; raises if it is missing or not a library."""
        self._state["path"] = str(path)
        library = ctypes.cdll.LoadLibrary(str(path))  # OSError when missing or not a library
        version = getattr(library, f"jaxformer_{self.name}_version")()
        if version != self.abi_version:
            raise RuntimeError(f"{path} is version {version} of the kernel, this jaxformer needs {self.abi_version}")
        return library

    def _load(self) -> None:
        if os.environ.get(self.library_env):
            library = self._open(Path(os.environ[self.library_env]))
        else:
            extra = tuple(self.link_flags())
            path = self.library_path(extra)
            path.parent.mkdir(parents=True, exist_ok=True)
            whose = others_may_write(path.parent)
            if whose is not None:  # a library there is loaded into this process: it could be anyone's code
                raise RuntimeError(f"the kernel cache {path.parent} is {whose}, so its libraries could be anyone's: "
                                   f"not used (give ${CACHE_ENV} a directory only you can write)")
            library = None
            if path.exists():
                try:
                    library = self._open(path)
                except OSError:  # a damaged file in the cache (it never loaded, so its path is free): built afresh
                    path.unlink(missing_ok=True)
            if library is None:
                library = self._open(self.build(path, extra))
        for target, symbol in self.targets.items():
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")
            if self.batch_partitionable:
                jax.ffi.register_ffi_target_as_batch_partitionable(target)
        self._state["library"] = library

    def available(self) -> bool:
        """Whether the kernel is built and registered (building it on the first call); warns once if not."""
        with self._lock:
            if not self._state["tried"]:
                self._state["tried"] = True
                try:
                    self._load()
                    self._state["available"] = True
                except Exception as error:  # any failure leaves the plain path in charge
                    self._state["reason"] = f"{type(error).__name__}: {error}"
                    warnings.warn(f"{self.description or self.name} is unavailable, the plain path computes instead: "
                                  f"{self._state['reason']}", RuntimeWarning, stacklevel=4)
        return self._state["available"]

    def library(self) -> ctypes.CDLL | None:
        """The loaded library (for its plain C exports, e.g. a capability probe); ``None`` where it is unavailable."""
        return self._state["library"] if self.available() else None

    def unavailable_reason(self) -> str | None:
        """Why the kernel could not be loaded (``None`` when it is, or before :meth:`available` ran)."""
        return self._state["reason"]

    def loaded_path(self) -> str | None:
        """The library the kernel was (or was to be) loaded from."""
        return self._state["path"]
