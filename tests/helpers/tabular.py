"""A table as a tabular user brings it (Palmer Penguins' shape): strings, a dictionary column,
numbers with nulls and NaNs, a list column no model takes, and the result columns."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

N = 600
ISLANDS = ["Biscoe", "Dream", "Torgersen"]
SITES = [f"site-{i:02d}" for i in range(40)]  # above the one-hot limit: embedded
FEATURES = ["island", "site", "bill", "year"]


def penguins(seed: int = 0, n: int = N, islands: list[str] = ISLANDS) -> pa.Table:
    """A result table: string, dictionary, nullable float (nulls and NaNs), nullable int."""
    rng = np.random.default_rng(seed)
    island_i = rng.integers(0, len(islands), n)
    site_i = rng.integers(0, len(SITES), n)
    bill = rng.normal(size=n)
    year = rng.integers(2007, 2010, n)
    holes = rng.random(n)
    status = np.where(rng.random(n) < 0.1, "failed", "accepted")
    accepted = status == "accepted"
    # the class is the island's, bill tells the last two apart: every feature matters
    kind = np.where(island_i == 0, "adelie", np.where(bill > 0, "gentoo", "chinstrap"))
    target = 10 * bill + 3 * (site_i % 4) + (year - 2008) + rng.normal(scale=0.1, size=n)
    # ~5% of islands, ~2% of bills (and ~2% NaN), ~3% of years missing, in different rows
    island = np.array(islands, dtype=object)[island_i]
    island[holes < 0.05] = None
    bill_values = bill.astype(object)
    bill_values[holes > 0.94] = np.nan
    bill_values[holes > 0.96] = None
    year_values = year.astype(object)
    year_values[(holes > 0.5) & (holes < 0.53)] = None
    return pa.table(
        {
            "id": pa.array([f"p{i:04d}" for i in range(n)]),
            "island": pa.array(island.tolist(), pa.string()),
            "site": pa.DictionaryArray.from_arrays(pa.array(site_i, pa.int32()), pa.array(SITES)),
            "bill": pa.array(bill_values.tolist(), pa.float64()),
            "year": pa.array(year_values.tolist(), pa.int64()),
            "kind": pa.array(np.where(accepted, kind, None).tolist(), pa.string()),
            "mass": pa.array(np.where(accepted, target, None).tolist(), pa.float64()),
            "tags": pa.array([["a"]] * n, pa.list_(pa.string())),  # no model takes it
            "lithi_status": pa.array(status),
            "lithi_confidence": pa.array(np.where(accepted, 0.9, None).tolist(), pa.float32()),
            "lithi_verification": pa.array(["agree"] * n),
        }
    )
