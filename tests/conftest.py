"""The tests compare fp32 implementations with each other, with jax.nn and PyTorch and with published numbers, at
fp32 tolerances. On a GPU, JAX computes fp32 matrix products in TF32 (10-bit mantissas) by default, which PyTorch
does not; where an accelerator backend is installed the tests ask for full fp32 products, in this process and in
the processes they start. A CPU-only install (CI) is left as it is: XLA:CPU computes fp32 products in fp32."""

import os

from jaxformer.runtime import plugin_installed

if plugin_installed():
    import jax

    os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
    jax.config.update("jax_default_matmul_precision", os.environ["JAX_DEFAULT_MATMUL_PRECISION"])
