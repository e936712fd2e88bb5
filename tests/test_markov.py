"""The Markov source: its documents, its exact entropy rate, and its stationary distribution (power iteration, the
exact solve a slowly mixing chain falls back to, and the refusal of a slowly mixing chain too large to solve)."""

import collections
import math

import numpy as np
import pytest

from jaxformer.train.corpora import DataConfig, load_corpus
from jaxformer.train.markov import (DIRECT_CONTEXTS, MarkovConfig, closed_classes, make_markov_source,
                                    stationary_by_power, stationary_by_solve, transition_matrix)


def test_markov_entropy_rate_matches_the_empirical_conditional_entropy():
    source = make_markov_source(order=2, alphabet=8, branching=3, concentration=1.0, seed=3)
    rate, unigram = source.entropy_rate_bits(), source.unigram_entropy_bits()
    assert 0 < rate < math.log2(3) and rate < unigram <= math.log2(8)
    documents = source.sample(num_documents=200, length=2000, seed=1)
    pairs, contexts = collections.Counter(), collections.Counter()
    for doc in documents:
        for i in range(2, len(doc)):
            pairs[doc[i - 2 : i + 1]] += 1
            contexts[doc[i - 2 : i]] += 1
    n = sum(pairs.values())
    empirical = -sum(c / n * math.log2(c / contexts[key[:2]]) for key, c in pairs.items())
    assert empirical == pytest.approx(rate, abs=0.01)  # 400K symbols: sampling error ~0.002 bits
    symbols = collections.Counter(b"".join(documents))
    total = sum(symbols.values())
    assert -sum(c / total * math.log2(c / total) for c in symbols.values()) == pytest.approx(unigram, abs=0.01)
    assert source.sample(3, 50, seed=1) == source.sample(3, 50, seed=1)  # seeded
    assert source.sample(3, 50, seed=1) != source.sample(3, 50, seed=2)  # by its seed


def test_every_transition_of_a_markov_document_is_one_its_chain_allows_from_the_first_on():
    """A document's first ``order`` bytes are its starting context (most significant symbol first): the symbol
    after them, and every later one, is a successor of the context the bytes before it spell."""
    source = make_markov_source(order=3, alphabet=5, branching=2, concentration=1.0, seed=7)
    symbols = np.frombuffer(b"".join(source.sample(num_documents=300, length=12, seed=4)), np.uint8).reshape(300, 12)
    symbols = symbols.astype(np.int64) - 32
    allowed = {(context, int(successor)) for context in range(5**3) for successor in source.successors[context]}
    for t in range(3, 12):
        contexts = symbols[:, t - 3] * 25 + symbols[:, t - 2] * 5 + symbols[:, t - 1]
        assert {(int(c), int(x)) for c, x in zip(contexts, symbols[:, t])} <= allowed


def test_markov_bytes_are_printable_up_to_95_symbols_and_raw_beyond():
    for alphabet, first in ((8, 32), (95, 32), (96, 0), (256, 0)):
        values = make_markov_source(order=1, alphabet=alphabet, branching=2, concentration=1.0, seed=0).byte_values
        assert values.tolist() == list(range(first, first + alphabet))
    documents = make_markov_source(order=1, alphabet=8, branching=3, concentration=1.0, seed=0).sample(20, 100, 1)
    assert set(b"".join(documents)) <= set(b" !\"#$%&'")


def test_a_markov_chain_of_up_to_2_22_contexts_is_accepted_and_a_larger_one_refused_naming_its_count():
    assert MarkovConfig(order=11, alphabet=4).order == 11  # 4^11 = 2^22 contexts
    with pytest.raises(ValueError, match=r"^data\.markov\.order=12 with alphabet 4 has 16,777,216 contexts; at most "
                                         r"4,194,304 are supported$"):
        MarkovConfig(order=12, alphabet=4)


def test_markov_corpus_reports_its_entropies():
    corpus = load_corpus(DataConfig(corpus="synthetic-markov", markov=MarkovConfig(bytes=20_000)))
    assert corpus.info["bytes"] == 5 * 4096 and corpus.info["documents"] == 5
    assert corpus.info["entropy_rate_bits_per_byte"] < corpus.info["unigram_entropy_bits_per_byte"]


def imbalance(source, pi) -> float:
    """‖πP − π‖₁: zero for a stationary distribution."""
    return float(np.abs(transition_matrix(source).T @ pi - pi).sum())


@pytest.mark.parametrize("args, classes, transient", [
    ((2, 32, 4, 1.0, 0), 1, 12),  # the known-truth studies' chain: 12 of its 1,024 contexts transient
    ((1, 12, 2, 1.0, 141), [[0, 2, 3, 6], [4, 5, 7, 9, 10]], 3),  # 1, 8 and 11 transient
    ((1, 256, 2, 1.0, 3), 1, None),
])
def test_the_exact_solve_equals_power_iteration_where_both_settle(args, classes, transient):
    source = make_markov_source(*args)
    found = closed_classes(source)
    assert [c.tolist() for c in found] == classes if isinstance(classes, list) else len(found) == classes
    if transient is not None:
        assert source.num_contexts - sum(map(len, found)) == transient
    exact, power = stationary_by_solve(source), stationary_by_power(source)
    assert np.abs(exact - power).max() < 1e-14 and exact.sum() == pytest.approx(1.0, abs=1e-14)
    assert imbalance(source, exact) < 1e-14 and (exact >= 0).all()
    closed = np.concatenate(found)
    assert (exact[np.setdiff1d(np.arange(source.num_contexts), closed)] == 0).all()  # transient contexts: zero
    assert source.stationary is source.stationary and np.array_equal(source.stationary, power)  # power goes first


def test_a_deterministic_chain_is_solved_as_its_cycles_and_the_starts_that_reach_them_say():
    """Branching 1, seed 0: successors 0→3, 1→3, 2→4, 3→1, 4→0, 5→6, 6→5, 7→3, so the cycle 1↔3 is reached from six
    of the eight symbols and 5↔6 from two: π = 3/8, 3/8, 1/8, 1/8 on 1, 3, 5, 6 and 0 elsewhere, by the exact solve
    and by (lazy) power iteration alike, though each cycle is periodic. Entropy rate 0, and the unigram entropy of
    that π (0·log 0 = 0)."""
    source = make_markov_source(order=1, alphabet=8, branching=1, concentration=1.0, seed=0)
    assert source.successors.ravel().tolist() == [3, 3, 4, 1, 0, 6, 5, 3]
    expected = np.array([0, 3, 0, 3, 0, 1, 1, 0]) / 8
    assert np.abs(stationary_by_solve(source) - expected).max() < 1e-15
    assert np.abs(source.stationary - expected).max() < 1e-15
    assert source.entropy_rate_bits() == 0.0
    assert source.unigram_entropy_bits() == pytest.approx(-sum(p * math.log2(p) for p in (3 / 8, 3 / 8, 1 / 8, 1 / 8)),
                                                          rel=1e-12)


def test_a_slowly_mixing_chain_that_power_iteration_cannot_settle_is_solved_exactly():
    """Concentration 0.05 (seed 2): transitions of near-zero probability join the chain's parts, so power iteration
    does not settle; the chain is one closed class, so its stationary distribution is unique, and the solve's
    balances hold to rounding. The corpus built from it reports that distribution's entropy rate."""
    source = make_markov_source(order=1, alphabet=32, branching=4, concentration=0.05, seed=2)
    with pytest.raises(ValueError, match="did not converge in 20,000 steps: it mixes too slowly"):
        stationary_by_power(source)
    assert len(closed_classes(source)) == 1
    pi = source.stationary
    assert imbalance(source, pi) < 1e-14 and pi.sum() == pytest.approx(1.0, abs=1e-14) and (pi >= 0).all()
    assert pi.max() > 0.1 and pi[pi > 0].min() < 1e-12  # mass nearly all in one part: why iteration crawls
    corpus = load_corpus(DataConfig(corpus="synthetic-markov",
                                    markov=MarkovConfig(concentration=0.05, seed=2, bytes=4096)))
    assert corpus.info["entropy_rate_bits_per_byte"] == pytest.approx(source.entropy_rate_bits(), rel=1e-12)


def test_a_slowly_mixing_chain_beyond_the_solved_sizes_is_refused_in_one_line_naming_its_parameters():
    config = MarkovConfig(order=2, alphabet=65, concentration=0.05, seed=0, bytes=4096)  # 4,225 contexts
    assert config.alphabet**config.order > DIRECT_CONTEXTS
    with pytest.raises(ValueError, match=r"^data\.markov \(order 2, alphabet 65, branching 4, concentration 0\.05, "
                                         r"seed 0\): the chain's stationary distribution did not converge in 20,000 "
                                         r"steps: it mixes too slowly .*concentration makes such transitions rarer$"):
        load_corpus(DataConfig(corpus="synthetic-markov", markov=config))
