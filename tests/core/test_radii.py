"""The radius cache: a draw's radius computed once per process, or put back from a run's record."""
import pytest

from reslm.core import radii
from reslm.core.errors import ReslmError


def test_a_named_draw_is_computed_once_and_recorded_by_name(monkeypatch):
    monkeypatch.setattr(radii, "_RADII", {})
    calls = []

    def compute():
        calls.append(1)
        return 2.5
    key = ("esn", 24, 0.1, 0)
    assert radii.radius_of("spectral", key, compute) == radii.radius_of("spectral", key, compute) == 2.5
    assert len(calls) == 1
    assert radii.radius_of("spectral", None, compute) == 2.5 and len(calls) == 2   # an unnamed draw: never kept
    name = radii.radius_name("spectral", key)
    assert radii.recorded_radii([name, radii.radius_name("singular", key)]) == {name: 2.5}


def test_remembered_radii_spare_the_computation(monkeypatch):
    monkeypatch.setattr(radii, "_RADII", {})
    key = ("esn", 8, 1.0, 3)
    radii.remember_radii({radii.radius_name("singular", key): 1.25})
    assert radii.radius_of("singular", key, lambda: pytest.fail("computed again")) == 1.25
    with pytest.raises(ReslmError, match="is not a recorded radius"):
        radii.remember_radii({radii.radius_name("spectral", key): -1.0})
