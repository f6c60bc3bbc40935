"""The detection-quality scenario: one run of labelled fault pools and clean pools on one traffic shape.

One *run* = one shape (:mod:`skewwatch.sim.shapes`) x one seed. It holds independent model pools
of ``replicas`` replicas each (``REPLICAS`` unless set), every pool replaying the shape's trace at the shape's rate per
replica from its own offset (the pipeline keeps models apart, so this is a dozen scenarios per
simulation instead of one):

- one pool per replica fault kind (``long_tail``, ``slow_replica``, ``batch_collapse``,
  ``context_burst``, ``gpu_fault``, ``kv_pressure``, ``replica_silence``), the fault on replica
  ``seed % replicas`` of the pool from ``FAULT_AT_S``, with the faults' relative defaults
  (:mod:`skewwatch.sim.faults`);
- ``quiet_pool``: every replica of the pool receives nothing for ``QUIET_FOR_S`` (its engines
  idle, their telemetry going on) while the other pools keep event time moving;
- two clean pools at the shape's rate and ``low-rate``, a clean pool at ``LOW_RATE`` requests/s
  per replica whatever the shape.

**How long a fault lasts.** A fault must give the pipeline evidence to judge: it lasts
``FAULT_FOR_S`` or long enough for ``MIN_FAULT_REQUESTS`` requests to reach the faulty replica,
whichever is longer (conv@0.1x: 300 s, mooncake@0.1x: 1,223 s), and the run goes on ``GRACE_S`` +
30 s past the last fault. The router is ``round_robin``: no routing reaction changes what a fault
looks like.

>>> from skewwatch.sim.shapes import SHAPES
>>> s = Scenario(SHAPES["conv@1x"], seed=1)
>>> s.fault_for_s, s.run_s, s.faulty_index, len(s.pools())
(150.0, 420.0, 1, 11)
>>> [(lb["model"], lb["replica"], lb["kind"]) for lb in s.labels(0.0)][-2:]
[('replica_silence', 'r25', 'replica_silence'), ('quiet_pool', None, 'quiet_pool')]
>>> Scenario(SHAPES["mooncake@0.1x"], seed=1).fault_for_s > 1200
True
>>> big = Scenario.learned(SHAPES["conv@1x"], seed=1, replicas=32)
>>> big.name, big.replica("throughput_drop", big.faulty_index), big.fleet_config().replicas
('conv@1x/seed=1/learned/pool=32', 'r33', 32)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from skewwatch.sim.faults import Injection
from skewwatch.sim.fleet import FleetConfig
from skewwatch.sim.shapes import Shape

REPLICA_FAULTS: tuple[str, ...] = ("long_tail", "slow_replica", "batch_collapse", "context_burst", "gpu_fault",
                                   "kv_pressure", "replica_silence")
# faults no rule is meant for, the learned detector's: in runs of their own (Scenario.learned), whose
# faults start once it has learned the replicas
LEARNED_FAULTS: tuple[str, ...] = ("ttft_drift", "throughput_drop")
QUIET_POOL = "quiet_pool"
CLEAN_POOLS: tuple[str, ...] = ("clean-a", "clean-b")
LOW_RATE_POOL = "low-rate"
REPLICAS = 4  # per pool
LOW_RATE = 0.06  # requests/s per replica of the low-rate clean pool (<= 0.1 where the trace bunches up)
START_TS = 1_700_000_000.0
WARMUP_S = 60.0  # one window: not scored
FAULT_AT_S = 120.0
FAULT_FOR_S = 150.0  # at least
MIN_FAULT_REQUESTS = 30  # expected requests on the faulty replica during its fault, at least
QUIET_FOR_S = 180.0
GRACE_S = 90.0  # after a fault's end, an alert still belongs to it
TAIL_S = 30.0  # the run's last seconds are not scored (every pool's corrections reach the end before it)
LEARNED_FAULT_AT_S = 1200.0  # the learned detector's 10 min warm-up and a first quarter hour of its ranges
LEARNED_FAULT_FOR_S = 900.0  # ttft_drift's 10 min ramp, then 5 min at 2x


@dataclass(frozen=True, slots=True)
class Scenario:
    """One shape and seed; ``live_signals=False`` drops the engines' live gauges and histograms.

    The other fields shrink the run for tests (fewer pools, shorter faults); the benchmark uses
    the defaults.
    """

    shape: Shape
    seed: int
    live_signals: bool = True
    replica_faults: tuple[str, ...] = REPLICA_FAULTS
    quiet: bool = True
    clean: tuple[str, ...] = CLEAN_POOLS
    low_rate: bool = True
    min_fault_s: float = FAULT_FOR_S
    quiet_for_s: float = QUIET_FOR_S
    fault_at_s: float = FAULT_AT_S
    family: str = ""  # "" (the rules' runs) or "learned"
    replicas: int = REPLICAS  # per pool (larger pools: how the detectors do on pools nobody tuned for)

    @classmethod
    def learned(cls, shape: Shape, seed: int, live_signals: bool = True, replicas: int = REPLICAS,
                fault_at_s: float = LEARNED_FAULT_AT_S) -> Scenario:
        """The learned detector's run: its two faults and every rule's, from ``fault_at_s`` (after its
        warm-up; LEARNED_FAULT_AT_S by default, later: the replicas have more history before their
        faults) for LEARNED_FAULT_FOR_S, the clean pools (no quiet pool: it is the rules' case).

        >>> from skewwatch.sim.shapes import SHAPES
        >>> s = Scenario.learned(SHAPES["conv@1x"], seed=2)
        >>> s.name, s.pools()[:3], s.run_s
        ('conv@1x/seed=2/learned', ['ttft_drift', 'throughput_drop', 'long_tail'], 2220.0)
        >>> later = Scenario.learned(SHAPES["conv@1x"], seed=2, fault_at_s=2400.0)
        >>> later.name, later.run_s
        ('conv@1x/seed=2/learned/at=2400s', 3420.0)
        """
        return cls(shape, seed, live_signals, replica_faults=(*LEARNED_FAULTS, *REPLICA_FAULTS), quiet=False,
                   min_fault_s=LEARNED_FAULT_FOR_S, fault_at_s=fault_at_s, family="learned",
                   replicas=replicas)

    @property
    def name(self) -> str:
        return (f"{self.shape.name}/seed={self.seed}" + ("" if self.live_signals else "/no-live")
                + (f"/{self.family}" if self.family else "")
                + ("" if self.replicas == REPLICAS else f"/pool={self.replicas}")
                + ("" if self.family != "learned" or self.fault_at_s == LEARNED_FAULT_AT_S
                   else f"/at={self.fault_at_s:g}s"))

    @property
    def faulty_index(self) -> int:
        return self.seed % self.replicas

    @property
    def fault_for_s(self) -> float:
        needed = MIN_FAULT_REQUESTS / self.shape.rate_per_replica
        return float(max(self.min_fault_s, 5.0 * math.ceil(needed / 5.0)))

    @property
    def run_s(self) -> float:
        return self.fault_at_s + max(self.fault_for_s, self.quiet_for_s if self.quiet else 0.0) + GRACE_S + TAIL_S

    @property
    def scored(self) -> tuple[float, float]:
        """Event-time span whose alerts and corrections are scored, as offsets from the start."""
        return WARMUP_S, self.run_s - TAIL_S

    def pools(self) -> list[str]:
        """Model names of the run, in replica-numbering order."""
        return [*self.replica_faults, *([QUIET_POOL] if self.quiet else []), *self.clean,
                *([LOW_RATE_POOL] if self.low_rate else [])]

    def clean_pools(self) -> list[str]:
        return [*self.clean, *([LOW_RATE_POOL] if self.low_rate else [])]

    def replica(self, pool: str, index: int) -> str:
        return f"r{self.pools().index(pool) * self.replicas + index}"

    def injections(self) -> tuple[Injection, ...]:
        faults = [Injection(kind, self.replica(kind, self.faulty_index), self.fault_at_s, self.fault_for_s)
                  for kind in self.replica_faults]
        quiet = [Injection(QUIET_POOL, QUIET_POOL, self.fault_at_s, self.quiet_for_s)] if self.quiet else []
        return (*faults, *quiet)

    def labels(self, start_ts: float = START_TS) -> list[dict[str, Any]]:
        """Ground truth: one label per injection (the quiet pool's with ``replica`` null)."""
        return [inj.label(start_ts, inj.replica if inj.pool_level else inj.kind) for inj in self.injections()]

    def model_rates(self) -> tuple[float, ...]:
        rate = self.shape.rate_per_replica
        return tuple(self.replicas * (LOW_RATE if pool == LOW_RATE_POOL else rate) for pool in self.pools())

    def fleet_config(self) -> FleetConfig:
        return self.shape.fleet_config(models=tuple(self.pools()), replicas=self.replicas, policy="round_robin",
                                       model_rates=self.model_rates(), seed=self.seed,
                                       injections=self.injections(), live_signals=self.live_signals)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "shape": self.shape.describe(), "seed": self.seed,
                "live_signals": self.live_signals, "faulty_replica_index": self.faulty_index,
                "family": self.family or "rules", "fault_at_s": self.fault_at_s, "fault_for_s": self.fault_for_s,
                "quiet_for_s": self.quiet_for_s if self.quiet else None, "pools": self.pools(),
                "run_s": self.run_s, "scored_s": list(self.scored), "low_rate_per_replica": LOW_RATE}
