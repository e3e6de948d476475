"""Sampling from the few tokens a chain can pick, not the whole vocabulary.

``llama_sampler_sample`` copies every logit into a candidate array (262k entries, 3 MB
with Gemma) before the chain's top-k keeps 40 of them: ~0.3 ms per slot and step in a
running worker, nearly all of it memory traffic, so more threads do not make it faster.
A chain that starts with top-k (or is greedy) can only pick among the k highest logits,
and a superset of those is found in one vectorized pass: the tokens at or above a floor
(``flatnonzero``). The chain then runs unchanged, in C, on that short array (~0.12 ms in
all per slot and step).

Why it is the same draw:

- Any floor will do if at least ``k`` untouched tokens lie at or above it. Tokens the
  logit bias touches (the request's ``logit_bias``; end-of-generation tokens with
  ``ignore_eos``) are always in the array and do not count toward ``k``. Then the k-th
  highest biased logit is at or above the floor, so every token the top-k keeps is in
  the array (untouched ones by the floor, touched ones by inclusion).
- The array is in token-id order, like the full one, so greedy picks the same token on
  ties; the chain's top-k sorts it as it sorts the full array, and dist draws from the
  same k entries with the same random number.
- Penalties keep a history and change any token's logit, and without a top-k the later
  samplers need the whole vocabulary: those chains take the full path, as do top-k
  above ``MAX_K``, a draw with an infinite logit or ties over more than ``MAX_SHORT``
  tokens, and every draw of a slot after three such misses in a row. A NaN logit (a
  broken model; llama.cpp's sort of it is undefined) is never drawn here.
- With a grammar, the first draw (without the grammar, sampler.py) uses the short
  list; resamples with the grammar take their own path.
"""

from __future__ import annotations

import ctypes
import math

import llama_cpp as ll
import numpy as np
import numpy.typing as npt

__all__ = ["ShortList", "MAX_SHORT", "MAX_K"]

MAX_SHORT = 32768  # more candidates than this: the full path is as cheap
_START_WINDOW = 8.0  # logits below the maximum, when the first guess fails
_MAX_TRIES = 12
_GIVE_UP_AFTER = 3
MAX_K = MAX_SHORT // 4  # a larger top-k: no short list (most tries would fail)
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)


class ShortList:
    """One slot's short candidate list for a chain whose first pick is a top-``k`` (1 for
    greedy). ``touched``: the token ids the chain's logit bias changes. Not thread-safe:
    one slot's draws run on one thread at a time (pool.py)."""

    def __init__(self, k: int, touched: list[int], n_vocab: int) -> None:
        self.k = k
        self.touched = np.array(sorted(t for t in set(touched) if 0 <= t < n_vocab), dtype=np.int64)
        # The first floor: the ``rank``-th highest of every ``stride``-th logit, which
        # about ``rank * stride`` ~ 25 k tokens lie above (at most MAX_SHORT / 2); the
        # sample has at least 256 logits, and the plain maximum of it (rank 1, cheapest)
        # serves small k on a large vocabulary.
        target = min(25 * k, MAX_SHORT // 2)
        self.stride = max(1, min(1 << max(0, (target - 1).bit_length()), n_vocab // 256))
        self.rank = max(1, round(target / self.stride))
        self.mask = np.zeros(n_vocab, dtype=np.bool_)
        self.data = np.zeros(0, dtype=_TOKEN_DATA)
        self.cur = ll.llama_token_data_array(None, 0, -1, False)
        self.loads = 0  # short lists made: draws and grammar resamples served (for tests and stats)
        self.misses = 0  # draws in a row that needed the full path; at _GIVE_UP_AFTER, stop trying

    def sample(self, chain: ll.llama_sampler_p, logits: npt.NDArray[np.float32]) -> int | None:
        """The chain's token, drawn from the short list and accepted into the chain; None
        when this draw must take the full path (nothing was applied or accepted)."""
        tok = self.pick((chain,), logits)
        if tok is not None:
            ll.llama_sampler_accept(chain, tok)
        return tok

    def pick(self, chains: tuple[ll.llama_sampler_p, ...], logits: npt.NDArray[np.float32]) -> int | None:
        """The token the chains, applied in turn, select from the short list; nothing is
        accepted. None when this draw must take the full path (nothing was applied)."""
        if not self.load(logits):
            return None
        cur = self.cur
        for chain in chains:
            ll.llama_sampler_apply(chain, ctypes.byref(cur))
        sel = cur.selected
        if not 0 <= sel < cur.size:
            raise RuntimeError(f"the sampler chain selected no token ({sel} of {cur.size})")
        return int(self.data["id"][sel])

    def load(self, logits: npt.NDArray[np.float32]) -> bool:
        """Fill ``data``/``cur`` with the short list (token-id order, raw logits, unsorted);
        False when this draw must take the full path."""
        if self.misses >= _GIVE_UP_AFTER:
            return False
        ids = self._candidates(logits)
        if ids is None:
            self.misses += 1  # e.g. a model whose logits tie over a wide band: each try is a pass
            return False
        self.misses = 0
        self.loads += 1
        n = len(ids)
        if len(self.data) < n:
            self.data = np.zeros(max(n, 2 * len(self.data), 256), dtype=_TOKEN_DATA)
            self.cur.data = self.data.ctypes.data_as(ll.llama_token_data_p)  # type: ignore[assignment]
        d = self.data[:n]
        d["id"] = ids
        d["logit"] = logits[ids]
        d["p"] = 0.0
        cur = self.cur
        cur.size = n
        cur.selected = -1
        cur.sorted = False
        return True

    def _candidates(self, logits: npt.NDArray[np.float32]) -> npt.NDArray[np.int64] | None:
        """Token ids (ascending) that hold every token the chain could pick, or None.

        Any floor works as long as at least ``k`` untouched tokens lie at or above it. The
        first guess comes from every ``stride``-th logit (about 25 k tokens lie above it):
        one pass over the vocabulary, usually the only one.
        Otherwise a window below the true maximum is widened or narrowed until it holds
        enough tokens and not too many."""
        sample = logits[:: self.stride]
        rank = min(self.rank, len(sample))
        guess = sample.max() if rank == 1 else np.partition(sample, len(sample) - rank)[len(sample) - rank]
        found, _ = self._within(logits, float(guess))
        if found is not None:
            return found
        top = float(logits.max())
        if not math.isfinite(top):
            return None
        window, low, high = _START_WINDOW, 0.0, math.inf  # the right window lies in (low, high)
        for _ in range(_MAX_TRIES):
            found, too_few = self._within(logits, top - window)
            if found is not None:
                return found
            if too_few:
                low = window
            else:
                high = window
            window = window * 2.0 if high == math.inf else (low + high) / 2.0
        return None  # ties over a wide band: no short list holds them

    def _within(self, logits: npt.NDArray[np.float32],
                floor: float) -> tuple[npt.NDArray[np.int64] | None, bool]:
        """The tokens at or above ``floor`` and the touched ones, if that is enough tokens
        (``k`` untouched ones) and not too many, else None; and whether there were too few."""
        np.greater_equal(logits, floor, out=self.mask)
        ids = np.flatnonzero(self.mask)
        touched = self.touched
        outside = touched[~(logits[touched] >= floor)] if len(touched) else touched
        # the touched tokens inside do not count toward k
        too_few = len(ids) - (len(touched) - len(outside)) < self.k
        if too_few or len(ids) > MAX_SHORT:
            return None, too_few
        if logits[ids].max() == math.inf:  # then the maximum is infinite: the full path decides
            return None, False
        if len(outside):
            ids = np.sort(np.concatenate((ids, outside)))
        return ids, False
