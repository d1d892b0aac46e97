"""What the chain uses from outside the core: Compute clients, bundle storage, credentials.

The engines are plain Python (``bundle_store``, ``credentials``, ``compute``, and ``settings``
for the ``LITHI_*`` variables); ``resources.dagster`` wraps them as Dagster resources and holds
the chain's IO manager.
"""
