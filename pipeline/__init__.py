"""Train on Lithi Compute result bundles: the Dagster-free core, and the Dagster wiring apart.

This package imports nothing on purpose (``lithi-bundle verify`` must never load torch); import
from its subpackages, each of which says its dependencies:

- :mod:`pipeline.bundle` — the on-disk contract: format, manifest, stage, verify (pyarrow and
  pydantic only, no torch);
- :mod:`pipeline.readers` — a verified snapshot to torch batches: index, split, the datasets and
  sampler, loader, reconcile;
- :mod:`pipeline.training` — the trainer interface, the pipeline's side of a run, devices and
  the reference trainer (pure torch, no Dagster);
- :mod:`pipeline.tethered` — a launch that dies with its step (standard library only);
- :mod:`pipeline.cli` — ``lithi-bundle``;
- :mod:`pipeline.defs` — the Dagster wiring: definitions, jobs, sensor, schedule, the partial
  policy, the instance, the torchrun launch, the daemon harness, the demo and its samples.
"""
