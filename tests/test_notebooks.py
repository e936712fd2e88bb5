"""The notebooks run top to bottom in a fresh kernel (their cells assert the worked numbers)."""

import sys
from pathlib import Path

import nbclient
import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def test_kernel_runs_this_interpreter():
    # jupyter_client swaps a bare "python"/"python3" for sys.executable when it starts the kernel
    argv0 = KernelSpecManager().get_kernel_spec("python3").argv[0]
    assert argv0 in {"python", f"python{sys.version_info[0]}", f"python{sys.version_info[0]}.{sys.version_info[1]}",
                     sys.executable}


@pytest.mark.parametrize("name, figures", [("attention_walkthrough", 0), ("fit_scaling_laws", 5), ("committed_study", 3)])
def test_notebook_executes(name, figures):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=600,
                            resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= figures
