"""A Mamba-2 mixer's scan on transformers 5.17's torch fallback (training.ssm_kernels "torch_5.17") in the allocator
replay (reserved.py): the broadcast products its forward makes and frees, and the two full-size operand gradients
per product its backward makes at once.

transformers 5.17.0 models/falcon_h1/modeling_falcon_h1.py torch_forward (cited FH, its line numbers at 5.17.0;
modeling_mamba2.py and modeling_nemotron_h.py the same ops) contracts by broadcasting and summing:
    G = (C[:, :, :, None] * B[:, :, None]).sum(-1)                       FH 530  (b, c, L, L, H, n)
    M = (G[..., None] * L[..., None]).sum(-1)                            FH 533  (b, c, L, L, H): small
    Y_diag = (M[..., None] * hidden_states[:, :, None]).sum(3)           FH 536  (b, c, L, L, H, p)
    states = (B_decay[..., None, :] * hidden_states[..., None]).sum(2)   FH 542  (b, c, L, H, p, n)
    new_states = (decay_chunk[..., None, None] * states[:, :, None]).sum(1)  FH 553  (b, c + 1, c + 1, H, p, n)
    C_times_states = C[..., None, :] * states[:, :, None]; .sum(-1)      FH 559-560  (b, c, L, H, p, n)
Each product is made, its sum made beside it, and the product freed (nothing keeps it: the sum's backward needs
only the shape), so in forward each is a request freed at once, in this order. In backward each product's
MulBackward0 makes both operands' gradients at the product's full size before the engine sums them to the
operands' shapes (torch/csrc/autograd/engine.cpp validate_outputs: at::sum_to), both alive at once, the products in
reverse order. As recorded by the fake-tensor harness under 5.17.0 (validation/allocator_trace.py --fallback;
tests/data/measured/allocator/falcon-h1-0.5b-*: per layer 24, 12, 12, 12.2 and 12 GiB in forward at s16384, the
pairs 12, 12.2, 12, 12 and 24 GiB in backward). The ledger's scan tensors are made in the source's order around
the products (`scan`: a sum is made while its product lives, so it is never cut from the product's block; Y_diag,
the states' sum, Y_off and C_times_states, a local until the function returns, are held, not kept); the pairs come
at the start of the layer's backward, with all its tensors alive (the MLP's few hundred MB, freed before the
mixer's backward on the GPU, are left in).
transformers 5.18 and later (ssm_kernels "torch") contract by einsum (bmm over copies the ledger keeps: at most
1.6 GB a request on the measured runs): the replay takes the ledger's tensors alone there, -1.8% and -0.4% against
the H200 at s4096 b2 and s16384 b1 (the recorded sequences +0.04% and +0.5%). What it leaves out there is the
einsums' own transients (their outputs before the reshape, the bmms' operand copies in backward): at s4096 b2 the
recorded sequence maps 360 segments of 96 MiB and 361 of 48 MiB (the GPU 360 and 362), the ledger's 288 and 216.
"""

from __future__ import annotations

from typing import NamedTuple

from .activations.mamba_torch import BROADCAST, BROADCAST_SOURCE, broadcast_products, chunks

SCAN_OUTPUT = "C_times_states and the scan output, padded (fp32)"  # activations/mamba_torch.py's entries
CHUNK_DECAY = "chunk decay (fp32)"
SOURCE = BROADCAST_SOURCE + " (FH 506-576, the replay's order: estimator/memory/reserved_mamba.py); torch/csrc/autograd/engine.cpp validate_outputs (at::sum_to)"
KEEP, PRODUCT, SUM, HOLD, RELEASE = range(5)  # `Scan.program`'s steps


class Scan(NamedTuple):
    """A layer's scan in the replay: its requests `start` to `end` (the ledger's scan entries, from L, G and M to
    the scan output) made by `program`, steps (KEEP, the section's request index), (PRODUCT, bytes) made,
    (SUM, the section's request index) kept beside it, then the product freed, (HOLD, bytes) made and held,
    (RELEASE, k) the k-th held freed; `products`, the products' bytes in forward's order."""

    start: int
    end: int
    program: tuple[tuple[int, int], ...]
    products: tuple[int, ...]


def scan(cfg, entries, requests) -> Scan | None:
    """The scan of a layer whose entries hold a Mamba-2 scan on 5.17's fallback (None: none), in FH 506-566's
    order; `requests(entries)`: their requests. The ledger's scan entries (activations/mamba_torch.py
    broadcast_scan_entries, CHUNK_DECAY, SCAN_OUTPUT) stand in the layer's entries in that order."""
    from .activations.mamba_torch import broadcast_scan_entries
    if cfg.training.ssm_kernels != BROADCAST:
        return None
    arch, training, par = cfg.architecture, cfg.training, cfg.parallel
    names = [e.name for e in entries]
    section = [e.name for e in broadcast_scan_entries(arch, training, par)] + [CHUNK_DECAY, SCAN_OUTPUT]
    if section[0] not in names:
        return None
    i = names.index(section[0])
    if names[i:i + len(section)] != section:
        return None
    start = len(requests(entries[:i]))
    sizes = requests(entries[i:i + len(section)])
    # the section's requests, by entry: L, G, M (0-2), x * dt (3), C, B, B * decay (4-6), decay_states and
    # exp(A_cumsum) (7, 8), the states with the initial one and the new states (9, 10), the chunk decay (11),
    # C_times_states' sum and the scan output (12, 13)
    if len(sizes) != 14:  # an empty entry (no request): not this path
        return None
    products = broadcast_products(arch, training, par)
    g, y, states, new_states = (int(size + 0.5) for size in products.values())
    b, c = training.micro_batch_size, chunks(arch, training, par)
    summed = int(4 * b * c * arch.mamba_num_heads * arch.mamba_head_dim * arch.mamba_state_size / par.tp + 0.5)
    program = (
        (KEEP, 4), (KEEP, 5),  # B and C repeated to every head (FH 507-508; pad_tensor_by_size's copies)
        (KEEP, 3),  # x * dt in chunks (FH 516)
        (KEEP, 0),  # L = exp(segment_sum(A)) (FH 527)
        (PRODUCT, g), (SUM, 1),  # G (FH 530)
        (PRODUCT, sizes[2]), (SUM, 2),  # M: (G x L), b x c x L x L x H, summed (FH 533)
        (PRODUCT, y), (HOLD, sizes[13]),  # Y_diag (FH 536): held until the output
        (KEEP, 7), (KEEP, 6),  # decay_states, B_decay (FH 540-541)
        (PRODUCT, states), (HOLD, summed),  # states (FH 542)
        (KEEP, 9), (RELEASE, 1),  # torch.cat with the initial state (FH 551); the sum freed
        (KEEP, 11),  # the chunk decay (FH 552)
        (PRODUCT, new_states), (SUM, 10),  # new_states (FH 553)
        (KEEP, 8),  # exp(A_cumsum) (FH 558)
        (HOLD, states), (KEEP, 12),  # C_times_states, a local until the return, and its sum (FH 559-560)
        (HOLD, sizes[13]), (KEEP, 13),  # Y_off, then output = Y_diag + Y_off (FH 560-563)
        (RELEASE, 3), (RELEASE, 0), (RELEASE, 2),  # Y_off, Y_diag, C_times_states (at the return, FH 576)
    )
    return Scan(start, start + len(sizes), program, (g, sizes[2], y, states, new_states, states))


def made(prog, sizes: list[int], scan: Scan) -> list:
    """The layer's requests `sizes`, the scan's by its program; the kept blocks in the order made."""
    out = prog.many(sizes[:scan.start])
    section = sizes[scan.start:scan.end]
    held, product = [], None
    for step, value in scan.program:
        if step == KEEP:
            out.append(prog.alloc(section[value]))
        elif step == PRODUCT:
            product = prog.alloc(value)
        elif step == SUM:
            out.append(prog.alloc(section[value]))
            prog.free(product)
            product = None
        elif step == HOLD:
            held.append(prog.alloc(value))
            if product is not None:  # a product summed into a tensor held, not kept
                prog.free(product)
                product = None
        else:
            prog.free(held[value])
    return out + prog.many(sizes[scan.end:])


def backward(prog, scan: Scan) -> None:
    """Each product's two operand gradients at its full size, made together and freed once summed, the last
    product's first."""
    for size in reversed(scan.products):
        prog.free(prog.alloc(size), prog.alloc(size))
