"""The textbook's worked example, "kedi sütü içti" (chapter 7.2–7.3): inputs and hand-set weights."""

import numpy as np

TOKENS = ["kedi", "sütü", "içti"]
X = np.array([[0.9, 0.1, 0.0, 0.5], [0.1, 0.9, 0.0, 0.5], [0.0, 0.1, 0.9, 0.5]], dtype=np.float32)
# head 1: argument structure
W_Q1 = np.array([[2, 0], [0, 2], [2, 2], [0, 0]], dtype=np.float32)
W_K1 = np.array([[1.5, 0], [0, 1.5], [0, 0], [0, 0]], dtype=np.float32)
W_V1 = np.array([[1, 0], [0, 1], [0, 0], [0.2, 0.2]], dtype=np.float32)
# head 2: which verb governs me
W_Q2 = np.array([[2.5, 0], [2.5, 0], [0, 2.5], [0, 0]], dtype=np.float32)
W_K2 = np.array([[0, 1.6], [0, 1.6], [2, 0], [0, 0]], dtype=np.float32)
W_V2 = np.array([[0, 0.6], [0, 0.6], [1, 0], [0, 0]], dtype=np.float32)
W_O = np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0.2, 0.2, 0, 0]], dtype=np.float32)
# the feed-forward detectors (ReLU), rows of W_1ᵀ, and what each writes back
W_1 = np.array(
    [[1, 0, 1, 0], [0, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0.5, 0.5, 0, 0], [0, 0, 0, 1]],
    dtype=np.float32,
).T
B_1 = np.array([-0.9, -0.9, -0.9, -0.5, -0.5, -0.5, -0.5, -0.5], dtype=np.float32)
W_2 = np.array(
    [[0.4, 0, 0.5, 0], [0, 0.4, 0.5, 0], [0.4, 0.4, 0, 0], [0.3, 0, 0, 0], [0, 0.3, 0, 0], [0, 0, 0.3, 0],
     [0.15, 0.15, 0, 0], [0, 0, 0, 0]],
    dtype=np.float32,
)


def two_heads(x=X):
    """Per-head tensors ``[T, H=2, D=2]`` of the two hand-built heads."""
    q = np.stack([x @ W_Q1, x @ W_Q2], axis=1)
    k = np.stack([x @ W_K1, x @ W_K2], axis=1)
    v = np.stack([x @ W_V1, x @ W_V2], axis=1)
    return q, k, v
