"""Shared fixtures: the real NeMo Gym example data and small servers run in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NEMO_GYM_DATA = REPO.parent / "shared" / "data" / "nemo-gym"


@pytest.fixture
def nemo_gym_data() -> Path:
    if not NEMO_GYM_DATA.is_dir():
        pytest.skip("the shared NeMo Gym example data is not beside this checkout")
    return NEMO_GYM_DATA
