"""The local Compute service: a faithful simulator of the remote one, for the demo and the tests.

A job store on disk (``jobstore``), attempts run by a worker process (``worker``) with the
labellers it applies (``labeller``), and the :class:`LocalCompute` client over them
(``service``). Nothing here is needed to train on a real Compute service's bundles.
"""

from resources.compute.local.service import LocalCompute

__all__ = ["LocalCompute"]
