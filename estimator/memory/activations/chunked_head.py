"""torchtune's chunked output projection in backward: the LM head's weight gradient is made once per chunk and
summed, after every chunk's loss backward has run.

TransformerDecoder.chunked_output (torchtune 0.6.1 modules/transformer.py) projects each of the
num_output_chunks slices of the final hidden states with the head (`self.output(chunk)`; with tied embeddings a
TiedLinear over the embedding's weight), so the head's weight feeds one gradient node through n edges. In
backward, autograd's ready queue runs the node made last first (torch 2.13 torch/csrc/autograd/engine.cpp,
CompareNodeTaskTime: higher sequence_nr first); CEWithChunkedOutputLoss (modules/loss/ce_chunked_output_loss.py)
builds every chunk's cross-entropy after all n projections, so every chunk's loss backward runs before any
projection's: by then the loss's saved tensors are freed and every chunk's logits gradient (compute dtype) waits.
Then each projection's backward makes a [V, h] weight gradient, which the weight node's input buffer keeps (the
first) or sums into the one it holds (torch/csrc/autograd/input_buffer.cpp InputBuffer::add, accumulate): the
first sum out of place (the first gradient, the transpose of its matmul's output, fails can_accumulate_inplace's
test), the later ones in place into that sum (a real CPU run's profile, torch
2.13: aten::add once, then aten::add_; tests/test_torchtune_chunked_head.py). With tied embeddings the sum waits
there for the lookup's gradient at backward's end. Each chunk's hidden-state gradient waits in the split's input
buffer for the others. So the second chunk through the head holds three [V, h] tensors (the two chunks' gradients
and their sum) beside n-1 chunks' logits gradients.

Measured by the torchtune harness (fake tensors, torch 2.13, torchtune 0.6.1; Llama-3.2-3B, seq 2048, batch 1,
AC, optimizer in backward): backward starts at 19.381 GiB, the chunks' loss backward ends at 18.891 GiB, the
second chunk's sum reaches 20.974 GiB, backward's peak: 3 x 0.734 GiB plus seven eighths of the 0.489 GiB logits
gradients.
"""

from __future__ import annotations

from ...spec.architecture import Architecture
from ...spec.dtypes import bytes_per_element
from ...spec.parallel import Parallel
from ...spec.training import Training
from .entries import Entry, tokens_per_gpu

SOURCE = ("torchtune v0.6.1 modules/transformer.py TransformerDecoder.chunked_output, "
          "modules/loss/ce_chunked_output_loss.py; torch 2.13 torch/csrc/autograd/engine.cpp (CompareNodeTaskTime: "
          "the loss's nodes, made after the projections, run first) and input_buffer.cpp (InputBuffer::add: the "
          "first two chunks' weight gradients summed out of place, later ones in place); measured with "
          "validation/torchtune (llama-3.2-3b, s2048 b1, AC, optimizer in backward)")


def head_trained(arch: Architecture, training: Training) -> bool:
    """The head's weight gets a gradient: full fine-tuning, or an adapter run that trains the embeddings and head."""
    if training.adapter is None:
        return True
    from ..adapter_activations import trainable_weights
    return "head" in trainable_weights(training, arch)


def chunked_head_backward(arch: Architecture, training: Training, par: Parallel, vocab: int, chunks: int,
                          freed_by_loss: list[Entry]) -> tuple[list[Entry], list[Entry]] | None:
    """(made, freed) at the largest moment of the head's backward, beside the loss's saved tensors: `made` is
    alive then, `freed` (the loss's own saved tensors, `freed_by_loss`, and the head inputs of the chunks already
    through) is gone. The first chunk through the head holds one weight gradient, the second three (the two and
    their out-of-place sum), later ones two (summed in place); the k-th also the logits gradients of the n-k+1
    chunks not yet through and k chunks' hidden-state gradients. k = 1 or 2 is the largest. None when the head
    is frozen (no weight gradient, and the logits gradients alone stay below the loss's own backward)."""
    if not head_trained(arch, training):
        return None
    B, P = bytes_per_element(training.compute_dtype), bytes_per_element(training.param_dtype)
    T, h, n = tokens_per_gpu(training, par), arch.hidden_size, chunks

    def at_chunk(k: int) -> tuple[list[Entry], list[Entry]]:
        grads = 1 if k == 1 else 3
        made = [Entry(("two chunks' LM head weight gradients and their sum (made out of place)" if k == 2 else
                       "the first chunk's LM head weight gradient") + " (parameter dtype)", grads * vocab * h, P,
                      "tp", f"{grads}*P*V*h" if grads > 1 else "P*V*h", split_by_cp=False),
                Entry("logits gradients of the chunks not yet through the head", (n - k + 1) / n * T * vocab, B,
                      "tp", f"B*s*b*V*{n - k + 1}/{n}"),
                Entry("hidden-state gradients of the chunks through the head (the split's input buffer)",
                      k / n * T * h, B, "sp", f"B*s*b*h*{k}/{n}")]
        freed = list(freed_by_loss)
        if k > 1:
            freed.append(Entry("head input of the chunks already through the head", (k - 1) / n * T * h, B, "sp",
                               f"B*s*b*h*{k - 1}/{n}"))
        return made, freed

    def net(moment: tuple[list[Entry], list[Entry]]) -> float:
        made, freed = moment
        return sum(e.bytes(par) for e in made) - sum(e.bytes(par) for e in freed)

    return max((at_chunk(1), at_chunk(2)), key=net)
