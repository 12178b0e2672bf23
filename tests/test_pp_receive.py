"""torch pipelining's activation receive buffers and their .grad, moment by moment (estimator/memory/pp_receive.py,
pp_interleaved_moments.py), counted by hand on torch's own operation order."""

from __future__ import annotations

import json
from pathlib import Path

from estimator.memory.pp_interleaved_moments import counts_at_top, most_received, rank_operations
from estimator.memory.pp_receive import BUFFERS, GRADS, Receiving, receive_buffers

# rank 7 of interleaved 1F1B on PP 8, 2 chunks (8 and 7 blocks), 8 micro-batches: 8 chunk-0 forwards, then a
# chunk-1 forward and backward 8 times, then 8 chunk-0 backwards (ScheduleInterleaved1F1B, warm-up (2 - 1) x 8)
OPS = rank_operations(7, 8, 2, 8)
ONE = Receiving(1.0, "B*s*b*h/t", 8, (True, True), True)  # one byte a buffer: the counts are the bytes


def test_the_last_rank_runs_its_chunk_0_forwards_first():
    assert OPS[:8] == [("F", 0)] * 8 and OPS[8:24] == [("F", 1), ("B", 1)] * 8 and OPS[24:] == [("B", 0)] * 8


def test_the_forward_peak_is_the_latest_chunk_1_forward():
    """Every chunk-1 forward holds 8 x 8 + 7 = 71 blocks' inputs; the 8th has chunk 1's 7 backwards behind it: 7
    idle buffers (chunk 1 has 1 in flight) and 7 .grad, chunk 0 none idle (8 in flight)."""
    assert counts_at_top(OPS, (8, 7), ONE.along(7, 8, 2)) == ((8, 1), (0, 7))
    assert ONE.counts((8, 1), (0, 7)) == (7, 7)


def test_the_loss_moments_and_every_backward():
    """The loss's moments are chunk 1's backwards: the 8th starts with 7 run (7 idle, 7 .grad). Of every backward
    start the last chunk-0 one holds the most: chunk 0's 7 run, chunk 1's 8 (15 idle, 15 .grad)."""
    loss = most_received(OPS, 2, ONE.along(7, 8, 2), chunk=1)
    assert (loss.in_flight, loss.done, loss.received) == ((8, 1), (0, 7), 14.0)
    last = most_received(OPS, 2, ONE.along(7, 8, 2))
    assert (last.in_flight, last.done, last.received) == ((1, 0), (7, 8), 30.0)


def test_newer_torch_keeps_no_grad():
    newer = ONE._replace(grads_kept=False)
    assert newer.counts((1, 0), (7, 8)) == (15, 0)
    assert [c.label for c in newer.parts((1, 0), (7, 8), "x")] == [BUFFERS]


def test_1f1b_counts_by_hand():
    """1F1B stage 3 of PP 8 with 12 micro-batches: 5 in flight at its peaks, 12 - 5 = 7 idle buffers beside them
    and 7 backwards run (the first backward after the 1B1F loop); every one of the 12 once all ran."""
    from estimator.spec.parallel import Parallel

    rx = Receiving(3.0, "B*s*b*h", 12, (True,), True)
    par = Parallel(pp=8, dp=1, tp=1)
    sp = type("Stage", (), {"stage": 3, "chunks": (range(0, 4),)})()
    got = receive_buffers(rx, par, sp, 5.0)
    assert [(c.label, c.bytes) for c in got.forward] == [(BUFFERS, 21), (GRADS, 21)] == \
        [(c.label, c.bytes) for c in got.backward]
    assert [(c.label, c.bytes) for c in got.settled] == [(BUFFERS, 36), (GRADS, 36)]


def test_the_last_rank_when_its_loss_is_the_charged_moment():
    """Where the loss's moment is the larger (`loss_margin` >= 0), the last rank holds the receive buffers of
    chunk 1's latest backward (7 idle, 7 .grad of 2 B x (4 x 8192 / TP 8) x 16384 each on the 405B row) and
    nothing of the replay's savings."""
    from estimator.memory.pp_last_rank import fewer_on_the_last_rank
    from estimator.memory.pp_receive import receiving
    from estimator.memory.resolved import resolve
    from estimator.models.loading import load_config

    path = next((Path(__file__).parent / "data" / "measured" / "published" / "torchtitan").glob("*405b*interleaved*"))
    cfg = load_config(json.loads(path.read_text())["config"])
    res = resolve(cfg.architecture, cfg.training, cfg.parallel, cfg.hardware)
    last = res.stages[7]
    rx = receiving(res.architecture, res.training, res.parallel, last, res.microbatches)
    parts = fewer_on_the_last_rank(res.recipe, res.parallel, last, res.microbatches, 71 / 15, lambda k: 0, 1, rx)
    assert [(c.label, c.bytes) for c in parts] == [(BUFFERS, 7 * 2**27), (GRADS, 7 * 2**27)]


def test_an_interleaved_rank_without_the_replay_takes_its_latest_backward():
    """Where the schedule's replay does not run, an interleaved rank's backward peak holds the receive buffers of
    its backward start with the most: rank 7's last chunk-0 backward, 15 idle buffers and 15 .grad; where it runs,
    the replay adds them at its own moment (none here)."""
    from estimator.spec.parallel import Parallel

    par = Parallel(pp=8, vpp=2, dp=1, tp=1, pp_schedule="interleaved")
    sp = type("Stage", (), {"stage": 7, "chunks": (range(0, 8), range(8, 15))})()
    alone = receive_buffers(ONE, par, sp, 71 / 15, replayed=False)
    assert [(c.label, c.bytes) for c in alone.backward] == [(BUFFERS, 15), (GRADS, 15)]
    assert [(c.label, c.bytes) for c in alone.forward] == [(BUFFERS, 7), (GRADS, 7)]
    assert receive_buffers(ONE, par, sp, 71 / 15).backward == ()
