"""The lowest loss any model can reach on this study's evaluation: not quite the chain's entropy rate.

A model is scored on windows of 65 bytes: inputs w[:-1], targets w[1:]. The first target of a window has one byte of
context, not the chain's two, so a perfect model pays H(X1|X0) there. The windows also cross document starts it
cannot see: the stream is independent 4,096-byte documents with no separator.

- Lower bound: (H(X1|X0) + 63·H∞) / 64, exact, for a predictor that is told where documents start.
- Upper bound: the loss, on 2M bytes of fresh windows, of one predictor that is not told. It predicts with the chain
  itself mixed with the stationary marginal at weight 1/4096 (a document starts at any byte with that chance), using
  only the bytes inside the window.

Usage: python experiments/markov_truth_ladder/floor.py   (prints; the numbers are in the README)
"""

import numpy as np

from jaxformer.train.markov import make_markov_source

SEQ_LEN, DOC_BYTES = 64, 4096


def main() -> None:
    source = make_markov_source(2, 32, 4, 1.0, 0)  # sweeps/markov-truth-ladder.yaml's chain
    A, pi = source.alphabet, source.stationary()
    h_inf = source.entropy_rate_bits() * np.log(2)
    P = np.zeros((A * A, A))  # P[context, next]
    np.put_along_axis(P, source.successors, source.probs, axis=1)
    pair = (pi[:, None] * P).reshape(A, A, A).sum(axis=0)  # [b, c]: P(X_{t-1} = b, X_t = c)
    marginal = pair.sum(axis=1)
    order1 = pair / marginal[:, None]
    h1 = -np.sum(pair[pair > 0] * np.log(order1[pair > 0]))
    lower = (h1 + (SEQ_LEN - 1) * h_inf) / SEQ_LEN

    eps = 1.0 / DOC_BYTES
    docs = source.sample(2_000_000 // DOC_BYTES, DOC_BYTES, seed=12345)
    stream = np.frombuffer(b"".join(docs), np.uint8).astype(np.int64) - int(source.byte_values[0])
    windows = stream[: len(stream) // (SEQ_LEN + 1) * (SEQ_LEN + 1)].reshape(-1, SEQ_LEN + 1)
    first = (1 - eps) * order1[windows[:, 0], windows[:, 1]] + eps * marginal[windows[:, 1]]
    context = windows[:, :-2] * A + windows[:, 1:-1]
    rest = (1 - eps) * P[context, windows[:, 2:]] + eps * marginal[windows[:, 2:]]
    upper = -(np.log(first).sum() + np.log(rest).sum()) / (windows.shape[0] * SEQ_LEN)
    print(f"entropy rate H_inf {h_inf:.5f}, H(X1|X0) {h1:.5f} nats/byte")
    print(f"floor of the 64-target windows: at least {lower:.5f} (told the document starts), "
          f"at most {upper:.5f} (the chain mixed with the marginal, on {windows.size:,} bytes of fresh windows)")


if __name__ == "__main__":
    main()
