"""The embedded Apache Kafka broker: fetched from Maven Central, formatted and started by the project.

A pinned Kafka release, single node, KRaft, on loopback; jars from Maven Central through the pom
beside :mod:`skewwatch.broker.jars`, cached between runs; Java 17+ and Maven are the only
prerequisites, and a missing one is a one-line error naming what to install.
``KAFKA_BOOTSTRAP`` / ``--bootstrap`` point at an existing cluster instead, and then nothing is started.

* :mod:`~skewwatch.broker.java`: finding Java 17+ and Maven;
* :mod:`~skewwatch.broker.jars`: the pinned version and :func:`ensure_kafka_jars` (Maven, once, cached);
* :mod:`~skewwatch.broker.process`: :class:`EmbeddedBroker` formats a data directory (once, so data
  survives restarts), starts ``kafka.Kafka`` in a child JVM and waits until a metadata request answers;
* :mod:`~skewwatch.broker.command`: ``skewwatch broker``, the same in the foreground until Ctrl-C;
* :mod:`~skewwatch.broker.errors`: :class:`BrokerError`, every failure as one actionable line.

Generic Kafka client helpers (``run_blocking``, ``describe_cluster``, ...) are in
:mod:`skewwatch.kafka_client`, ports in :mod:`skewwatch.ports`.

>>> from pathlib import Path
>>> broker = EmbeddedBroker(Path("/tmp/skewwatch-doctest"), port=19092)
>>> broker.bootstrap, broker.log_path.name, broker.running
('127.0.0.1:19092', 'server.log', False)
"""

from __future__ import annotations

from skewwatch.broker.errors import BrokerError
from skewwatch.broker.jars import ensure_kafka_jars, kafka_jars_dir, kafka_version
from skewwatch.broker.java import find_java
from skewwatch.broker.process import EmbeddedBroker

__all__ = ["BrokerError", "EmbeddedBroker", "ensure_kafka_jars", "find_java", "kafka_jars_dir", "kafka_version"]
