"""A sweep's layout on accelerators: one warm worker per GPU, each shown its own device; a TPU host's chips in one
worker; the CPU layout where JAX has only the CPU (checked on a GPU machine in experiments/gpu_check/)."""

import os
import subprocess
import sys
import textwrap

import pytest

from jaxformer.runtime import plugin_installed
from jaxformer.sweep import launch
from jaxformer.sweep.accelerators import Accelerators, local_accelerators, worker_environment
from jaxformer.sweep.executors import LocalPool, ray_actor_count

GPUS = Accelerators("gpu", (0, 1))


def test_the_probe_finds_this_machines_accelerators():
    """None on a CPU-only install (CI: no child is started); the GPUs on a GPU machine (experiments/gpu_check/)."""
    found = local_accelerators()
    if not plugin_installed():
        assert found is None
    else:
        import jax

        assert found.platform == jax.default_backend() and len(found.ids) == jax.local_device_count()


@pytest.mark.skipif(plugin_installed(), reason="a real accelerator plugin is installed here")
def test_an_installed_plugin_is_probed_in_a_child_process_whose_cpu_answer_keeps_the_cpu_layout(tmp_path):
    """A PJRT plugin that registers nothing: the probe runs (JAX imports the plugin), JAX answers cpu, so no
    accelerator layout; ``JAX_PLATFORMS=cpu`` skips the probe."""
    plugin = tmp_path / "jax_plugins" / "inert"
    plugin.mkdir(parents=True)
    marker = tmp_path / "initialized"
    (plugin / "__init__.py").write_text(f"def initialize():\n    open({str(marker)!r}, 'a').write('x')\n")
    script = textwrap.dedent("""
        from jaxformer.runtime import plugin_installed
        from jaxformer.sweep.accelerators import local_accelerators
        print(plugin_installed(), local_accelerators())
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "None"] and marker.read_text() == "x"  # the child started JAX's backends
    env["JAX_PLATFORMS"] = "cpu"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.stdout.split() == ["False", "None"] and marker.read_text() == "x"  # no second child


@pytest.mark.parametrize("slot, workers, visible, preallocate", [
    (0, 2, "0", None), (1, 2, "1", None),  # one worker per GPU, each preallocating its own
    (3, 4, "1", "false"),                   # more workers than GPUs: shared round-robin, no preallocation
])
def test_each_gpu_worker_sees_its_own_device(slot, workers, visible, preallocate):
    env = worker_environment({"PATH": "/bin"}, slot, workers, GPUS)
    assert env["JAX_CUDA_VISIBLE_DEVICES"] == env["JAX_ROCM_VISIBLE_DEVICES"] == visible
    assert env.get("XLA_PYTHON_CLIENT_PREALLOCATE") == preallocate and env["PATH"] == "/bin"


def test_the_users_own_devices_and_settings_are_kept():
    """Ids are the devices the user's CUDA_VISIBLE_DEVICES left, as the probe saw them; their preallocation wins."""
    env = worker_environment({"XLA_PYTHON_CLIENT_PREALLOCATE": "true"}, 0, 3, Accelerators("gpu", (2, 3)))
    assert env["JAX_CUDA_VISIBLE_DEVICES"] == "2" and env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"
    for accelerators in (None, Accelerators("tpu", (0, 1, 2, 3))):
        assert worker_environment({"A": "1"}, 1, 2, accelerators) == {"A": "1"}


@pytest.mark.parametrize("accelerators, flags, layout", [
    (Accelerators("gpu", (0, 1, 2, 3)), (None, None), (4, 0, "one process per accelerator: 4 gpu devices")),
    (Accelerators("gpu", (0,)), (None, None), (1, 0, "one process per accelerator: 1 gpu device")),
    (Accelerators("tpu", tuple(range(8))), (None, None), (1, 0, "one process per accelerator: 8 tpu devices")),
    (Accelerators("gpu", (0, 1)), (None, 4), (2, 4, "from the command line")),
    (Accelerators("gpu", (0, 1)), (3, None), (3, 0, "from the command line")),
])
def test_the_layout_on_accelerators_is_one_process_per_gpu(monkeypatch, accelerators, flags, layout):
    monkeypatch.setattr(launch, "local_accelerators", lambda: accelerators)
    assert launch.choose_layout(*flags) == layout


def test_a_pool_on_gpus_starts_each_worker_with_its_device(monkeypatch, tmp_path):
    monkeypatch.setattr("jaxformer.sweep.executors.local_accelerators", lambda: GPUS)
    pool = LocalPool(2, 0, tmp_path)
    assert [worker.env["JAX_CUDA_VISIBLE_DEVICES"] for worker in pool.workers] == ["0", "1"]
    assert all(worker.process is None for worker in pool.workers)  # started on first use, none here


@pytest.mark.parametrize("resources, cpus, gpus_per_run, count", [
    ({"CPU": 16.0}, 1, 0.0, 16),                  # CPU actors: one per CPU
    ({"CPU": 16.0, "GPU": 1.0}, 1, 1.0, 1),       # one GPU: one actor, not 16 of which 15 never start
    ({"CPU": 64.0, "GPU": 8.0}, 4, 0.5, 16),      # two actors per GPU, CPUs to spare
    ({"CPU": 8.0, "GPU": 8.0}, 2, 1.0, 4),        # CPUs run out first
])
def test_ray_starts_only_the_actors_the_cluster_holds(resources, cpus, gpus_per_run, count):
    assert ray_actor_count([resources], cpus, gpus_per_run) == count


@pytest.mark.parametrize("saved, layout", [
    ('{"processes": 1, "threads": 0}', (1, 0, "fastest in `jaxformer bench train --layout`, {file}")),
    ('{"processes": 2, "threads": 1, "measured": "extra keys kept"}',
     (2, 1, "fastest in `jaxformer bench train --layout`, {file}")),
    # damaged: each once trained nothing (0 processes: "queued 4", exit 0) or stopped the sweep in a line naming
    # no file; as the other per-machine caches, a damaged one counts as not measured
    ('{"processes": 0, "threads": -1}', None),
    ('{"processes": true, "threads": 1}', None),
    ('{"processes": 2.5, "threads": 1}', None),
    ('{"processes": 2', None),
    ('[2, 1]', None),
    (None, None),
])
def test_a_cpu_layout_is_the_measured_one_where_it_is_usable_else_one_run_per_core(monkeypatch, tmp_path, saved,
                                                                                    layout):
    file = tmp_path / "layout.json"
    if saved is not None:
        file.write_text(saved)
    monkeypatch.setattr("jaxformer.runtime.LAYOUT_FILE", file)
    monkeypatch.setattr(launch, "local_accelerators", lambda: None)
    monkeypatch.setattr(launch.os, "cpu_count", lambda: 6)
    default = "default one single-threaded run per core{}; measure with `jaxformer bench train --layout`"
    if layout is None:
        layout = (6, 1, default.format(f" ({file} holds no usable layout)" if saved is not None else ""))
    assert launch.choose_layout(None, None) == (*layout[:2], layout[2].format(file=file))


@pytest.mark.parametrize("flags, layout", [
    ((3, None), (3, 1, "from the command line")),  # single-threaded runs, as many as asked
    ((None, 2), (6, 2, "from the command line")),  # one run per core, of two threads each
    ((2, 0), (2, 0, "from the command line")),  # threads 0: no limit
])
def test_a_cpu_layout_from_the_command_line_fills_in_what_it_leaves_out(monkeypatch, flags, layout):
    monkeypatch.setattr(launch, "local_accelerators", lambda: None)
    monkeypatch.setattr(launch.os, "cpu_count", lambda: 6)
    assert launch.choose_layout(*flags) == layout


def test_a_ray_address_is_checked_at_its_own_host_and_port():
    """A TCP connection to ``[ray://]host:port`` before Ray is asked (Ray retries for minutes): a listener on
    127.0.0.2 is reached there, not at 127.0.0.1; an empty host is 127.0.0.1."""
    import socket

    from jaxformer.sweep.executors import _check_reachable

    for host in ("127.0.0.2", "127.0.0.1"):
        with socket.create_server((host, 0)) as server:
            port = server.getsockname()[1]
            for address in (f"{host}:{port}", f"ray://{host}:{port}") + ((f":{port}",) if host == "127.0.0.1" else ()):
                _check_reachable(address)
    with pytest.raises(ValueError, match=rf"^cannot reach Ray at --ray-address '127.0.0.1:{port}': "):
        _check_reachable(f"127.0.0.1:{port}", timeout_s=1.0)  # its listener closed
