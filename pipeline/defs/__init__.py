"""The Dagster wiring: the only part of ``pipeline`` that imports Dagster or Dagster Pipes.

``workspace.yaml`` loads :mod:`pipeline.defs.definitions`; the jobs, the PARTIAL sensor and its
pure policy, the ``torchrun`` entry point and the demo live beside it. Nothing is imported here,
so ``python -m pipeline.defs.train_launch`` under torchrun loads no Dagster.
"""
