"""What is alive at a phase's peak, storage by storage: the evidence behind an estimator ledger.

`python -m validation explain --case ID` (and `python -m validation.<framework> explain CASE`, where
the harness declares its trace) groups the activations alive at each phase's peak by the op that
allocated them (with dtype and shape), largest first."""

from __future__ import annotations

from collections import Counter


def explain_trace(tracker, category, top: int = 40) -> str:
    lines = []
    for name, peak in tracker.peaks(category).items():
        lines.append(f"== {name}: peak {peak['total'] / 2**30:.3f} GiB")
        for c in ("parameters", "gradients", "optimizer_states", "activations"):
            lines.append(f"   {c:17s}{peak[c] / 2**30:10.3f} GiB")
        groups: Counter = Counter()
        counts: Counter = Counter()
        for key, size in tracker.live_at(peak["at"]).items():
            if category(key) == "activations":
                label = tracker.labels.get(key, "(alive before the step)")
                groups[label] += size
                counts[label] += 1
        for label, size in groups.most_common(top):
            lines.append(f"   {size / 2**20:12.2f} MiB  x{counts[label]:<4d} {label}")
    return "\n".join(lines)
