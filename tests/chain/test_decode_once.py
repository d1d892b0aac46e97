"""One chain run decodes its input's ids once to verify it and once to index it; every later
step loads its inputs by receipt and from the saved index (issue: verify once per run).

The chain runs one asset per run, against one instance, so each step's own decoding is measured
by the counter the bundle checks and the index keep (:func:`pipeline.bundle.contents.ids_decoded`).
"""

from __future__ import annotations

import dagster as dg

from assets import CHAIN_ASSETS
from pipeline.bundle.contents import ids_decoded
from pipeline.bundle.verify import verify
from resources.compute.local import LocalCompute
from tests.helpers.chain import FAST_TRAINING

LINKS = CHAIN_ASSETS[1:]  # the six links, after the observed Compute versions


def test_each_step_decodes_the_input_ids_only_where_it_must(tmp_path, labelled_samples):
    job = labelled_samples.jobs["wine"]
    source = verify(LocalCompute(labelled_samples.compute_root).manifest_url(job))
    sha = source.identity.content_sha256
    items = sum(p.rows for p in source.manifest.parts)
    resources = labelled_samples.resources(tmp_path, "wine")
    decoded = {}
    with dg.instance_for_test() as instance:
        for link in LINKS:
            step = link.key.to_user_string()
            before = ids_decoded(sha)
            result = dg.materialize(
                CHAIN_ASSETS,
                selection=[step],
                resources=resources,
                run_config=FAST_TRAINING if step == "training_run" else None,
                instance=instance,
            )
            assert result.success, step
            decoded[step] = ids_decoded(sha) - before
    outstanding = source.manifest.outstanding.rows if source.manifest.outstanding else 0
    assert decoded == {
        "result_manifest": 0,
        "verified_snapshot": items + outstanding,  # verified once, in full
        "disjoint_index": items,  # indexed once
        "training_run": 0,
        "prediction_table": 0,
        "output_bundle": 0,
    }
