"""The measured step every training harness runs: step 1 unlogged (it creates the optimizer
states), then step 2 logged phase by phase; afterwards each storage takes the category of its
owner (parameters, gradients, optimizer states; everything else is an activation)."""

from __future__ import annotations

import gc
from contextlib import nullcontext

from .tracker import StorageTracker, categories


def fake_mode(fake: bool, real_inputs: bool = True):
    """FakeTensorMode for a measurement, nothing for the real CPU run that checks it.
    `real_inputs`: real tensors made before the mode (buffers built on the CPU, a fake world's
    objects) may enter it."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if not fake:
        return nullcontext()
    return FakeTensorMode(allow_non_fake_inputs=True) if real_inputs else FakeTensorMode()


def no_phase(name: str):
    return nullcontext()


def log_second_step(tracker: StorageTracker, step, owners, gradients):
    """Run `step(phase)` twice inside `tracker`, logging the second, and return the category of
    each storage key.

    `owners()` runs once step 1 is over: it registers what is alive (parameters, buffers, the
    batch, optimizer states) and returns the keys of the parameters and of the optimizer states.
    `gradients()` runs when step 2's "optimizer" phase starts (the backward is over: every
    gradient has its owner) and returns the gradient keys."""
    grads: set[int] = set()

    def phase(name: str):
        if name == "optimizer":
            grads.update(gradients())
        return tracker.phase(name)

    tracker.recording = False  # what building the model allocates is not the step's (start() resets the log)
    with tracker:
        step(no_phase)
        gc.collect()
        tracker.start()
        params, states = owners()
        step(phase)
        tracker.stop()
    return categories(params, grads, states)
