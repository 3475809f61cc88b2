"""Every variant of every family in the catalogue, at the shapes the built-in sweeps check in CI:
it captures into a CUDA graph, the replay is bit-exact with its eager launch (and passes the
family's own check against the torch reference), and it changes nothing but its output: no
input, no guard cell, nothing else in the output's buffer. A variant added to a family is
covered without touching this file; one whose kernel source is missing here (an upstream kernel
not installed) is skipped with the reason."""

from pathlib import Path

import pytest

from moebench.core.family import REQUIRED, catalogue

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
MAX_SHAPES = 10  # per variant: the CI shapes of every built-in sweep of the family, first ones first


def _variants():
    return [pytest.param(fam.name, v, id=f"{fam.name}-{v}")
            for fam in catalogue().values() if not fam.host_only for v in fam.variants]


def family_cases(fam) -> tuple[list[dict], dict[str, dict]]:
    """The distinct shapes (as full parameter dicts) of the family's built-in sweeps, small ones
    first (their quick and quick-verify matrices, then each sweep's first full-size case), and
    the launch parameters each variant runs with there."""
    from moebench.core.cases import expand, shape_key
    from moebench.core.spec import load_spec

    small, large, launch = {}, {}, {}
    for path in sorted((ROOT / "sweeps").glob("*.yaml")):
        spec = load_spec(str(path))
        if spec.family.name != fam.name:
            continue
        quick = expand(spec, quick=True) + (expand(spec, quick=True, verify=True) if spec.verify else [])
        for into, cases in ((small, quick), (large, expand(spec)[:1])):
            for c in cases:
                into.setdefault(shape_key(c, fam.shape_params), dict(c.params))
                v = fam.variants[c.variant]
                launch.setdefault(c.variant, {k: c.params[k] for k in v.params if k in c.params})
    shapes = list(small.values()) + [p for k, p in large.items() if k not in small]
    return shapes, launch


def _bits(t):
    import torch

    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.view(ints[t.element_size()]) if t.dtype not in ints.values() else t


def _tensors(inp, output) -> dict:
    """Every tensor of an input set (one level of attributes), and the buffer the output is a view of."""
    import torch

    items = vars(inp).items() if hasattr(inp, "__dict__") else enumerate(inp if isinstance(inp, (list, tuple)) else [])
    found = {str(k): v for k, v in items if isinstance(v, torch.Tensor)}
    if output._base is not None:
        found["<output's buffer>"] = output._base
    return found


def _output_cells(t, output):
    """A bool mask over `t`: True where the element is one of `output`'s (the two share storage)."""
    import torch

    if (t.untyped_storage().data_ptr() != output.untyped_storage().data_ptr()
            or t.element_size() != output.element_size()):
        return None
    n = t.untyped_storage().nbytes() // t.element_size()
    marks = torch.zeros(n, dtype=torch.bool, device=t.device)
    marks.as_strided(output.shape, output.stride(), output.storage_offset()).fill_(True)
    return marks.as_strided(t.shape, t.stride(), t.storage_offset())


@pytest.mark.parametrize("family,variant", _variants())
def test_variant_captures_and_replays_bit_exactly(family, variant, gpu_log):
    import torch

    from moebench.core.device import detect
    from moebench.core.timing import capture
    from moebench.errors import Unavailable

    fam = catalogue()[family]
    impl = fam.load()
    dev = detect(False)
    shapes, launch = family_cases(fam)
    v = fam.variants[variant]
    defaults = {p: fam.params[p].default for p in v.params if fam.params[p].default is not REQUIRED}
    have = {**defaults, **launch.get(variant, {})}
    missing = [p for p in v.params if p not in have]
    assert not missing, f"no built-in sweep gives {variant} a value for {missing} and the family has no default"
    try:
        builder = fam.builder(variant)
    except Unavailable as e:
        pytest.skip(f"{family}/{variant}: {e}")
    checked = []
    inexact = None
    # variants that implement part of their family's shapes: the tiled kernel is SiLU-mul only;
    # megatron-core's fused MoE arm is a whole squared-ReLU step
    only = {("act", "tiled"): {"op": "silu_mul_bounded"}, ("layer", "mcore"): {"op": "squared_relu", "scope": "step"}}
    want = only.get((family, variant), {})
    shapes = [sh for sh in shapes if all(sh.get(k) == v for k, v in want.items())]
    if not shapes:
        pytest.skip(f"{family}/{variant}: no CI shape of the built-in sweeps has {want}")
    for shape in shapes[:MAX_SHAPES]:
        params, _ = fam.resolve(variant, {**shape, **have}, dev, {})
        inp = impl.build_inputs(params, "cuda", 0)
        try:
            built = builder(inp, params, dev)
        except Unavailable as e:
            pytest.skip(f"{family}/{variant}: {e}")
        expected = impl.reference(inp, params)
        # a launch that says it cannot be bit-exact (float atomics): its replays are held to the
        # family's own check against the reference instead
        inexact = getattr(built, "inexact", None)
        built.reset()
        built.launch()
        torch.cuda.synchronize()
        eager = built.output.clone()
        chk = impl.check(inp, built.output, expected, params)
        assert chk.ok, f"eager launch at {shape}: {chk.detail}"

        graph = capture([built.launch], launches=1, warmup=1)
        for replay in (1, 2):  # a second replay from a reset: nothing carried between replays
            built.reset()
            torch.cuda.synchronize()
            before = {k: t.clone() for k, t in _tensors(inp, built.output).items()}
            graph.replay()
            torch.cuda.synchronize()
            if inexact is None:
                assert torch.equal(_bits(built.output), _bits(eager)), f"replay {replay} differs from eager at {shape}"
            for name, old in before.items():
                new = _tensors(inp, built.output)[name]
                diff = _bits(new) != _bits(old)
                mask = _output_cells(new, built.output)
                if mask is not None:
                    diff &= ~mask
                assert not bool(diff.any()), f"replay {replay} changed {int(diff.sum())} cells of {name} at {shape}"
        chk = impl.check(inp, built.output, expected, params)
        assert chk.ok, f"replayed launch at {shape}: {chk.detail}"
        checked.append(shape)
        del graph
    varying = [k for k in fam.shape_params if len({str(s.get(k)) for s in checked}) > 1]
    exact = "replay = eager bit for bit (twice)" if inexact is None else f"replay passes the check (inexact: {inexact})"
    gpu_log(f"{len(checked)} shapes (varying {', '.join(varying) or 'nothing'}), launch {have}: eager = reference, "
            f"{exact}, inputs and guard cells untouched")
