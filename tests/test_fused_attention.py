"""The fused C++ attention kernel (``impl="fused"``) against the plain path: values, gradients, train step, fallback."""

import os
import shutil
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxformer.functional as F
from jaxformer.functional import fused_attention
from jaxformer.functional.extension import cpu_flags
from model_helpers import run_python, tiny, train_losses

TOL = 1e-5  # fp32: the kernel re-associates the sums and uses a polynomial exp

needs_kernel = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None and
                                  not os.environ.get(fused_attention.LIBRARY_ENV),
                                  reason="no C++ compiler to build the fused kernel")


@pytest.fixture(scope="module")
def kernel():
    assert fused_attention.fused_available(), fused_attention.unavailable_reason()


def _inputs(B, T, S, H, K, D, seed=0):
    """q, k, v and an output cotangent, from numpy's generator (jax.random compiles a program per shape)."""
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.standard_normal(shape, np.float32))
                 for shape in ((B, T, H, D), (B, S, K, D), (B, S, K, D), (B, T, H, D)))


def _targets(fn, *args) -> set[str]:
    """The FFI targets a function's jaxpr calls (descending into custom_vjp and jit bodies)."""
    text = str(jax.make_jaxpr(fn)(*args))
    return {name for name in (fused_attention.FORWARD_TARGET, fused_attention.BACKWARD_TARGET) if name in text}


# (B, T, S, H, K, D) and the arguments: odd and ragged lengths, several key tiles (64) and query blocks (32)
CASES = {
    "causal_mha_d16_odd": ((2, 13, 13, 4, 4, 16), dict(causal=True)),
    "causal_gqa_d32_odd": ((2, 13, 13, 4, 2, 32), dict(causal=True)),
    "bidirectional_mqa_d16": ((2, 13, 13, 4, 1, 16), dict()),
    "causal_gqa_d32_multi_tile": ((1, 150, 150, 4, 2, 32), dict(causal=True)),
    "bidirectional_gqa_d32_multi_tile": ((1, 100, 100, 2, 1, 32), dict()),
    "cross_attention_d16": ((2, 5, 70, 2, 2, 16), dict()),
    "decode_offset_d32": ((2, 3, 14, 4, 2, 32), dict(causal=True, q_offset=11)),
    "padded_head_dim_scale": ((2, 13, 13, 2, 2, 20), dict(causal=True, scale=0.5)),
    "causal_mha_d64_two_tiles": ((1, 70, 70, 2, 2, 64), dict(causal=True)),
    # every head-dim vector count the kernel compiles: 1, 6, 12 and 16 vectors of 8 floats (with 16 to 64 above)
    "causal_mha_d8": ((2, 13, 13, 2, 2, 8), dict(causal=True)),
    "causal_gqa_d48": ((1, 70, 70, 4, 2, 48), dict(causal=True)),
    "bidirectional_mha_d96": ((1, 20, 20, 2, 2, 96), dict()),
    "causal_mha_d128": ((1, 70, 70, 2, 2, 128), dict(causal=True)),
    # a saturated softmax (one key takes every row): dq = dk = 0 exactly by the reference, as by the kernel only when
    # its Δ = rowsum(dO∘O) rounds as its dP does (else the scale multiplies the rounding: 1e-2 here)
    "saturated_causal_cross_d8": ((1, 9, 70, 2, 1, 8), dict(causal=True, scale=1e4)),
}


@needs_kernel
@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_matches_naive_values_and_gradients(kernel, case):
    shape, kwargs = CASES[case]
    q, k, v, cotangent = _inputs(*shape)

    def out_and_grads(impl):
        def loss(q, k, v):
            out = F.attention(q, k, v, impl=impl, **kwargs)
            return jnp.sum(out * cotangent), out
        return jax.grad(loss, argnums=(0, 1, 2), has_aux=True)

    fused_fn = out_and_grads("fused")
    assert _targets(fused_fn, q, k, v) == {fused_attention.FORWARD_TARGET, fused_attention.BACKWARD_TARGET}
    grads, out = jax.jit(fused_fn)(q, k, v)
    grads_ref, out_ref = jax.jit(out_and_grads("naive"))(q, k, v)
    np.testing.assert_allclose(out, out_ref, atol=TOL, rtol=0, err_msg="output")
    for name, grad, grad_ref in zip("qkv", grads, grads_ref):
        np.testing.assert_allclose(grad, grad_ref, atol=TOL, rtol=0, err_msg=f"d{name}")


@needs_kernel
def test_avx2_build_matches_naive(tmp_path, kernel):
    """The kernel built without AVX-512 (16 vector registers, so smaller register blocks than this machine's
    default build where it has AVX-512) passes the same value and gradient cases, in a process that loads it.
    On a CPU without AVX-512 it is the default build, byte for byte, which the other tests here load."""
    library = fused_attention.EXTENSION.build(tmp_path / "fused_attention_avx2.so", ("-mno-avx512f",))
    if "avx512f" not in cpu_flags().split() and not os.environ.get(fused_attention.LIBRARY_ENV):
        assert library.read_bytes() == fused_attention.EXTENSION.library_path().read_bytes()
        return
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"{__file__}::test_fused_matches_naive_values_and_gradients"],
                          capture_output=True, text=True, timeout=600, cwd=os.path.dirname(__file__),
                          env={**os.environ, fused_attention.LIBRARY_ENV: str(library)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(CASES)} passed" in done.stdout, done.stdout


@needs_kernel
def test_bf16_inputs_compute_in_fp32(kernel):
    """bf16 q, k, v: the fp32 kernel on the upcast inputs, rounded back to bf16 (values and gradients), and
    the naive bf16 path's numbers to bf16 precision."""
    q, k, v, cotangent = (x.astype(jnp.bfloat16) for x in _inputs(2, 13, 13, 4, 2, 16))

    def out_and_grads(impl, dtype):
        def loss(q, k, v):
            out = F.attention(*(x.astype(dtype) for x in (q, k, v)), impl=impl, causal=True)
            return jnp.sum(out.astype(jnp.float32) * cotangent), out
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))

    assert _targets(out_and_grads("fused", jnp.bfloat16), q, k, v) == {fused_attention.FORWARD_TARGET,
                                                                        fused_attention.BACKWARD_TARGET}
    grads, out = out_and_grads("fused", jnp.bfloat16)(q, k, v)
    grads_fp32, out_fp32 = out_and_grads("fused", jnp.float32)(q, k, v)
    grads_naive, out_naive = out_and_grads("naive", jnp.bfloat16)(q, k, v)
    assert out.dtype == jnp.bfloat16 and all(grad.dtype == jnp.bfloat16 for grad in grads)
    np.testing.assert_array_equal(out, out_fp32.astype(jnp.bfloat16))
    np.testing.assert_allclose(out.astype(jnp.float32), out_naive.astype(jnp.float32), atol=2 ** -6)
    for grad, grad_fp32, grad_naive in zip(grads, grads_fp32, grads_naive):
        scale = float(jnp.max(jnp.abs(grad_fp32)))
        np.testing.assert_allclose(grad.astype(jnp.float32), grad_fp32, atol=scale * 2 ** -8)
        np.testing.assert_allclose(grad.astype(jnp.float32), grad_naive.astype(jnp.float32), atol=scale * 2 ** -5)


@needs_kernel
def test_fused_ignores_query_blocks_and_takes_unbatched_inputs(kernel):
    q, k, v, _ = _inputs(1, 13, 13, 2, 1, 16)
    reference = F.attention(q, k, v, causal=True, query_block_size=4)
    np.testing.assert_allclose(F.attention(q, k, v, impl="fused", causal=True, query_block_size=4), reference, atol=TOL)
    np.testing.assert_allclose(F.attention(q[0], k[0], v[0], impl="fused", causal=True), reference[0], atol=TOL)


@needs_kernel
def test_unsupported_arguments_take_the_plain_path(kernel):
    """Key lengths, windows, biases, fp16 and a traced offset are the plain path's: same numbers, no FFI call."""
    q, k, v, _ = _inputs(2, 9, 9, 2, 1, 16)
    for kwargs in (dict(key_lengths=jnp.array([9, 4])), dict(window=3), dict(causal=True, alibi_slopes=F.alibi_slopes(2))):
        fused = lambda q, k, v, kwargs=kwargs: F.attention(q, k, v, impl="fused", **kwargs)
        assert _targets(fused, q, k, v) == set(), kwargs
        np.testing.assert_allclose(fused(q, k, v), F.attention(q, k, v, **kwargs), atol=TOL, err_msg=str(kwargs))
    fp16 = [x.astype(jnp.float16) for x in (q, k, v)]
    assert _targets(lambda *x: F.attention(*x, impl="fused"), *fp16) == set()
    traced = lambda q, k, v, offset: F.attention(q, k, v, impl="fused", causal=True, q_offset=offset)
    assert _targets(traced, q, k, v, 0) == set()


@needs_kernel
def test_train_step_with_fused_attention_equals_naive(kernel):
    losses = {}
    for impl in ("naive", "fused"):
        losses[impl], _, calls = train_losses([f"kernel.attention_impl={impl}"], target=fused_attention.BACKWARD_TARGET)
        assert calls == (impl == "fused")
    np.testing.assert_allclose(losses["fused"], losses["naive"], rtol=1e-5)
    assert losses["naive"][-1] < losses["naive"][0]  # the steps train


def _assert_fused_equals_naive(results) -> None:
    """``results(impl)`` (a dict of named result trees) jitted for fused and naive: the fused program calls both
    kernels, and every leaf of every result equals naive's."""
    fused, naive = (jax.jit(lambda impl=impl: results(impl)) for impl in ("fused", "naive"))
    assert _targets(fused) == {fused_attention.FORWARD_TARGET, fused_attention.BACKWARD_TARGET}
    got, want = fused(), naive()
    assert set(got) == set(want)
    for name in got:
        for got_leaf, want_leaf in zip(jax.tree.leaves(got[name]), jax.tree.leaves(want[name]), strict=True):
            np.testing.assert_allclose(got_leaf, want_leaf, atol=TOL, rtol=0, err_msg=name)


@needs_kernel
def test_vmap_and_jacrev_equal_naive(kernel):
    """``jax.vmap`` runs the kernel once on the batch the mapped axis folds into, whichever operands are mapped."""
    q, k, v, _ = _inputs(2, 7, 9, 4, 2, 8)

    def attend(impl):
        return lambda q, k, v: F.attention(q, k, v, impl=impl, causal=True, q_offset=2)

    def sin_sum(f):
        return lambda *args: jnp.sum(jnp.sin(f(*args)))

    transforms = {
        "vmap": lambda f: jax.vmap(f)(q, k, v),
        "vmap of grad": lambda f: jax.vmap(jax.grad(sin_sum(f), argnums=(0, 1, 2)))(q, k, v),
        "grad of vmap, k and v unmapped": lambda f: jax.grad(sin_sum(jax.vmap(f, in_axes=(0, None, None))),
                                                             argnums=(0, 1, 2))(q, k[0], v[0]),
        "jacrev": lambda f: jax.jacrev(f, argnums=(0, 1, 2))(q[:1, :3], k[:1], v[:1]),
        "vmap over an empty axis": lambda f: jax.vmap(f)(q[:0, None], k[:0, None], v[:0, None]),  # [0, 1, 7, 4, 8]
    }
    _assert_fused_equals_naive(lambda impl: {name: transform(attend(impl)) for name, transform in transforms.items()})


@needs_kernel
def test_second_derivatives_equal_naive(kernel):
    """grad of grad, and jvp of grad (a Hessian-vector product), differentiate the kernel's calls as their plain-JAX
    references. (Forward mode of the attention itself is not JAX's to give: jvp of a custom_vjp raises.)"""
    q, k, v, cotangent = _inputs(2, 7, 9, 4, 2, 8)

    def grads(impl):
        loss = lambda q, k, v: jnp.sum(jnp.sin(F.attention(q, k, v, impl=impl, causal=True, q_offset=2)) * cotangent)
        return jax.grad(loss, argnums=(0, 1, 2))

    def derivatives(impl):
        grad_of_grad = jax.grad(lambda *x: sum(jnp.sum(jnp.sin(g)) for g in grads(impl)(*x)), argnums=(0, 1, 2))
        return {"grad of grad": grad_of_grad(q, k, v),
                "jvp of grad": jax.jvp(grads(impl), (q, k, v), (cotangent, 0.5 * k, -v))}

    _assert_fused_equals_naive(derivatives)


@needs_kernel
def test_vmap_of_a_model_with_fused_attention_equals_naive(kernel):
    """`jaxformer.models.pure.apply` under ``jax.vmap`` (stacked micro-batches), fused as naive. The parameters are
    drawn by numpy into the model's shapes (its own initialiser compiles a program per shape)."""
    from flax import nnx

    from jaxformer.kernel import KernelConfig
    from jaxformer.models import build_model
    from jaxformer.models.pure import apply

    rng = np.random.default_rng(0)
    stacked = jnp.asarray(rng.integers(0, 32, (3, 2, 9)), jnp.int32)
    params, logits = None, {}
    for impl in ("naive", "fused"):
        model = nnx.eval_shape(lambda: build_model(tiny(), rngs=nnx.Rngs(0), kernel=KernelConfig(attention_impl=impl)))
        graphdef, shapes = nnx.split(model)
        if params is None:
            params = jax.tree.map(lambda x: jnp.asarray(rng.normal(0.0, 0.3, x.shape).astype(x.dtype)), shapes)
        run = jax.jit(jax.vmap(lambda t: apply(graphdef, params, t)[0]))
        assert (fused_attention.FORWARD_TARGET in str(jax.make_jaxpr(run)(stacked))) == (impl == "fused")
        logits[impl] = run(stacked)
    np.testing.assert_allclose(logits["fused"], logits["naive"], atol=TOL, rtol=0)


@needs_kernel
def test_a_damaged_library_in_the_cache_is_built_again(tmp_path, kernel):
    """An empty file where the cache keeps the kernel (a copy cut short) is deleted, built once more and used, with
    no warning. The build here copies the library this process loaded (the other tests compile it for real)."""
    done = run_python("""
        import shutil, warnings
        from pathlib import Path
        import jax, numpy as np
        import jaxformer.functional as F
        from jaxformer.functional import fused_attention
        from jaxformer.functional.extension import Extension
        builds = []

        def build(self, path, extra_flags=()):
            builds.append(path)
            shutil.copy(GOOD, path)
            return path

        Extension.build = build
        path = fused_attention.EXTENSION.library_path()
        path.parent.mkdir(parents=True)
        path.write_bytes(b"")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert fused_attention.fused_available()
        assert builds == [path] and path.read_bytes() == Path(GOOD).read_bytes()
        q = jax.numpy.asarray(np.random.default_rng(0).standard_normal((1, 5, 2, 8), np.float32))
        assert fused_attention.FORWARD_TARGET in str(jax.make_jaxpr(lambda q: F.attention(q, q, q, impl="fused"))(q))
        np.testing.assert_allclose(F.attention(q, q, q, impl="fused"), F.attention(q, q, q), atol=1e-5)
        print("rebuilt ok")
    """.replace("GOOD", repr(fused_attention.loaded_path())),
        {"JAXFORMER_EXT_CACHE": str(tmp_path / "ext"), fused_attention.LIBRARY_ENV: ""})
    assert "rebuilt ok" in done.stdout


def test_missing_library_falls_back_to_the_plain_path_with_one_warning(tmp_path):
    """The loader pointed at a library that does not exist: ``fused`` computes with ``naive``, and says so once."""
    missing = tmp_path / "absent" / "fused_attention.so"
    done = run_python("""
        import warnings
        import jax, jax.numpy as jnp, numpy as np
        import jaxformer.functional as F
        from jaxformer.functional import fused_attention
        q = jax.random.normal(jax.random.key(0), (2, 13, 4, 16))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            grad = lambda impl: jax.grad(lambda q: jnp.sum(F.attention(q, q, q, impl=impl, causal=True) ** 2))(q)
            np.testing.assert_allclose(grad("fused"), grad("naive"), atol=1e-6)
            np.testing.assert_allclose(F.attention(q, q, q, impl="fused"), F.attention(q, q, q), atol=1e-6)
        messages = [str(w.message) for w in caught if "fused attention is unavailable" in str(w.message)]
        assert len(messages) == 1, messages
        assert not fused_attention.fused_available()
        assert "absent" in fused_attention.unavailable_reason()
        assert fused_attention.FORWARD_TARGET not in str(jax.make_jaxpr(lambda q: F.attention(q, q, q, impl="fused"))(q))
        print("fallback ok")
    """, {fused_attention.LIBRARY_ENV: str(missing)})
    assert "fallback ok" in done.stdout


def test_bench_says_when_the_kernel_is_unavailable(tmp_path):
    done = subprocess.run([sys.executable, "-m", "jaxformer.cli", "bench", "attention", "--out", str(tmp_path),
                           "--min-n", "16", "--max-n", "16", "--repeats", "1", "--impls", "naive,fused", "--modes",
                           "forward", "--heads", "2", "--head-dim", "8", "--memory-impls", ""],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, fused_attention.LIBRARY_ENV: str(tmp_path / "missing.so")})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fused kernel unavailable, so the fused rows time the plain path" in done.stdout


@needs_kernel
def test_data_parallel_mesh_splits_the_call_by_batch(kernel):
    """Two CPU devices, batch-sharded inputs: the FFI calls run on each device's half, no all-gather."""
    done = run_python("""
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import NamedSharding, PartitionSpec
        import jaxformer.functional as F
        mesh = jax.make_mesh((2,), ("data",))
        sharding = NamedSharding(mesh, PartitionSpec("data"))
        q, k, v = (jax.device_put(jax.random.normal(jax.random.key(i), (4, 13, 4, 16)), sharding) for i in range(3))
        def loss(impl):
            return jax.jit(jax.value_and_grad(
                lambda q, k, v: jnp.sum(jnp.sin(F.attention(q, k, v, impl=impl, causal=True))), argnums=(0, 1, 2)))
        fused = loss("fused")
        hlo = fused.lower(q, k, v).compile().as_text()
        assert "jaxformer_fused_attention_fwd" in hlo and "jaxformer_fused_attention_bwd" in hlo
        assert "all-gather" not in hlo, hlo
        (value, grads), (value_ref, grads_ref) = fused(q, k, v), loss("naive")(q, k, v)
        np.testing.assert_allclose(value, value_ref, rtol=1e-5)
        for grad, grad_ref in zip(grads, grads_ref):
            np.testing.assert_allclose(grad, grad_ref, atol=1e-5)
            assert grad.sharding.is_equivalent_to(sharding, grad.ndim)
        print("sharded ok")
    """, {"XLA_FLAGS": os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2",
          "JAX_PLATFORMS": "cpu"})
    assert "sharded ok" in done.stdout


@needs_kernel
def test_a_kernel_cache_every_user_may_write_is_not_loaded_from(tmp_path, monkeypatch, kernel):
    """A library in a cache directory every user may write could be anyone's code: the kernel is unavailable (the
    plain path computes) and nothing there is loaded; the same library in a directory only this user writes loads."""
    from jaxformer.functional.extension import CACHE_ENV, Extension

    E = fused_attention.EXTENSION
    monkeypatch.setenv(E.library_env, "")
    for mode, loads in ((0o777, False), (0o755, True)):
        cache = tmp_path / f"ext-{mode:o}"
        cache.mkdir()
        cache.chmod(mode)
        monkeypatch.setenv(CACHE_ENV, str(cache))
        fresh = Extension(E.name, E.abi_version, E.library_env, targets={})  # no FFI target registered twice
        shutil.copy(fused_attention.loaded_path(), fresh.library_path())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert fresh.available() is loads
        if loads:
            assert fresh.loaded_path() == str(fresh.library_path()) and not caught
        else:
            assert fresh.loaded_path() is None
            assert fresh.unavailable_reason() == (f"RuntimeError: the kernel cache {cache} is writable by every user, "
                                                  "so its libraries could be anyone's: not used (give "
                                                  "$JAXFORMER_EXT_CACHE a directory only you can write)")
            assert len(caught) == 1 and "the plain path computes instead" in str(caught[0].message)
