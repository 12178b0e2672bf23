"""How fast a step runs: the roofline of every operation (`operations`, `layer_operations`,
`operation_table`), the kernels' achieved efficiency (`kernels`), the collectives (`collectives`,
`communication`) and the step with its pipeline bubble (`roofline`). Imports `memory`, `models` and
`spec`.
"""
