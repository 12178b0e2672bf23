"""What the user asks for, and nothing else: the floor every other layer stands on.

The field registry (`fields`, its `Field` in `field`, the allowed values in `choices`), the records
each section of the JSON config becomes (`architecture`, `training`, `parallel`, `hardware`,
`adapter`, `rl`, `serving`) with their checks (`values`, `errors`), the GPU catalog (`gpus`),
optimizers, dtypes and framework versions, the parsed `config`, the process memo (`memo`) and the
words the outputs share (`wording`). Nothing here imports from another layer.
"""
