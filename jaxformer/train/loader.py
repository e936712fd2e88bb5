"""Batches of token windows whose whole state is one counter, so a resumed run reads the same stream.

A window is ``seq_len + 1`` consecutive tokens: inputs ``w[:-1]``, next-token targets ``w[1:]``.
Epoch ``e`` cuts the training stream into ``n = (len - seq_len) // seq_len`` windows starting
at ``offset_e + i·seq_len`` (``offset_e ∈ [0, seq_len)``, so epochs see different cuts) and
visits them in the order of a permutation; both are drawn from NumPy's PCG64 seeded with
``(seed, e)``. Sample ``j`` of the endless stream is window ``perm_e[j mod n]`` of epoch
``e = j // n``; the loader's state is ``position`` = samples consumed. No randomness is kept
anywhere else, so the position (saved in every checkpoint) pins the stream exactly.
"""

from __future__ import annotations

import numpy as np


class Loader:
    """``next_batch()`` → ``[batch_size, seq_len + 1]`` int32 token windows."""

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, seed: int) -> None:
        self.tokens, self.seq_len, self.batch_size, self.seed = tokens, seq_len, batch_size, seed
        self.num_windows = (len(tokens) - seq_len) // seq_len
        if self.num_windows < 1:
            raise ValueError(f"a stream of {len(tokens)} tokens holds no window of {seq_len} + 1 tokens")
        self.position = 0
        self._epoch: tuple[int, np.ndarray] | None = None  # (epoch, window starts in visiting order)

    def _starts(self, epoch: int) -> np.ndarray:
        if self._epoch is None or self._epoch[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            offset = int(rng.integers(self.seq_len))
            order = rng.permutation(self.num_windows)
            self._epoch = (epoch, offset + order * self.seq_len)
        return self._epoch[1]

    def sample_starts(self, first: int, count: int) -> np.ndarray:
        """Start offsets of samples ``first … first + count - 1`` of the stream."""
        samples = np.arange(first, first + count)
        starts = np.empty(count, dtype=np.int64)
        for epoch in np.unique(samples // self.num_windows):
            in_epoch = samples // self.num_windows == epoch
            starts[in_epoch] = self._starts(int(epoch))[samples[in_epoch] % self.num_windows]
        return starts

    def next_batch(self, rows: np.ndarray | None = None) -> np.ndarray:
        """The next ``[batch_size, seq_len + 1]`` windows, or only their rows ``rows`` (one process's share).

        The stream advances by the whole batch either way.
        """
        starts = self.sample_starts(self.position, self.batch_size)
        self.position += self.batch_size
        return gather_windows(self.tokens, starts if rows is None else starts[rows], self.seq_len)

    def state_dict(self) -> dict:
        """JSON-ready; ``position`` is all that changes."""
        return {"position": self.position, "seed": self.seed, "seq_len": self.seq_len,
                "batch_size": self.batch_size, "num_windows": self.num_windows}

    def load_state_dict(self, state: dict) -> None:
        """Restores ``position``; a different stream (corpus, seed, shapes) raises ``ValueError``."""
        mine = self.state_dict()
        for key in ("seed", "seq_len", "batch_size", "num_windows"):
            if state.get(key) != mine[key]:
                raise ValueError(
                    f"the checkpoint's data stream differs from this run's: {key} was {state.get(key)!r}, "
                    f"now {mine[key]!r} (corpus or split changed?)"
                )
        self.position = int(state["position"])


def gather_windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> np.ndarray:
    """``[len(starts), seq_len + 1]`` int32: ``tokens[s : s + seq_len + 1]`` for each start."""
    return np.asarray(tokens[starts[:, None] + np.arange(seq_len + 1)], dtype=np.int32)


def eval_batches(tokens: np.ndarray, seq_len: int, batch_size: int, max_tokens: int) -> np.ndarray:
    """``[num_batches, b, seq_len + 1]``: the first non-overlapping windows of the validation stream.

    Up to ``max_tokens`` target tokens (at least one window), in batches of ``b``, the largest divisor of
    the window count up to ``batch_size``, so that one compiled shape serves the whole pass and the windows
    scored depend on the stream and ``max_tokens`` alone: runs of different batch sizes (a tuning stage's)
    are compared on the same tokens.
    """
    windows = min((len(tokens) - 1) // seq_len, max(1, max_tokens // seq_len))
    b = max(d for d in range(1, min(batch_size, windows) + 1) if windows % d == 0)
    batch = gather_windows(tokens, np.arange(windows) * seq_len, seq_len)
    return batch.reshape(windows // b, b, seq_len + 1)
