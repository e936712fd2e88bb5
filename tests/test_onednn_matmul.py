"""The oneDNN matmul (``kernel.matmul_impl: onednn``), bf16 and fp32, against ``jnp.matmul``: values, gradients,
sharding, train steps, fallback."""

import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxformer.functional as F
from jaxformer.functional import onednn_matmul
from model_helpers import run_python, train_losses

def _bf16(shape, seed):
    return jax.random.normal(jax.random.key(seed), shape).astype(jnp.bfloat16)


def _targets(fn, *args) -> bool:
    return onednn_matmul.TARGET in str(jax.make_jaxpr(fn)(*args))


def _takes(dtype) -> bool:
    """Whether oneDNN multiplies ``dtype`` operands on this CPU (fp32 always; bf16 not on an AVX2-only CPU)."""
    return onednn_matmul.unsupported_reason(dtype) is None


@pytest.fixture(scope="module")
def kernel():
    assert onednn_matmul.onednn_available(), onednn_matmul.unavailable_reason()
    assert _takes(jnp.float32), onednn_matmul.unsupported_reason(jnp.float32)


@pytest.fixture(scope="module")
def dtype(kernel) -> str:
    """The operands of the dtype-agnostic tests (sharding, the peak): bf16 where oneDNN multiplies it, else fp32."""
    return "bfloat16" if _takes(jnp.bfloat16) else "float32"


def test_matmul_equals_jnp_matmul(kernel):
    """fp32 results equal XLA's fp32 sums of the same bf16 products; bf16 results are those rounded. A CPU without
    oneDNN's bf16 matmul says so."""
    x, w = _bf16((37, 19), 0), _bf16((19, 23), 1)
    if not _takes(jnp.bfloat16):
        with pytest.raises(ValueError, match="no bfloat16 matmul for this CPU"):
            onednn_matmul.matmul(x, w, jnp.float32)
        return
    reference = jnp.matmul(x, w, preferred_element_type=jnp.float32)
    fp32 = onednn_matmul.matmul(x, w, jnp.float32)
    assert fp32.dtype == jnp.float32 and fp32.shape == (37, 23)
    np.testing.assert_allclose(fp32, reference, rtol=1e-5, atol=1e-5)
    bf16 = jax.jit(onednn_matmul.matmul)(x, w)
    assert bf16.dtype == jnp.bfloat16
    np.testing.assert_array_equal(bf16.astype(jnp.float32), reference.astype(jnp.bfloat16).astype(jnp.float32))
    with pytest.raises(ValueError, match="out_dtype"):
        onednn_matmul.matmul(x, w, jnp.float16)


def test_fp32_matmul_equals_jnp_matmul_with_every_transpose(kernel):
    """fp32 operands: the product and both gradient calls (transposes as strides) equal XLA's fp32 dots."""
    x = jax.random.normal(jax.random.key(5), (37, 19))
    w = jax.random.normal(jax.random.key(6), (19, 23))
    out = jax.jit(onednn_matmul.matmul, static_argnums=2)(x, w, jnp.float32)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, x @ w, rtol=1e-5, atol=1e-5)
    g = jax.random.normal(jax.random.key(7), (37, 23))
    grads = jax.grad(lambda x, w: jnp.sum(onednn_matmul.matmul(x, w, jnp.float32) * g), argnums=(0, 1))(x, w)
    assert all(grad.dtype == jnp.float32 for grad in grads)
    np.testing.assert_allclose(grads[0], g @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grads[1], x.T @ g, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="bfloat16 from bf16 operands"):
        onednn_matmul.matmul(x, w, jnp.bfloat16)


@pytest.mark.parametrize("out_dtype", [jnp.bfloat16, jnp.float32])
def test_gradients_equal_the_plain_path(kernel, out_dtype):
    """dx = dy·wᵀ and dw = xᵀ·dy (the transposed calls) against jnp.matmul's gradients, to bf16 rounding."""
    x, w = _bf16((3, 29, 40), 2), _bf16((40, 24), 3)
    g = jax.random.normal(jax.random.key(4), (3, 29, 24))

    def loss(impl):
        return jax.jit(jax.grad(lambda x, w: jnp.sum(F.dense(x, w, impl=impl, preferred_element_type=out_dtype)
                                                     .astype(jnp.float32) * g), argnums=(0, 1)))

    assert _targets(jax.grad(lambda x, w: jnp.sum(F.dense(x, w, impl="onednn")), argnums=(0, 1)), x, w) == \
        _takes(jnp.bfloat16)
    for grad, grad_ref in zip(loss("onednn")(x, w), loss("xla")(x, w)):
        assert grad.dtype == jnp.bfloat16
        scale = float(jnp.max(jnp.abs(grad_ref.astype(jnp.float32))))
        np.testing.assert_allclose(grad.astype(jnp.float32), grad_ref.astype(jnp.float32), atol=scale * 2 ** -7)


def test_dense_routes_bf16_and_fp32_products(kernel):
    """bf16 and fp32 products go to oneDNN; mixed operands, a bf16 result of fp32 operands and preferred types
    other than bf16/fp32 stay with XLA, and so do bf16 products on a CPU without oneDNN's bf16 matmul; a wrong
    impl names the field."""
    x32, w32 = jax.random.normal(jax.random.key(0), (2, 5, 4, 8)), jax.random.normal(jax.random.key(1), (4, 8, 6))
    onednn = lambda x, w: F.dense(x, w, in_axes=2, impl="onednn")  # noqa: E731
    assert _targets(onednn, x32, w32)
    np.testing.assert_allclose(onednn(x32, w32), F.dense(x32, w32, in_axes=2), rtol=1e-5, atol=1e-5)
    x, w = x32.astype(jnp.bfloat16), w32.astype(jnp.bfloat16)
    assert _targets(onednn, x, w) == _takes(jnp.bfloat16)
    assert onednn(x, w).shape == (2, 5, 6)
    assert not _targets(onednn, x32, w)
    assert not _targets(lambda x, w: F.dense(x, w, in_axes=2, impl="onednn", preferred_element_type=jnp.bfloat16),
                        x32, w32)
    assert not _targets(lambda x, w: F.dense(x, w, in_axes=2, impl="onednn", preferred_element_type=jnp.float16), x, w)
    with pytest.raises(ValueError, match="matmul_impl must be one of"):
        F.dense(x, w, in_axes=2, impl="mkl")


def test_vmap_and_second_derivatives_equal_the_xla_path(kernel):
    """fp32 ``dense``: vmapped (one call on the folded rows when only the input is mapped, one call per entry
    otherwise), per-example gradients, jacrev, grad of grad and jvp of grad (the calls differentiated as
    ``jnp.matmul``) equal XLA's."""
    rng = np.random.default_rng(0)
    x, w = jnp.asarray(rng.standard_normal((3, 5, 8), np.float32)), jnp.asarray(rng.standard_normal((8, 6), np.float32))
    ws = jnp.stack([w, 2 * w, -w])

    def sin_sum(f):
        return lambda x, w: jnp.sum(jnp.sin(f(x, w)))

    transforms = {
        "vmap of inputs": lambda f: jax.vmap(f, in_axes=(0, None))(x, w),
        "vmap of inputs and weights": lambda f: jax.vmap(f)(x, ws),
        "vmap of weights": lambda f: jax.vmap(f, in_axes=(None, 0))(x[0], ws),
        "vmap of grad": lambda f: jax.vmap(jax.grad(sin_sum(f), argnums=(0, 1)))(x, ws),
        "jacrev": lambda f: jax.jacrev(f, argnums=(0, 1))(x[0], w),
        "grad of grad": lambda f: jax.grad(lambda x, w: jnp.sum(jnp.sin(jax.grad(sin_sum(f), argnums=1)(x, w))),
                                           argnums=(0, 1))(x, w),
        "jvp of grad": lambda f: jax.jvp(jax.grad(sin_sum(f), argnums=(0, 1)), (x, w), (0.5 * x, -w)),
    }
    onednn, xla = (jax.jit(lambda impl=impl: {name: transform(lambda x, w: F.dense(x, w, impl=impl))
                                              for name, transform in transforms.items()}) for impl in ("onednn", "xla"))
    assert onednn_matmul.TARGET in str(jax.make_jaxpr(onednn)())
    got, want = onednn(), xla()
    for name in transforms:
        for got_leaf, want_leaf in zip(jax.tree.leaves(got[name]), jax.tree.leaves(want[name])):
            scale = max(1.0, float(jnp.max(jnp.abs(want_leaf))))  # oneDNN's fp32 sums are XLA's to rounding
            np.testing.assert_allclose(got_leaf, want_leaf, rtol=0, atol=1e-5 * scale, err_msg=name)


def test_empty_contractions_and_batches_give_zeros_through_the_kernel(kernel):
    """A zero-length contraction (``x [4, 0]``, ``w [0, 5]``) is an empty sum; no rows, no columns: empty results."""
    for x_shape, w_shape, in_axes in (((4, 0), (0, 5), 1), ((2, 3, 0, 2), (0, 2, 5), 2), ((0, 8), (8, 5), 1),
                                      ((4, 8), (8, 0), 1)):
        x, w = jnp.ones(x_shape), jnp.ones(w_shape)
        onednn = lambda x, w, in_axes=in_axes: F.dense(x, w, in_axes=in_axes, impl="onednn")  # noqa: E731
        assert _targets(onednn, x, w), x_shape
        np.testing.assert_array_equal(onednn(x, w), jnp.tensordot(x, w, in_axes))


@pytest.mark.parametrize("component, products", [("mlm head", 2), ("pooler", 1), ("moe", 6)])
def test_the_mlm_head_pooler_and_experts_compute_with_the_setting(kernel, component, products):
    """``kernel.matmul_impl: onednn`` reaches BERT's head (transform and vocabulary products), its pooler and the
    experts (routed and shared: in, gate, out each): one kernel call per product, fp32 values equal XLA's."""
    from flax import nnx

    from jaxformer.kernel import KernelConfig
    from jaxformer.models import ModelConfig, build_model

    cfg = ModelConfig(family="encoder", vocab_size=64, d_model=32, num_layers=1, num_heads=4, max_seq_len=16,
                      tie_embeddings=False, use_bias=True, pooler=True, activation="swiglu", num_experts=4,
                      experts_per_token=2, expert_d_ff=16, num_shared_experts=1)
    x_BTE = jax.random.normal(jax.random.key(0), (2, 8, 32))
    outputs = {}
    for impl in ("xla", "onednn"):
        model = build_model(cfg, rngs=nnx.Rngs(0), kernel=KernelConfig(matmul_impl=impl))  # the same parameters
        layer = {"mlm head": lambda x, m=model: m.head(x, m.embedding), "pooler": model.pooler,
                 "moe": lambda x, m=model: m.encoder.blocks[0].feed_forward(x)[0]}[component]
        assert str(jax.make_jaxpr(layer)(x_BTE)).count(onednn_matmul.TARGET) == (impl == "onednn") * products
        outputs[impl] = layer(x_BTE)
    np.testing.assert_allclose(outputs["onednn"], outputs["xla"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype, rtol", [("bfloat16", 1e-2), ("float32", 1e-5)])
def test_train_steps_equal_the_xla_path(kernel, dtype, rtol):
    """A model trained four steps with each impl: the same losses (to bf16 precision for bf16 compute, fp32's
    for fp32), fp32 masters."""
    losses = {}
    for impl in ("xla", "onednn"):
        losses[impl], state, calls = train_losses([f"train.compute_dtype={dtype}", f"kernel.matmul_impl={impl}"],
                                                  target=onednn_matmul.TARGET)
        assert calls == (impl == "onednn" and _takes(dtype))
        assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(state["params"]))
    np.testing.assert_allclose(losses["onednn"], losses["xla"], rtol=rtol)
    assert losses["onednn"][-1] < losses["onednn"][0]


def test_data_parallel_mesh_runs_each_share_and_sums_the_weight_gradient(dtype):
    """Two CPU devices, rows sharded: the products run on each half (no all-gather), the weight gradient is
    summed across devices, and everything equals the single-device result."""
    done = run_python("""
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import NamedSharding, PartitionSpec
        import jaxformer.functional as F
        mesh = jax.make_mesh((2,), ("data",))
        rows, replicated = NamedSharding(mesh, PartitionSpec("data")), NamedSharding(mesh, PartitionSpec())
        x = jax.random.normal(jax.random.key(0), (4, 16, 32)).astype(DTYPE)
        w = jax.random.normal(jax.random.key(1), (32, 24)).astype(DTYPE)
        def loss(impl):
            return jax.jit(jax.value_and_grad(lambda x, w: jnp.sum(jnp.sin(
                F.dense(x, w, impl=impl).astype(jnp.float32))), argnums=(0, 1)))
        sharded = (jax.device_put(x, rows), jax.device_put(w, replicated))
        hlo = loss("onednn").lower(*sharded).compile().as_text()
        assert "jaxformer_onednn_matmul" in hlo and "all-gather" not in hlo and "all-reduce" in hlo, hlo
        (value, grads), (value_one, grads_one) = loss("onednn")(*sharded), loss("onednn")(x, w)
        (_, grads_xla) = loss("xla")(x, w)
        np.testing.assert_allclose(value, value_one, rtol=1e-5)
        for grad, grad_one, grad_xla in zip(grads, grads_one, grads_xla):
            np.testing.assert_allclose(grad.astype(np.float32), grad_one.astype(np.float32), rtol=2 ** -7, atol=1e-2)
            scale = float(jnp.max(jnp.abs(grad_xla.astype(jnp.float32))))
            np.testing.assert_allclose(grad.astype(np.float32), grad_xla.astype(np.float32), atol=scale * 2 ** -7)
        assert grads[0].sharding.is_equivalent_to(rows, 3)
        print("sharded ok")
    """.replace("DTYPE", repr(dtype)), {"XLA_FLAGS": os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2",
          "JAX_PLATFORMS": "cpu"})
    assert "sharded ok" in done.stdout


def test_tensor_parallel_shardings_split_columns_and_sum_rows(dtype):
    """A (data, model) mesh of four devices: a column-parallel weight keeps its output columns sharded, a
    row-parallel one sums its partial products over the model axis; both equal the unsharded product."""
    done = run_python("""
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import NamedSharding, PartitionSpec as P
        import jaxformer.functional as F
        mesh = jax.make_mesh((2, 2), ("data", "model"))
        x = jax.random.normal(jax.random.key(0), (8, 16)).astype(DTYPE)
        w = jax.random.normal(jax.random.key(1), (16, 12)).astype(DTYPE)
        reference = jnp.matmul(x, w, preferred_element_type=jnp.float32)
        product = jax.jit(lambda x, w: F.dense(x, w, impl="onednn", preferred_element_type=jnp.float32))
        for x_spec, w_spec, out_spec, collective in ((P("data", None), P(None, "model"), P("data", "model"), None),
                                                     (P("data", "model"), P("model", None), P("data", None),
                                                      "all-reduce")):
            args = (jax.device_put(x, NamedSharding(mesh, x_spec)), jax.device_put(w, NamedSharding(mesh, w_spec)))
            hlo = product.lower(*args).compile().as_text()
            assert "jaxformer_onednn_matmul" in hlo and "all-gather" not in hlo, hlo
            assert collective is None or collective in hlo, hlo
            out = product(*args)
            assert out.sharding.is_equivalent_to(NamedSharding(mesh, out_spec), 2), (out.sharding, out_spec)
            np.testing.assert_allclose(out, reference, rtol=1e-5, atol=1e-4)
        print("tensor parallel ok")
    """.replace("DTYPE", repr(dtype)), {"XLA_FLAGS": os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4",
          "JAX_PLATFORMS": "cpu"})
    assert "tensor parallel ok" in done.stdout


def test_missing_library_falls_back_to_xla_with_one_warning(tmp_path):
    """The loader pointed at a library that does not exist: ``onednn`` computes with jnp.matmul, and says so once."""
    done = run_python("""
        import warnings
        import jax, jax.numpy as jnp, numpy as np
        import jaxformer.functional as F
        from jaxformer.functional import onednn_matmul
        x = jax.random.normal(jax.random.key(0), (6, 8)).astype(jnp.bfloat16)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                np.testing.assert_array_equal(F.dense(x, x.T, impl="onednn"), F.dense(x, x.T))
        messages = [str(w.message) for w in caught if "oneDNN matmul is unavailable" in str(w.message)]
        assert len(messages) == 1, messages
        assert "absent" in onednn_matmul.unavailable_reason()
        assert onednn_matmul.TARGET not in str(jax.make_jaxpr(lambda x: F.dense(x, x.T, impl="onednn"))(x))
        print("fallback ok")
    """, {onednn_matmul.LIBRARY_ENV: str(tmp_path / "absent" / "onednn_matmul.so")})
    assert "fallback ok" in done.stdout


def test_a_cpu_without_bf16_matmul_falls_back_for_bf16_only(tmp_path):
    """oneDNN held to AVX2 (``ONEDNN_MAX_CPU_ISA``, as on an AVX2-only CPU): bf16 products compute with XLA (the
    values equal, no kernel call), a direct bf16 call and ``auto``'s candidates say why, fp32 still goes to
    oneDNN, and `bench train` notes which rows time XLA."""
    done = run_python("""
        import jax, jax.numpy as jnp, numpy as np
        import jaxformer.functional as F
        from jaxformer.functional import onednn_matmul
        from jaxformer.train import matmul_choice
        from jaxformer.train.config import load_config
        reason = onednn_matmul.unsupported_reason(jnp.bfloat16)
        assert reason == "oneDNN has no bfloat16 matmul for this CPU's instruction set", reason
        assert onednn_matmul.unsupported_reason(jnp.float32) is None
        x = jax.random.normal(jax.random.key(0), (6, 8))
        onednn = lambda x: F.dense(x, x.T, impl="onednn")
        for operands, routed in ((x, True), (x.astype(jnp.bfloat16), False)):
            assert (onednn_matmul.TARGET in str(jax.make_jaxpr(onednn)(operands))) == routed
            np.testing.assert_allclose(onednn(operands), F.dense(operands, operands.T), rtol=1e-6)
        try:
            onednn_matmul.matmul(x.astype(jnp.bfloat16), x.T.astype(jnp.bfloat16))
            raise AssertionError("a bf16 call without the kernel did not say so")
        except ValueError as error:
            assert str(error) == "onednn matmul: " + reason, error
        assert matmul_choice.candidates(load_config(None, ["train.compute_dtype=bfloat16"])) == (["xla"], reason)
        assert matmul_choice.candidates(load_config(None, ["train.compute_dtype=float32"]))[0] == ["xla", "onednn"]
        print("bf16 fallback ok")
    """, {"ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert "bf16 fallback ok" in done.stdout
    done = subprocess.run([sys.executable, "-m", "jaxformer.cli", "bench", "train", "--sizes", "16:1:16", "--batch", "2",
                           "--dtypes", "bfloat16", "--matmul-impl", "onednn", "--no-torch", "--steps", "1",
                           "--repeats", "1"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "bfloat16 rows time XLA's matmul: oneDNN has no bfloat16 matmul" in done.stdout


def test_bench_says_when_the_kernel_is_unavailable(tmp_path):
    done = subprocess.run([sys.executable, "-m", "jaxformer.cli", "bench", "train", "--sizes", "16:1:16", "--batch", "2",
                           "--dtypes", "bfloat16", "--matmul-impl", "onednn", "--no-torch", "--steps", "1",
                           "--repeats", "1"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, onednn_matmul.LIBRARY_ENV: str(tmp_path / "missing.so")})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "oneDNN matmul unavailable, so jaxformer's rows time XLA's matmul" in done.stdout


def test_machine_peak_is_probed_and_kept_per_matmul(dtype, tmp_path):
    """MFU of a oneDNN run is measured against oneDNN's own peak, cached apart from XLA's."""
    import json

    from jaxformer.train.peak import machine_key, machine_peak_flops

    path = tmp_path / "peak.json"
    peak = machine_peak_flops(dtype, path, impl="onednn")
    assert peak > 1e9
    assert json.loads(path.read_text()) == {machine_key(dtype) + " | onednn": peak}
    assert machine_peak_flops(dtype, path, impl="onednn") == peak  # read back, not probed again


def test_profile_classes_the_kernel_call_as_a_matmul(kernel):
    """`bench profile` counts the oneDNN call's time as matmul time, the attention kernel's call as other."""
    from jaxformer.benchmarks.profile import op_classes

    x = jax.random.normal(jax.random.key(0), (8, 16))
    hlo = jax.jit(lambda x: jnp.tanh(F.dense(x, x.T, impl="onednn"))).lower(x).compile().as_text()
    calls = [re.search(r"%([\w.\-]+) = ", line).group(1) for line in hlo.splitlines() if onednn_matmul.TARGET in line
             and " custom-call(" in line]
    assert calls and all(op_classes(hlo)[name] == "matmul" for name in calls)
