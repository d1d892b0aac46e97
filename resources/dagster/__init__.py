"""The Dagster side of the resources: thin ``ConfigurableResource``s and the chain's IO manager.

The engines they wrap (``resources.bundle_store``, ``resources.credentials``,
``resources.compute``, ``resources.settings``) import no Dagster; an import-linter contract says
so.
"""
