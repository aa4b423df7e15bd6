"""`ft-tuned`: each client picks its fine-tuning recipe on its own validation split (pure; no test data enters)."""

from __future__ import annotations

import numpy as np

POLICIES = ("ft-bnc", "ft-bng", "ft-bni")
LR_FACTORS = (0.1, 1.0, 10.0)
NO_FT = "none"


def candidates() -> list[tuple[str, float]]:
    """{BN C, BN G, BN I} x {base LR/10, base LR, base LR x10}, then "no fine-tuning" (the global model as is)."""
    return [(p, f) for p in POLICIES for f in LR_FACTORS] + [(NO_FT, 0.0)]


def select_by_validation(val_acc: np.ndarray, val_loss: np.ndarray) -> int:
    """Index of the candidate with the highest validation accuracy; ties go to the lower validation loss, then to
    the earlier candidate. Test results are not an argument: the choice cannot see them."""
    order = np.lexsort((np.arange(len(val_acc)), val_loss, -val_acc))
    return int(order[0])
