"""The only code that touches the outside: the Compute service, bundle storage, credentials.

Plain Python engines live in the submodules; ``resources.dagster_resources`` wraps them as thin
Dagster ``ConfigurableResource``s.
"""
