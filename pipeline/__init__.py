"""The reader core: bundle format, staging, verification, index, split, datasets, reconcile.

Everything importable from here needs only pyarrow, torch, numpy and pydantic. The Dagster
wiring that lives in this package (``pipeline.definitions``, ``pipeline.sensor``,
``pipeline.jobs``) is imported explicitly by Dagster and never from here.
"""
