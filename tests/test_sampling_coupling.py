"""vLLM's rejection rule with a greedy (deterministic) draft, checked numerically before the sampled Oracle uses it.

The rule (``vllm/v1/sample/rejection_sampler.py`` without draft probabilities): accept the drafted token d
with probability p(d); otherwise emit a token drawn from p restricted to tokens != d, renormalised (vLLM draws
it by the Gumbel-max trick over p with d masked out). Claims:

1. one token: the emitted token is distributed exactly as p, and P(accept) = p(d);
2. the coupling: drawing y ~ p and reading "accepted" as "y == d" gives the same joint law of (accepted,
   emitted token); over a chain of drafts, the number of accepted drafts is distributed as the number of
   leading drafts equal to a target sample path's next tokens, with P(a >= j) = prod_{i<=j} p(d_i | d_<i).

Exact enumeration on toy distributions, plus seeded Monte Carlo of the rule as vLLM draws it. numpy only.
"""

from __future__ import annotations

import itertools

import numpy as np

P = np.array([0.5, 0.2, 0.15, 0.1, 0.05])


def rule_exact(p: np.ndarray, d: int) -> tuple[float, np.ndarray]:
    """(P(accept), law of the emitted token) of the one-token rule, by enumeration."""
    rest = p.copy()
    rest[d] = 0.0
    residual = rest / rest.sum()
    emitted = (1 - p[d]) * residual
    emitted[d] += p[d]
    return float(p[d]), emitted


def rule_sample(p: np.ndarray, d: int, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n draws of the rule as vLLM implements it: accept iff p(d) >= u, u ~ U[0, 1); a rejection emits
    argmax over tokens != d of p / q, q ~ Exp(1) (the Gumbel-max trick of ``sample_recovered_tokens``)."""
    u = rng.random(n)
    accepted = p[d] >= u
    q = rng.exponential(size=(n, len(p)))
    score = np.where(np.arange(len(p)) == d, 0.0, p) / q
    recovered = score.argmax(axis=1)
    return accepted, np.where(accepted, d, recovered)


def test_one_token_rule_reproduces_p_exactly():
    """P(accept) = p(d) and the emitted law is p, so given a rejection the token is distributed as p off d:
    the coupling y ~ p, "accepted" = (y == d) has the rule's joint law."""
    for d in range(len(P)):
        accept, emitted = rule_exact(P, d)
        assert accept == P[d]
        np.testing.assert_allclose(emitted, P, rtol=0, atol=1e-15)
    # a draft the target gives no mass is never accepted, and the law is still p
    p0 = np.array([0.6, 0.4, 0.0])
    accept, emitted = rule_exact(p0, 2)
    assert accept == 0.0 and np.allclose(emitted, p0)


def test_one_token_rule_as_vllm_draws_it():
    """Monte Carlo of the rule with vLLM's draws: the emitted law matches p (chi-square), P(accept) = p(d)."""
    rng = np.random.default_rng(58)
    n = 200_000
    for d in (0, 3):
        accepted, emitted = rule_sample(P, d, rng, n)
        se = np.sqrt(P[d] * (1 - P[d]) / n)
        assert abs(accepted.mean() - P[d]) < 4 * se
        counts = np.bincount(emitted, minlength=len(P))
        chi2 = float(((counts - n * P) ** 2 / (n * P)).sum())
        assert chi2 < 18.5  # 4 degrees of freedom: the 0.999 quantile is 18.47


def _chain_target(V: int, seed: int) -> dict[tuple[int, ...], np.ndarray]:
    """A toy target: next-token law for every context of up to 3 tokens (random, seeded)."""
    rng = np.random.default_rng(seed)
    return {ctx: rng.dirichlet(np.full(V, 0.7)) for n in range(4) for ctx in itertools.product(range(V), repeat=n)}


def test_coupling_over_a_draft_chain():
    """With drafts d_1..d_K fixed by the context (a greedy draft), the rule's accepted length has the law of
    the number of leading drafts equal to a target sample path's next tokens; P(a >= j) is the product of the
    target's probabilities of d_1..d_j, each given the drafts before it (what oracle.parquet's accept_prob
    records), and the tokens emitted by the round are a sample path of the target."""
    V, K = 3, 3
    target = _chain_target(V, 7)
    drafts = (0, 2, 1)  # any fixed chain: a greedy draft's is a function of the context

    def rule_law() -> tuple[np.ndarray, dict[tuple[int, ...], float]]:
        """Accepted-length law and the law of the first K emitted tokens, by enumeration of the rule
        (after the round, the sequence continues by sampling the target: ancestral sampling)."""
        acc = np.zeros(K + 1)
        paths: dict[tuple[int, ...], float] = {}

        def extend(prefix: tuple[int, ...], prob: float) -> None:  # sample the target to length K
            if len(prefix) == K:
                paths[prefix] = paths.get(prefix, 0.0) + prob
                return
            for x, px in enumerate(target[prefix]):
                extend(prefix + (x,), prob * px)

        prob, prefix = 1.0, ()
        for j in range(K):
            p = target[prefix]
            d = drafts[j]
            rest = np.where(np.arange(V) == d, 0.0, p)
            for x in range(V):  # rejected at draft j + 1: emit x from the residual, then the target continues
                if rest[x] > 0:
                    acc[j] += prob * (1 - p[d]) * rest[x] / rest.sum()
                    extend(prefix + (x,), prob * (1 - p[d]) * rest[x] / rest.sum())
            prob *= p[d]
            prefix = prefix + (d,)
        acc[K] += prob
        extend(prefix, prob)
        return acc, paths

    acc_rule, paths_rule = rule_law()
    # the coupling: a target sample path y, a = leading drafts equal to y's tokens
    acc_coupled = np.zeros(K + 1)
    paths_target: dict[tuple[int, ...], float] = {}
    for y in itertools.product(range(V), repeat=K):
        prob = np.prod([target[y[:i]][y[i]] for i in range(K)])
        paths_target[y] = prob
        a = next((i for i in range(K) if y[i] != drafts[i]), K)
        acc_coupled[a] += prob
    np.testing.assert_allclose(acc_rule, acc_coupled, atol=1e-15)
    assert set(paths_rule) == set(paths_target)
    np.testing.assert_allclose([paths_rule[y] for y in sorted(paths_rule)],
                               [paths_target[y] for y in sorted(paths_target)], atol=1e-15)
    # P(a >= j) = prod of the target's probabilities of the drafts, each given the drafts before it
    accept_prob = [target[drafts[:i]][drafts[i]] for i in range(K)]
    for j in range(1, K + 1):
        np.testing.assert_allclose(acc_coupled[j:].sum(), np.prod(accept_prob[:j]), atol=1e-15)
