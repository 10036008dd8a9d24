"""Held-out or calibration: one rule on the instance id, so no choice of ours picks the test set.

A session is *calibration* when the SHA-1 hex digest of its instance id, read as an integer,
is divisible by 10, and *held-out* otherwise: about a tenth of the sessions may be looked at
while tuning anything (thresholds, policies), the rest only to report results.
"""

from __future__ import annotations

import hashlib
from typing import Literal

Split = Literal["heldout", "calibration"]
SPLITS: tuple[Split, ...] = ("heldout", "calibration")


def sha1_of(instance_id: str) -> str:
    """The SHA-1 hex digest of the id's UTF-8 bytes."""
    return hashlib.sha1(instance_id.encode("utf-8")).hexdigest()


def split_of(instance_id: str) -> Split:
    return "calibration" if int(sha1_of(instance_id), 16) % 10 == 0 else "heldout"
