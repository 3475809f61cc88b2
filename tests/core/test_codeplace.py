"""Code placements: group g > 0 launches its own load of each kernel, restored after its capture."""

from moebench.core import codeplace


class FakeKernel:
    def __init__(self, name):
        self.function = f"{name}-own"


def test_group_zero_records_and_later_groups_swap(monkeypatch):
    loads = []

    def fake_load(kernel, g):
        loads.append((kernel, g))
        return f"{kernel.function.split('-')[0]}-load{g}"

    monkeypatch.setattr(codeplace, "_load", fake_load)
    a, b = FakeKernel("a"), FakeKernel("b")
    code = codeplace.CodePlacements()
    with code(0):
        pass
    assert code.kernels == set()  # nothing launched: nothing to reload
    code.kernels = {a, b}
    seen = []
    with code(2):
        seen = sorted([a.function, b.function])
    assert seen == ["a-load2", "b-load2"]
    assert (a.function, b.function) == ("a-own", "b-own")  # restored after the capture
    with code(0):  # group 0 never swaps
        assert a.function == "a-own"
    assert {g for _, g in loads} == {2}


def test_restored_when_the_capture_fails(monkeypatch):
    monkeypatch.setattr(codeplace, "_load", lambda k, g: "other")
    k = FakeKernel("k")
    try:
        with codeplace.placed({k}, 1):
            raise RuntimeError("capture failed")
    except RuntimeError:
        pass
    assert k.function == "k-own"


def test_tracking_without_compiled_kernels_is_empty():
    # under the interpreter nothing is compiled: tracking yields an empty set, never fails
    with codeplace.tracking() as seen:
        pass
    assert seen == set()
