"""`jaxformer.scaling.plots.save_all`: a set of figures is written whole or not at all."""

import errno
import resource
import signal
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from jaxformer.scaling.plots import save_all

PNG = b"\x89PNG\r\n\x1a\n"


def _figure(inches: float) -> Figure:
    figure = Figure(figsize=(inches, inches))
    figure.subplots().plot([1, 2], [3, 4])
    return figure


def _contents(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def test_a_figure_whose_write_fails_midway_leaves_none_written_and_the_old_ones_as_they_were(tmp_path):
    """Files past 50 kB cannot be written (RLIMIT_FSIZE: EFBIG, as a disk that fills): the large figure in the
    middle fails after the first was written. first.png and first.svg used to be left written (first.png replaced),
    beside the old last.svg; now every file is as it was and no temporary file is left."""
    figures = {"first": _figure(2), "large": _figure(20), "last": _figure(2)}  # PNGs of about 11 kB, 100 kB, 11 kB
    (tmp_path / "first.png").write_bytes(b"old first")
    (tmp_path / "last.svg").write_bytes(b"old last")
    limits, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, limits[1]))
    try:
        with pytest.raises(OSError) as error:
            save_all(figures, tmp_path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert (error.value.errno, error.value.filename) == (errno.EFBIG, str(tmp_path / "large.png"))
    assert _contents(tmp_path) == {"first.png": b"old first", "last.svg": b"old last"}

    written = save_all(figures, tmp_path)  # the same figures with room for them: all six, the old ones replaced
    names = [f"{name}.{ext}" for name in figures for ext in ("png", "svg")]
    assert written == [tmp_path / name for name in names]
    contents = _contents(tmp_path)
    assert sorted(contents) == sorted(names)
    assert all(contents[name].startswith(PNG) for name in names[::2])
    assert all(contents[name].startswith(b"<?xml") for name in names[1::2])
