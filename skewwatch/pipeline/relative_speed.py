"""Each replica's cost relative to its pool over a long horizon that restarts at a change: the
capacity formula's evidence (:mod:`skewwatch.pipeline.capacity`).

One 60 s window's ratio of a replica's median time per token to its pool's is noisy (a few dozen
requests, a burst of long prompts). A GPU that is slower than its peers is slower every window, so
the estimate is the replica's exponentially weighted mean log ratio over ``capacity_horizon_s``
(300 s). A fault that begins or ends moves the ratio by more than its noise: a ratio further from
the mean than ``capacity_z`` noises (and ``log(capacity_dead_band)``) for half the evidence one ratio
summarises (30 s of a 60 s window: new requests, not the same ones again; spanning at least two updates)
restarts the mean from it, and a shorter run of them is an outlier the mean does not take. A run
that recedes (its latest ratio more than a noise closer to the mean than the run's furthest) restarts
nothing: a change holds or grows as the window fills with requests from after it, where a passing
burst (a few long prompts prefilling on one replica of a queue-bound pool) is largest when it
begins and then fades. So the estimate follows a change half a window after the windows show it,
and is as precise as five minutes of windows otherwise.

**Live confirmation.** The half window is the window's own lag: its old requests must give way to
new ones before a run proves anything. The engines' live time per output token (since their previous
sample) has no such lag. Where the ratios are a window's and the engines report it, a run is
confirmed on its second update when the replica's two latest live ratios (its live time per token
over the pool's median) are beyond the same noise on the run's side of its mean: two signals that
share no requests agree, the window's that a change began and the engine's that its tokens are
slower now. A passing burst slows a replica's live tokens as well, so the confirmation still needs
the window's run, and it recedes as before. A slowdown only: the window's ratio is compared at the
pool's batch and the live one is not, and a smaller batch alone makes a replica's tokens quicker (a
stuck scheduler's batch of 1-2), so a run toward faster waits its half window. Where the live
gauges do not agree, or are absent (a fleet that sends request events alone), the half window
stands.

**Following a change.** The caller refreshes the estimate on a grid (every half window) and, while
:meth:`RelativeSpeed.watching` (a run is open, or the mean restarted less than half a window
ago: a change holds or grows as the window fills), on every step. The pool's noise and the batch
slope take one step per refresh of the grid only (``sample_noise``), so the steps a change is
followed on do not let its own distances fill the noise.

**Noise.** The noise of one ratio is the larger of the replica's own (its mean absolute distance
from its mean, as a normal standard deviation, over the same horizon; one wild ratio counts at most
``2 capacity_z`` noises) and the pool's (the 95th percentile of the distances of its ratios from their
replicas' means over the same horizon, as a normal standard deviation: / 1.96): relative to each
replica's own mean, so a pool of two GPU types is not one noisy pool, and no replica is more certain
than its pool. A percentile in the tail, not the median, because a queue-bound pool's ratios are
heavy-tailed: most windows agree within a few percent and a few are several times apart, and a
median-based noise called those few a change. While the horizon holds fewer than 20 distances (a
small pool's first minutes), the 95th percentile would be their largest, so the noise is 1.4826 x
their median, as a normal's. Nothing is estimated before the pool's noise holds
one window of steps. An exponentially weighted mean over ``S``
seconds of evidence holds ``2 S / evidence_s`` independent ratios (the weights' squared sum over
their sum of squares; consecutive 60 s windows share most requests), so its standard error is the
noise x ``sqrt(evidence_s / 2 S)``, the noise itself right after a restart.

**Estimate.** ``log cost`` = the mean shrunk toward 0 by the larger of ``log(capacity_dead_band)`` and
``capacity_z`` standard errors: what the evidence cannot tell from noise is no difference.

>>> import numpy as np
>>> speed = RelativeSpeed()
>>> cost = None
>>> for step in range(60):  # c is 1.6 x slower than a and b, with a little noise
...     x = np.log([1.0, 1.0, 1.6]) + np.array([0.02, -0.02, 0.0]) * (-1) ** step
...     cost = speed.update(5.0 * step, ["a", "b", "c"], x, WeightConfig(), evidence_s=60.0)
>>> [round(float(c), 2) for c in np.exp(cost)]
[1.0, 1.0, 1.52]
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Any

import numpy as np
import numpy.typing as npt

from skewwatch.pipeline.weights import WeightConfig


class RelativeSpeed:
    """Per replica: the mean log cost since its last change, the seconds of evidence in it, its noise,
    when it was last updated and since when its ratios disagree with it (module docstring);
    JSON-able state."""

    def __init__(self) -> None:
        self._mean: dict[str, float] = {}
        self._span: dict[str, float] = {}  # seconds of evidence in the mean (decayed)
        self._noise: dict[str, float] = {}  # standard deviation of one ratio around the mean (decayed)
        self._seen: dict[str, float] = {}
        self._apart: dict[str, float] = {}  # since when its ratios are far from its mean, signed by the side
        self._agree: dict[str, float] = {}  # since when its live ratios are beyond its noise on the slow side
        self._watch_until: float | None = None  # refresh every step until then: a change is under way
        self._peak: dict[str, float] = {}  # the furthest that run's ratios have been from the mean
        self._last: float | None = None
        self._pool_noise = 0.0  # the pool's noise of one ratio, and the seconds of steps it holds (decayed)
        self._pool_span = 0.0
        self._pool_distances: deque[tuple[float, list[float]]] = deque()  # (when, distances) over the horizon
        self.batch = BatchSlope()  # the pool's own relation of time per token to batch (capacity.py)
        # the costs another formula's weights were last scaled by (capacity.scale_by_speed), and when:
        # replicas at cost 1 are left out
        self._kept: dict[str, float] = {}
        self._kept_at: float | None = None

    def update(self, now: float, replicas: Sequence[str], log_ratio: npt.NDArray[np.float64], config: WeightConfig,
               evidence_s: float | None, live: npt.NDArray[np.float64] | None = None,
               sample_noise: bool = True) -> npt.NDArray[np.float64]:
        """Take this step's log ratios (NaN: no evidence this step), each summarising ``evidence_s``
        seconds of the replica's work (a window of finished requests; None: the time since the last
        step, for live gauges), and return each replica's shrunk log cost (NaN: no estimate yet), in
        ``replicas`` order. ``live``: the engines' live log ratios of the same step, where the ratios
        are a window's (NaN: none); two of them beyond the noise on a run's side confirm it at once
        (module docstring, "Live confirmation"). ``sample_noise``: whether this step's distances join
        the pool's noise (False for the steps a change is followed on between the grid's refreshes:
        the pool's noise holds one step per refresh of the grid, so following a change does not let
        its own distances fill the noise)."""
        step = now - self._last if self._last is not None and now > self._last else _FIRST_STEP_S
        self._last = now
        evidence = step if evidence_s is None else evidence_s
        horizon = config.capacity_horizon_s
        floor = math.log(config.capacity_dead_band)
        z = config.capacity_z
        # the pool's noise: the 95th percentile of its ratios' distances from their replicas' means
        # over the horizon, as a normal standard deviation (module docstring, "Noise"); until it
        # holds a window of steps nothing is estimated (a pool's first ratios say nothing of their noise)
        ratios = log_ratio.tolist()
        distances = [abs(x - self._mean[r]) for r, x in zip(replicas, ratios, strict=True)
                     if not math.isnan(x) and r in self._mean]
        if distances and sample_noise:
            pool = self._pool_distances
            pool.append((now, distances))
            while pool and pool[0][0] <= now - horizon:
                pool.popleft()
            held = [d for _, ds in pool for d in ds]
            # the 95th percentile of fewer than 20 distances is their largest: below that, the median's
            self._pool_noise = (float(np.quantile(held, _POOL_QUANTILE)) / _POOL_Z if len(held) >= _POOL_MIN_DISTANCES
                                else _MAD_TO_NORMAL * float(np.median(held)))
            self._pool_span = math.exp(-step / horizon) * self._pool_span + step
        pool_noise = self._pool_noise
        lives = live.tolist() if live is not None else None
        for row, (replica, x) in enumerate(zip(replicas, ratios, strict=True)):
            if math.isnan(x):
                continue
            mean = self._mean.get(replica)
            if mean is None:
                self._mean[replica], self._span[replica], self._seen[replica] = x, evidence, now
                continue
            elapsed = min(max(now - self._seen[replica], 0.0), evidence)
            decay = math.exp(-elapsed / horizon)
            noise = self._noise.get(replica)
            scale = max(noise if noise is not None else pool_noise, pool_noise)
            residual = x - mean
            band = max(floor, z * scale)
            if lives is not None:
                live_slow = self._live_slow(replica, now, lives[row] - mean, band)
            else:  # no live sample: no run of them
                live_slow = False
                if self._agree:
                    self._agree.pop(replica, None)
            if noise is not None and abs(residual) > band:
                # far from the mean: a change once it has lasted half the evidence a ratio
                # summarises (new requests in the window, not the same ones seen again) and spans two
                # updates, unless it recedes (module docstring); then the mean restarts from this
                # ratio; until then an outlier it does not take
                side = 1.0 if residual > 0 else -1.0
                since = self._apart.get(replica)
                if since is None or math.copysign(1.0, since) != side:
                    self._apart[replica] = side * max(now, 1e-9)  # when the run began, signed by its side
                    self._peak[replica] = abs(residual)
                    self._watch(now + max(evidence / 2.0, step))
                else:
                    peak = max(self._peak.get(replica, 0.0), abs(residual))
                    self._peak[replica] = peak
                    # the live gauges' two latest samples on the run's side: the engine's tokens
                    # now, not the window's older requests, so no half window to wait. A slowdown
                    # only: the live ratio is not compared at the pool's batch, and a smaller batch
                    # alone makes a replica's tokens quicker (a stuck scheduler's batch of 1-2)
                    wait = step if live_slow and side > 0.0 else max(evidence / 2.0, step)
                    if now - abs(since) >= wait and abs(residual) >= peak - scale:
                        self._mean[replica], self._span[replica] = x, evidence
                        self._apart.pop(replica)
                        self._peak.pop(replica, None)
                        # a change holds or grows as the window fills: follow it step by step
                        self._watch(now + max(evidence / 2.0, step))
            else:
                self._apart.pop(replica, None)
                self._peak.pop(replica, None)
                span = decay * self._span[replica] + elapsed
                self._mean[replica] = mean + residual * elapsed / span if span > 0 else x
                self._span[replica] = span
            # the mean absolute residual, as a normal standard deviation, over the same horizon; a
            # residual counts at most 2 z noises (one wild ratio does not make every ratio noise)
            spread = _MAD_TO_SD * (abs(residual) if noise is None else min(abs(residual), 2.0 * z * scale))
            self._noise[replica] = spread if noise is None else decay * noise + (1.0 - decay) * spread
            self._seen[replica] = now
        out = np.full(len(replicas), np.nan)
        if self._pool_span < evidence:
            return out
        for row, replica in enumerate(replicas):
            mean = self._mean.get(replica)
            if mean is None:
                continue
            noise = self._noise.get(replica)
            scale = max(noise if noise is not None else pool_noise, pool_noise)
            # an exponentially weighted mean over a span of S seconds holds 2 S / evidence independent
            # ratios (the weights' (sum)^2 / sum of squares)
            error = scale * math.sqrt(min(evidence / (2.0 * self._span[replica]), 1.0))
            band = max(floor, z * error)
            out[row] = math.copysign(max(abs(mean) - band, 0.0), mean)
        return out

    def _live_slow(self, replica: str, now: float, residual: float, band: float) -> bool:
        """Whether this live sample and the one before are beyond ``band`` above the replica's mean
        (slower); tracks the run of such samples."""
        if math.isnan(residual) or residual <= band:
            self._agree.pop(replica, None)
            return False
        since = self._agree.setdefault(replica, now)
        return since < now

    def _watch(self, until: float) -> None:
        self._watch_until = until if self._watch_until is None else max(self._watch_until, until)

    def returning(self, replicas: Sequence[str]) -> list[bool]:
        """Whether each replica's latest ratios lie beyond its noise on the pool's side of its mean
        (a run that restarts the mean once it lasts, :meth:`update`): the evidence that its slowdown
        (or speed-up) is ending, before the estimate has restarted.

        >>> speed = RelativeSpeed()
        >>> for step in range(40):  # c is 2 x slower for 150 s, then as fast as a and b
        ...     slow = 0.0 if step >= 30 else np.log(2.0)
        ...     x = np.array([0.0, 0.0, slow]) + np.array([0.02, -0.02, 0.01]) * (-1) ** step
        ...     _ = speed.update(5.0 * step, ["a", "b", "c"], x, WeightConfig(), evidence_s=60.0)
        ...     if step in (29, 30):
        ...         print(step, speed.returning(["a", "b", "c"]))
        29 [False, False, False]
        30 [False, False, True]
        """
        apart, mean = self._apart, self._mean  # a run is only ever kept beside a mean
        return [replica in apart and apart[replica] * mean[replica] < 0.0 for replica in replicas]

    def refresh_due(self, now: float, every_s: float, phase: float = 0.0) -> bool:
        """Whether ``now`` is past the next refresh: the first of a grid of ``every_s`` shifted by
        ``phase`` x ``every_s`` after the kept costs (True when none are kept, or time went back).
        Pools on different phases refresh on different steps, so no step pays for all of them.

        >>> speed, refreshed = RelativeSpeed(), []
        >>> for t in range(100, 200, 5):  # the grid: 15 s past every 30 s
        ...     if speed.refresh_due(float(t), 30.0, phase=0.5):
        ...         speed.keep(float(t), [], np.zeros(0))
        ...         refreshed.append(t)
        >>> refreshed
        [100, 105, 135, 165, 195]
        """
        kept_at = self._kept_at
        if kept_at is None or now < kept_at:
            return True
        offset = phase * every_s
        return math.floor((now - offset) / every_s) > math.floor((kept_at - offset) / every_s)

    def watching(self, now: float) -> bool:
        """Whether a change is under way: a run of ratios beyond the noise is open, or the estimate
        restarted less than half a window ago (it holds or grows as the window fills). Such a pool
        is refreshed every step, off the grid: the estimate follows the change step by step."""
        if self._apart:
            return True
        if self._watch_until is not None and now <= self._watch_until:
            return True
        self._watch_until = None
        return False

    def keep(self, now: float, replicas: Sequence[str], costs: npt.NDArray[np.float64]) -> None:
        """Keep this step's guarded costs until the next refresh."""
        self._kept = {r: float(c) for r, c in zip(replicas, costs.tolist(), strict=True) if c != 1.0}
        self._kept_at = now

    def kept_costs(self, replicas: Sequence[str]) -> list[float]:
        """The kept cost of each replica (1.0: none kept)."""
        kept = self._kept
        return [kept.get(r, 1.0) for r in replicas] if kept else [1.0] * len(replicas)

    def forget(self, replica: str) -> None:
        for table in (self._mean, self._span, self._noise, self._seen, self._apart, self._peak, self._kept,
                      self._agree):
            table.pop(replica, None)

    def state_dict(self) -> dict[str, Any]:
        return {"last": self._last, "pool_noise": [self._pool_noise, self._pool_span],
                "pool_distances": [[when, list(ds)] for when, ds in self._pool_distances],
                "batch_slope": self.batch.state_dict(), "kept": [self._kept_at, dict(self._kept)],
                "watch_until": self._watch_until, "agree": dict(self._agree),
                "replicas": {replica: [self._mean[replica], self._span[replica], self._noise.get(replica),
                                       self._seen[replica], self._apart.get(replica), self._peak.get(replica)]
                             for replica in self._mean}}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
        self._last = state.get("last")
        self._pool_noise, self._pool_span = (float(v) for v in state.get("pool_noise") or (0.0, 0.0))
        self._pool_distances.extend((float(when), [float(d) for d in ds])
                                    for when, ds in state.get("pool_distances") or [])
        self.batch.load_state(state.get("batch_slope") or [])
        kept_at, kept = state.get("kept") or (None, {})
        self._kept_at = None if kept_at is None else float(kept_at)
        self._kept = {str(r): float(c) for r, c in dict(kept).items()}
        watch = state.get("watch_until")  # absent from an older checkpoint
        self._watch_until = None if watch is None else float(watch)
        self._agree = {str(r): float(v) for r, v in dict(state.get("agree") or {}).items()}
        for replica, (mean, span, noise, seen, apart, *peak) in (state.get("replicas") or {}).items():
            self._mean[replica], self._span[replica], self._seen[replica] = float(mean), float(span), float(seen)
            if noise is not None:
                self._noise[replica] = float(noise)
            if apart is not None:
                self._apart[replica] = float(apart)
            if peak and peak[0] is not None:  # a run's furthest distance (absent from an older checkpoint)
                self._peak[replica] = float(peak[0])


class BatchSlope:
    """The pool's own slope of log time per output token on log batch size, over the steps of the
    last ``span_s`` seconds: every replica of every such step is a point, centred on the points'
    medians, and the slope is a Huber regression's (a point further from the line than ``z`` times
    the residuals' normal-scaled median distance counts as that far, so one slow replica does not
    tilt it), kept within [0, 1]: a decode step does not get faster with more sequences, nor slower
    than in proportion to them (a batch's throughput, batch / time per token, does not fall as it
    grows). Evidence from the pool alone: no engine's constants.

    >>> fit = BatchSlope()
    >>> for end in range(0, 60, 5):  # time per token grows as batch^0.5, one replica twice as slow
    ...     b = np.array([4.0, 8.0, 16.0, 8.0]) * (1.0 + end / 100.0)
    ...     fit.update(float(end), np.log(b), 0.5 * np.log(b) + np.log([1.0, 1.0, 1.0, 2.0]), 60.0, 2.0)
    >>> round(fit.slope, 2)
    0.5
    """

    def __init__(self) -> None:
        self._steps: deque[tuple[float, list[float], list[float]]] = deque()  # (when, log batch, log cost)
        self.slope = 0.0

    def update(self, now: float, log_batch: npt.NDArray[np.float64], log_cost: npt.NDArray[np.float64],
               span_s: float, z: float) -> None:
        """Take a step's points (rows with both finite) and refit over the last ``span_s`` seconds."""
        ok = np.isfinite(log_batch) & np.isfinite(log_cost)
        if ok.any():
            self._steps.append((now, log_batch[ok].tolist(), log_cost[ok].tolist()))
        while self._steps and self._steps[0][0] <= now - span_s:
            self._steps.popleft()
        x = np.array([v for _, xs, _ in self._steps for v in xs])
        y = np.array([v for _, _, ys in self._steps for v in ys])
        if len(x) < _MIN_FIT_POINTS:
            self.slope = 0.0
            return
        x, y = x - np.median(x), y - np.median(y)
        weight = np.ones(len(x))
        slope = 0.0
        for _ in range(_HUBER_ROUNDS):  # iteratively reweighted least squares
            sxx = float(np.sum(weight * x * x))
            if sxx <= 0.0:
                break
            slope = float(np.sum(weight * x * y)) / sxx
            residual = np.abs(y - slope * x)
            scale = _MAD_TO_NORMAL * float(np.median(residual))
            weight = np.minimum(1.0, z * scale / np.maximum(residual, 1e-12)) if scale > 0 else np.ones(len(x))
        self.slope = min(max(slope, 0.0), 1.0)

    def state_dict(self) -> list[Any]:
        return [self.slope, [list(step) for step in self._steps]]

    def load_state(self, state: Sequence[Any]) -> None:
        self.__init__()  # type: ignore[misc]
        if state:
            self.slope = float(state[0])
            self._steps.extend((float(now), [float(v) for v in xs], [float(v) for v in ys]) for now, xs, ys in state[1])


_FIRST_STEP_S = 5.0  # the step before the first one is known (the windows' step)
_POOL_QUANTILE = 0.95  # the pool's noise: this percentile of its distances (module docstring, "Noise") ...
_POOL_Z = NormalDist().inv_cdf((1.0 + _POOL_QUANTILE) / 2.0)  # ... over a normal's for it (1.96)
_POOL_MIN_DISTANCES = round(1.0 / (1.0 - _POOL_QUANTILE))  # fewer: the median's normal equivalent (20)
_MAD_TO_SD = math.sqrt(math.pi / 2.0)  # mean absolute deviation -> standard deviation of a normal
_MAD_TO_NORMAL = 1.4826  # median absolute deviation -> standard deviation of a normal
_HUBER_ROUNDS = 5  # reweightings: the slope settles within a few
_MIN_FIT_POINTS = 6  # two steps of a three-replica pool: fewer fit nothing (slope 0)


__all__ = ["BatchSlope", "RelativeSpeed"]
