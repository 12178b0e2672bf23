"""What each GPU holds: the memory model.

`memory.estimate` resolves the configuration (`resolved`, checked by `validation`), builds what the
stages share (`stage_shared`: the activation ledger of `activations/`, the loss, the communication
buffers), each stage's static part (`static_stage`: model `states`, `transients`, the moments of
the backward in `backward_moments` and `moe_moments`, `adapters`, `kbit`, `paged`, `offload`,
`fsdp1`, `deepep`, `workspaces`), then the phases and the `result`. `inference` and `rl` are the
two other modes; `references` sets the estimate beside published guides. Imports `models` and
`spec`.
"""
