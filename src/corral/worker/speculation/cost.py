"""What a draft token costs, measured as the worker runs, and the draft length that pays most.

Two costs, both in units of a one-token step of the target (the time of a step that decodes
and draws one token):

- ``token_cost``: the target's cost of verifying one more token in the step's decode (its
  position in the batch, its logits, its draw). ``StepCosts.target`` takes the time of every
  step whose batch holds only generating tokens (pending tokens and drafts, no prompt chunk),
  from the end of ``Speculator.fill`` to the first ``settle`` (the decode and the draws), and
  fits ``time = a + b * tokens`` by decayed least squares; ``token_cost = b / (a + b)``.
  Until the steps vary enough in size to fit, the prior (``CPU_TOKEN_COST``/``GPU_TOKEN_COST``)
  stands in, and the one-token step time is read from the mean step with it.
- ``draft_cost``: a draft model's time per slot-position it drafts (its decodes and the top
  token's probability check; batched over the slots, so a decode that serves 4 slots costs each
  a quarter), ``StepCosts.draft`` after every ``DraftModel.propose``, over the one-token step
  time. 0 for n-gram drafts (a lookup costs next to nothing), and 0 until measured.

``best_length`` chooses the draft length L (0: no draft this step) by tokens per unit of time:
with B slots generating, each drawing one token, a step costs 1 + token_cost * (B - 1) and
yields B tokens; the j-th token of a draft is accepted with probability r^j (r: the slot's
recent per-token acceptance) and costs token_cost + draft_cost, so it is sent while its
expected tokens per cost beat the step's without it: r^j / (token_cost + draft_cost) >
B / (1 + token_cost * (B - 1)). With the model as its own draft on a CPU, draft_cost is about
1: no token pays, and the slot does not draft.
"""

from __future__ import annotations

import math

__all__ = ["StepCosts", "best_length"]

_DECAY = 0.95  # per measured step (about the last 20 steps count)
_MIN_VAR = 0.5  # tokens^2: below this spread in step sizes the slope is not fitted
_COST_MIN, _COST_MAX = 0.01, 0.95


def best_length(r: float, n_gen: int, token_cost: float, draft_cost: float, longest: int) -> int:
    """The longest draft, at most ``longest``, whose every token pays (0: none does)."""
    threshold = (token_cost + draft_cost) * n_gen / (1.0 + token_cost * (n_gen - 1))
    if r <= 0.0 or r <= threshold:
        return 0
    if r >= 1.0:
        return max(0, longest)
    return max(0, min(longest, int(math.log(threshold) / math.log(r))))


class StepCosts:
    """The measured costs of one engine's steps (see the module's docstring)."""

    def __init__(self, prior_token_cost: float) -> None:
        self.prior = prior_token_cost
        self._s = [0.0] * 5  # decayed sums: weight, n, t, n*n, n*t
        self._draft_s = 0.0  # decayed draft seconds ...
        self._draft_p = 0.0  # ... and slot-positions
        self.steps = 0
        self.fixed: tuple[float, float] | None = None  # (token_cost, draft_cost): no measuring (tests)

    def target(self, n_tokens: int, seconds: float) -> None:
        """A step whose batch held ``n_tokens`` generating tokens took ``seconds`` (decode and draws)."""
        if n_tokens <= 0 or seconds <= 0.0:
            return
        s = self._s
        for i, v in enumerate((1.0, n_tokens, seconds, n_tokens * n_tokens, n_tokens * seconds)):
            s[i] = s[i] * _DECAY + v
        self.steps += 1

    def draft(self, positions: int, seconds: float) -> None:
        """The draft model drafted ``positions`` slot-positions in ``seconds``."""
        if positions > 0 and seconds > 0.0:
            self._draft_s = self._draft_s * _DECAY + seconds
            self._draft_p = self._draft_p * _DECAY + positions

    def _fit(self) -> tuple[float, float] | None:
        """(one-token step seconds, token_cost), None before any step."""
        w, n, t, nn, nt = self._s
        if w <= 0.0:
            return None
        mean_n, mean_t = n / w, t / w
        var = nn / w - mean_n * mean_n
        if var >= _MIN_VAR:
            b = (nt / w - mean_n * mean_t) / var
            a = mean_t - b * mean_n
            if b > 0.0 and a > 0.0:  # (a <= 0: not a line through these steps)
                return a + b, min(_COST_MAX, max(_COST_MIN, b / (a + b)))
        one = mean_t / (1.0 + self.prior * (mean_n - 1.0))
        return one, self.prior

    @property
    def token_cost(self) -> float:
        if self.fixed is not None:
            return self.fixed[0]
        fit = self._fit()
        return self.prior if fit is None else fit[1]

    @property
    def draft_cost(self) -> float:
        if self.fixed is not None:
            return self.fixed[1]
        fit = self._fit()
        if fit is None or self._draft_p <= 0.0 or fit[0] <= 0.0:
            return 0.0
        return min(16.0, self._draft_s / self._draft_p / fit[0])
