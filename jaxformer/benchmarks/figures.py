"""The common ending of the benchmarks' figures: log-2 x axes, grids, legends, an atomic PNG."""

from __future__ import annotations

from pathlib import Path

from jaxformer.files import write_atomically


def save_figure(fig, axes, path: Path) -> None:
    """Gives every axis of ``axes`` a log-2 x scale, a grid and a legend (where it has labelled lines: a run that
    measured nothing for an axis leaves it empty); writes ``fig`` to ``path`` and closes it."""
    import matplotlib.pyplot as plt

    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    write_atomically(path, lambda handle: fig.savefig(handle, format="png", dpi=120))
    plt.close(fig)
