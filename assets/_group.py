"""The asset group every link of the chain belongs to, and the IO manager that links them."""

CHAIN_GROUP = "compute_chain"

#: The resource key of :class:`resources.dagster.io_manager.ChainIOManager`, which every link uses.
IO_MANAGER_KEY = "chain_io_manager"
