"""Published real-GPU memory of Megatron-LM runs, as records the estimator is held to (issue 22).

- ``golden``: Megatron-LM's functional tests (``tests/functional_tests/test_cases/<model>/<case>``):
  each case's ``model_config.yaml`` (the launch flags and environment) and its
  ``golden_values_<env>_<platform>.json`` (``mem-max-allocated-bytes`` / ``mem-allocated-bytes`` per
  iteration, written by ``megatron/training/training.py`` from ``torch.cuda.memory_stats()`` on the
  tensorboard writer's rank, the last global rank).
- ``simumax``: SimuMax's B200 release table (MooreThreads/SimuMax ``docs/b200``): Megatron-LM
  core_v0.14.0 on 8 x B200, every rank's ``torch.cuda.max_memory_allocated()``.
- ``replay``: a record's command line through our Megatron importer and the estimate, against what
  the GPU allocated (``python -m validation.published_megatron`` prints the table).

The builders read a git snapshot of each repository (the ``fetch`` tool's mirror); the records they
write are in tests/data/measured/published/ and are all the tests need.
"""
