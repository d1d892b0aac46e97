"""The asset group every link of the chain belongs to (what the job selects and the UI shows)."""

CHAIN_GROUP = "compute_chain"
