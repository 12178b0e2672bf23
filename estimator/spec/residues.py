"""Counting layer indices in residue classes: which layers of a range are MoE, attention or a hybrid's
other kind when a model places them every N layers from an offset (closed forms, no loop over layers)."""

from __future__ import annotations

import math


def congruent_in(start: int, stop: int, residue: int, modulus: int) -> int:
    """How many i in start .. stop - 1 have i % modulus == residue % modulus: the multiples of
    the modulus in [start - residue, stop - residue), each bound counted by a floor division."""
    if stop <= start:
        return 0
    return (stop - 1 - residue) // modulus - (start - 1 - residue) // modulus


def congruent_in_both(start: int, stop: int, first: tuple[int, int], second: tuple[int, int]) -> int:
    """How many i in start .. stop - 1 are in both residue classes (residue, modulus). By the
    Chinese remainder theorem they form one class modulo lcm(m1, m2), or none when the residues
    differ modulo gcd(m1, m2)."""
    (r1, m1), (r2, m2) = first, second
    g = math.gcd(m1, m2)
    if (r2 - r1) % g:
        return 0
    # i = r1 + m1 * k with m1 * k = r2 - r1 (mod m2): k = (r2 - r1)/g * (m1/g)^-1 (mod m2/g)
    k = (r2 - r1) // g * pow(m1 // g, -1, m2 // g) % (m2 // g)
    return congruent_in(start, stop, r1 + m1 * k, m1 // g * m2)
