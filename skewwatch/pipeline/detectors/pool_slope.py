"""A log value at the pool's typical prompt or load: its slope on a log covariate, learned per pool.

The learned detector judges a window's TTFT per prompt token at the pool's typical prompt, and its
times per token and to first token at the pool's typical load (its batch and its prompts; its queue):
each is a pool's relation between two of a window's fields, learned over the pool's windows and
taken out. The prompt is the example below.

A request's time to its first token is its prompt's prefill plus a wait for a step of the engine
that does not grow with the prompt. Per prompt token, a short prompt then takes longer than a long
one: on long-context traffic a window whose one request had a 40-token prompt shows ten times the
TTFT per prompt token of a window whose request had 15,000, and on a replica of a request or two a
window that swing is most of the noise a drift must be told from. The window carries the geometric
mean prompt of the requests its TTFT per prompt token is over (``ttft_prompt_tokens_gmean``,
contract v1.8), so the relation can be learned and taken out:

    log(ttft_per_prompt_token) = a + b * log(prompt)

with ``b`` between -1 (a TTFT that does not grow with the prompt) and 0 (one that grows in
proportion), or above 0 where prefill grows faster than the prompt (attention on long contexts).
:class:`PoolSlope` fits ``b`` per pool by weighted least squares over the pool's windows, each
weighed by its requests (every replica's windows: the relation is the engine's and the model's, and
one replica's drift does not move it unless that replica serves other prompts), forgetting by
``1 / memory`` per update so it follows a new engine version within hours. :meth:`PoolSlope.adjust`
gives each window's value at the fit's typical prompt (the mean log prompt):

    log(ttft_per_prompt_token) - b * (log(prompt) - mean log prompt)

Until the fit holds ``min_requests`` requests over prompts of more than one length, ``b`` is 0 (the
value as given); ``b`` is kept within [-1, 1] (a TTFT that falls as its prompt grows, or grows with
more than its square, is a fit to noise).

>>> import numpy as np
>>> fit = PoolSlope(memory=240, min_requests=20)
>>> rng = np.random.default_rng(1)
>>> for _ in range(30):  # TTFT = 20 ms + 0.05 ms a prompt token, prompts of 40 to 40,000 tokens
...     prompt = np.exp(rng.uniform(np.log(40), np.log(40_000), 4))
...     per_token = np.log((20.0 + 0.05 * prompt) / prompt)
...     _ = fit.adjust("m", per_token, np.log(prompt), np.ones(4))
>>> round(fit.slope("m"), 2)  # per prompt token, a prompt ten times as long takes e^(-0.31 x 2.3) ~ 1/2
-0.31
>>> short, long = np.log(40.0), np.log(40_000.0)
>>> values = fit.adjust("m", np.log(np.array([21.0 / 40, 2020.0 / 40_000])), np.array([short, long]), np.ones(2))
>>> round(float(values[0] - values[1]), 1)  # 2.3 apart as given (ten times), 0.2 at one prompt length
0.2
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]

# a fit: requests, mean log covariate, mean value, co-moments, when it last learned (event time)
_W, _MX, _MY, _CXX, _CXY, _T = range(6)


class PoolSlope:
    """Per pool (a key: a model, or a model and a feature), the weighted least-squares slope of a log
    value on a log covariate (the prompt below); see the module."""

    def __init__(self, memory: int, min_requests: float) -> None:
        if memory < 1 or min_requests < 0:
            raise ValueError(f"need memory >= 1 and min_requests >= 0, got {memory!r} and {min_requests!r}")
        self.memory = memory
        self.min_requests = min_requests
        self.fits: dict[str, Floats] = {}

    def slope(self, key: str) -> float:
        """The pool's slope now (0 until the fit holds ``min_requests`` over more than one covariate value)."""
        fit = self.fits.get(key)
        if fit is None or fit[_W] < self.min_requests or not fit[_CXX] > 0.0:
            return 0.0
        return float(np.clip(fit[_CXY] / fit[_CXX], -1.0, 1.0))

    def adjust(self, key: str, values: Floats, log_x: Floats, requests: Floats, now: float = 0.0) -> Floats:
        """Each window's ``values`` (NaN: none) at the pool's typical ``log_x`` (log prompt, log load),
        by the fit before this batch; then the fit learns the windows that have both (at ``now``)."""
        b = self.slope(key)
        fit = self.fits.get(key)
        centre = 0.0 if fit is None else float(fit[_MX])
        out = values - b * (log_x - centre) if b else values.copy()
        self._learn(key, values, log_x, requests, now)
        return np.where(np.isfinite(out) | ~np.isfinite(values), out, values)  # no covariate: the value as given

    def drop_before(self, t: float) -> None:
        """Forget the pools whose fit last learned before ``t`` (a model no longer served)."""
        for key in [key for key, fit in self.fits.items() if fit[_T] < t]:
            del self.fits[key]

    def _learn(self, key: str, values: Floats, log_x: Floats, requests: Floats, now: float) -> None:
        """Fade the fit by ``1 - 1 / memory``, then add the batch (weighted means and co-moments,
        merged as Chan's parallel update does)."""
        both = np.isfinite(values) & np.isfinite(log_x) & (requests > 0.0)
        if not both.any():
            return
        w, x, y = requests[both], log_x[both], values[both]
        n = float(w.sum())
        mx, my = float(w @ x) / n, float(w @ y) / n
        cxx, cxy = float(w @ ((x - mx) ** 2)), float(w @ ((x - mx) * (y - my)))
        fit = self.fits.get(key)
        if fit is None:
            self.fits[key] = np.array([n, mx, my, cxx, cxy, now])
            return
        keep = 1.0 - 1.0 / self.memory
        w0 = fit[_W] * keep
        total = w0 + n
        dx, dy = mx - fit[_MX], my - fit[_MY]
        fit[_CXX] = fit[_CXX] * keep + cxx + dx * dx * w0 * n / total
        fit[_CXY] = fit[_CXY] * keep + cxy + dx * dy * w0 * n / total
        fit[_MX] += dx * n / total
        fit[_MY] += dy * n / total
        fit[_W] = total
        fit[_T] = now

    # --- state

    def state(self) -> dict[str, list[float]]:
        """Every pool's fit as plain floats (JSON-able)."""
        return {key: fit.tolist() for key, fit in self.fits.items()}

    def load(self, state: dict[str, list[float]]) -> None:
        """Load fits (:meth:`state`); one that is not six finite numbers is refused."""
        fits = {}
        for key, fit in state.items():
            row = np.asarray(fit, dtype=np.float64)
            if row.shape != (6,) or not np.isfinite(row).all() or row[_W] < 0.0:
                raise ValueError(f"pool slope of {key!r}: need six finite numbers, got {fit!r}")
            fits[str(key)] = row
        self.fits = fits
