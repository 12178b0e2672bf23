"""Which layout to run: the planner walks every layout on N GPUs (`layouts`), judges each by its
memory and speed (`evaluate`, `search`), stops on a watch (`watch`) and answers fastest first
(`planner`); `advice` says step by step what to change when a run does not fit. Imports `speed`,
`memory`, `models` and `spec`.
"""
