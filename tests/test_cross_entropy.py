"""`F.cross_entropy` is optax's softmax cross-entropy with integer labels, bit for bit, values and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxformer.functional as F
from jaxformer.functional.cross_entropy import row_max


@pytest.mark.parametrize("shape", [(2048, 256), (4, 64, 256), (3, 50304), (5, 50257), (7, 33), (6, 32), (9, 5), (2, 1)])
@pytest.mark.parametrize("scale", [1.0, 300.0])
def test_values_and_gradients_equal_optax_bit_for_bit(shape, scale):
    key = jax.random.PRNGKey(sum(shape))
    logits = scale * jax.random.normal(key, shape, jnp.float32)
    labels = jax.random.randint(jax.random.fold_in(key, 1), shape[:-1], 0, shape[-1])

    def ours(x):
        return F.cross_entropy(x, labels)

    def theirs(x):
        return optax.softmax_cross_entropy_with_integer_labels(x, labels)

    np.testing.assert_array_equal(jax.jit(ours)(logits), jax.jit(theirs)(logits))
    grad = jax.jit(jax.grad(lambda x: ours(x).mean()))(logits)
    np.testing.assert_array_equal(grad, jax.jit(jax.grad(lambda x: theirs(x).mean()))(logits))
    np.testing.assert_array_equal(jax.jit(row_max)(logits), jnp.max(logits, axis=-1))


def test_masked_logits_and_nans_behave_as_in_optax():
    logits = jnp.array([[0.0, -jnp.inf, 3.0] + [-jnp.inf] * 61,           # masked entries
                        [jnp.nan] + [1.0] * 63,                           # a NaN propagates
                        [jnp.inf] + [1.0] * 63], jnp.float32)             # an infinite logit
    labels = jnp.array([2, 1, 3])
    ours = F.cross_entropy(logits, labels)
    np.testing.assert_array_equal(ours, optax.softmax_cross_entropy_with_integer_labels(logits, labels))
    assert np.isnan(ours[1]) and float(ours[0]) == pytest.approx(np.log1p(np.exp(-3.0)))
