"""The ubatches llama.cpp runs a prompt-free step as (its split_equal, replayed).

Why: over ringserve's per-slot KV streams (kv_unified off) llama.cpp splits a
batch with ``llama_batch_allocr::split_equal(n_ubatch, sequential=true)``
(llama-kv-cache.cpp, llama-kv-cache-iswa.cpp): a ubatch holds a run of
*consecutive* sequence ids, each with the same number of tokens. Every
ubatch is a pass over the weights (~13 ms here for one row, mostly the
262k-token output matrix), so a step's cost is the sum of its ubatches'
costs, not a function of its row count: slots drafting different lengths,
or generating slots with a gap between their ids, each add a pass.
engine/spec/cost.py prices a candidate draft as the ubatches this module
says it becomes.

The batch of a prompt-free step is built in this order (engine/loop.py
build, then Speculator.draft): every generating slot's last token in slot
(= sequence id) order, then each drafting slot's drafted tokens, slot by
slot in the same order. Invariant of the replay: the same order and the
same rules as split_equal -- a ubatch starts at the first unused token in
batch order, takes each further sequence whose id follows the last taken
one (scanning unused tokens in batch order), and gives every taken
sequence min(its unused tokens, n_ubatch // n_seqs) tokens.
"""
from __future__ import annotations


def ubatches(ids: list[int], counts: list[int], n_ubatch: int = 512) -> list[int]:
    """Rows of each ubatch (all rows have logits) for sequences ``ids``
    (ascending) holding ``counts`` tokens each (1 + the drafted ones)."""
    n = len(ids)
    used = [0] * n
    left = sum(counts)
    out = []
    while left > 0:
        # scan order of the unused tokens: last tokens (used == 0) by id, then drafts by id
        order = [i for i in range(n) if used[i] == 0 and counts[i] > 0] + \
                [i for i in range(n) if 0 < used[i] < counts[i]]
        take = [order[0]]
        for i in order[1:]:
            if len(take) > n_ubatch:  # as split_equal: it stops once it holds n_ubatch + 1 sequences
                break
            if ids[i] == ids[take[-1]] + 1:
                take.append(i)
        k = min(counts[i] - used[i] for i in take)
        k = max(1, min(k, n_ubatch // len(take)))
        for i in take:
            used[i] += k
        left -= k * len(take)
        out.append(k * len(take))
    return out
