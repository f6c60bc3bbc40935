"""``bench/throughput``: the worker against the ceiling and the peers.

One invocation, one broker, one pre-produced dataset (:mod:`bench.throughput.dataset`: >= 1M
generator events, 128 replicas of 2 models, 8 partitions, once as single-event messages and once as
batches of 100), then every contender ``--runs`` times, round-robin so that the shared machine's
load drifts over all of them alike:

==============  ====================================================================================
case            what it does (:mod:`bench.throughput.contenders`, :mod:`bench.throughput.worker`)
==============  ====================================================================================
ceiling         aiokafka ``getmany`` + one JSON decode per message (fastest of orjson / msgspec)
ceiling-batch   the same on the batched topic
quix            Quix Streams, JSON deserializer (orjson), a stateless count
faust-decode    a Faust agent ``async for value in stream`` + decode: Faust's per-event cost alone
faust-window    the same + ``PartitionWindows.apply`` on one-row columns + ``close_steps`` per event
ours            ``skewwatch worker`` end to end on single-event messages
ours-batch      ``skewwatch worker`` end to end on batched messages
==============  ====================================================================================

The Faust cases read a prefix (``--faust-events``, default 50,000) of the same topic from the start:
at ~1k events/s a million events would take a quarter of an hour per run, and the per-event cost
is steady after the first thousand events.

Run: ``.venv/bin/python -m bench.throughput [--events 1000000] [--runs 3] [--profile]``; prints the
table and writes ``bench/results/throughput.json``.
"""
