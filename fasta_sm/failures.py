"""What a backend's failure message states in figures, read once, outside the algorithm.

Backends say why a config failed in text, and state files and replay tables
keep that text as it was said. Triton's out-of-shared-memory error is the one
message that states how much a config needed and how much the device has;
the policy's shared-memory bound takes that ratio as a number and never sees
the wording.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

SHARED_MEMORY_ERROR = re.compile(r"out of resource: shared memory, Required: (\d+), Hardware limit: (\d+)")
"""Triton's OutOfResources message for shared memory: what the config needed, what the device has."""


def shared_memory_overshoot(failures: Mapping[int, str], n: int) -> np.ndarray:
    """Per config, the shared memory its failure said it needed over what the device has; NaN where unknown.

    Only Triton's out-of-shared-memory message says both figures; any other
    failure (or a config that did not fail) is NaN.
    """
    overshoot = np.full(n, np.nan)
    for index, message in failures.items():
        found = SHARED_MEMORY_ERROR.search(message)
        if found and int(found[2]) > 0:
            overshoot[index] = int(found[1]) / int(found[2])
    return overshoot
