"""The family registry: a built-in family declares its variants once, in its torch-free __init__,
and its kernels module binds their builders; a plugin declares and builds a variant in one call."""

import subprocess
import sys
from pathlib import Path

import pytest

from moebench.errors import MoebenchError
from moebench.core.family import BUILTIN, FamilySpec, Param, VariantSpec, catalogue, get_family

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", BUILTIN)
def test_every_declared_variant_gets_its_builder(name):
    fam = get_family(name)
    assert fam.variants, name
    fam.load()
    for vname, v in fam.variants.items():
        assert v.builder is not None, f"{name}.{vname} is declared but has no builder"
        for p in v.launch_params:
            assert fam.params[p].role == "launch", (name, vname, p)


def test_the_catalogue_imports_no_torch():
    code = ("import sys; from moebench.core.family import catalogue; from moebench.core.spec import load_spec; "
            "[load_spec(n) for n in ('count-block', 'act-grid', 'combine-lds', 'layer', 'layer-count', 'layer-act')]; "
            "cat = catalogue(); "
            "assert all(f.variants for f in cat.values()); "
            "bad = [m for m in ('torch', 'triton') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def _family(tmp_path, source: str) -> FamilySpec:
    """A toy family package: variant 'a' (reads launch parameter w) declared, kernels.py as given."""
    pkg = tmp_path / "fam_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from moebench.families import FamilySpec, Param, VariantSpec\n"
                                     "FAMILY = FamilySpec(name='toy', doc='toy', package=__name__, params={\n"
                                     "    'n': Param('n', int), 'w': Param('w', int, default=4, role='launch')},\n"
                                     "    variants=(VariantSpec('a', doc='x', params=('w',)),))\n")
    (pkg / "kernels.py").write_text("from fam_pkg import FAMILY\n" + source)
    sys.path[:] = [str(tmp_path)] + [p for p in sys.path if "fam_pkg" not in p and not (Path(p) / "fam_pkg").exists()]
    for m in [m for m in sys.modules if m.startswith("fam_pkg")]:
        del sys.modules[m]
    import fam_pkg

    return fam_pkg.FAMILY


def test_a_kernels_module_binds_the_declared_variants_only(tmp_path):
    try:
        fam = _family(tmp_path, "@FAMILY.builds('a')\ndef build(i, p, d): pass\n")
        assert list(fam.variants) == ["a"] and fam.variants["a"].builder is None  # nothing imported yet
        with pytest.raises(MoebenchError, match="does not define build_inputs"):  # a toy: no kernel API
            fam.load()  # ... but the import ran and bound the builder
        assert fam.variants["a"].builder is not None
        fam = _family(tmp_path / "b", "@FAMILY.builds('a', 'b')\ndef build(i, p, d): pass\n")
        with pytest.raises(ValueError, match="build builds variant 'b', which family 'toy' does not declare"):
            fam.load()
        fam = _family(tmp_path / "c", "build_inputs = input_bytes = reference = check = nonvacuity = work = print\n")
        with pytest.raises(LookupError, match="variant 'a' of 'toy' is declared but fam_pkg.kernels registers no"):
            fam.builder("a")
    finally:
        sys.path[:] = [p for p in sys.path if not p.startswith(str(tmp_path))]
    with pytest.raises(ValueError, match="'n' is not a launch parameter"):
        FamilySpec(name="toy5", doc="", params={"n": Param("n", int)}, variants=(VariantSpec("a", "", ("n",)),))


def test_a_builder_the_session_cannot_call_is_refused_at_registration():
    fam = FamilySpec(name="toy3", doc="", params={"w": Param("w", int, default=1, role="launch")})
    with pytest.raises(TypeError, match=r"builder build\(inp, params\) cannot be called as fn\(inputs, params, device\)"):
        @fam.variant("a", doc="", params=("w",))
        def build(inp, params):
            pass
    fam.variant("b", doc="")(lambda inputs, params, device=None, **extra: None)  # callable that way: fine
    host = FamilySpec(name="toy4", doc="", params={}, host_only=True)
    with pytest.raises(TypeError, match=r"cannot be called as fn\(params\)"):
        host.variant("a", doc="")(lambda inp, params, device: None)


def _broken_tree(tmp_path: Path) -> Path:
    """A copy of the package whose act family declares a variant that reads a shape parameter."""
    import shutil

    for d in ("moebench", "sweeps", "configs"):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__"))
    init = tmp_path / "moebench" / "families" / "act" / "__init__.py"
    text = init.read_text()
    assert 'VariantSpec("legacy", params=("num_warps",),' in text
    init.write_text(text.replace('VariantSpec("legacy", params=("num_warps",),', 'VariantSpec("legacy", params=("rows",),'))
    line = 1 + text[:text.index("FAMILY = FamilySpec(")].count("\n")
    return tmp_path, f"{init}:{line}: ValueError: variant 'legacy' of 'act': 'rows' is not a launch parameter"


def test_a_broken_family_breaks_only_itself(tmp_path):
    import json
    import os

    tree, where = _broken_tree(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "400", "TRITON_INTERPRET": "1"}
    env.pop("MOEBENCH_PLUGINS", None)

    def run(*args):
        return subprocess.run([sys.executable, "-m", "moebench", *args], cwd=tree, env=env, capture_output=True,
                              text=True, timeout=120)

    r = run("list")
    assert r.returncode == 0, r.stderr
    assert "persistent" in r.stdout and "combine" in r.stdout  # the other families are listed
    assert "BROKEN" in r.stdout and where in r.stdout.replace("\n", "")
    r = run("validate", "sweeps/act-grid.yaml")
    assert r.returncode == 2 and where in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = run("validate", "sweeps/count-block.yaml")
    assert r.returncode == 0, r.stderr
    results = tmp_path / "c.json"
    results.write_text(json.dumps(json.loads((ROOT / "results" / "h200" / "count-block.json").read_text())))
    r = run("show", str(results))
    assert r.returncode == 0 and "block_size" in r.stdout, r.stderr


def test_unknown_launch_parameter_and_double_registration_are_refused():
    fam = FamilySpec(name="toy2", doc="", params={"w": Param("w", int, default=1, role="launch"),
                                                  "n": Param("n", int)})
    with pytest.raises(ValueError, match="'n' is not a launch parameter"):
        fam.variant("a", doc="", params=("n",))
    fam.variant("a", doc="", params=("w",))(lambda *a: None)
    with pytest.raises(ValueError, match="registered twice"):
        fam.variant("a", doc="", params=("w",))(lambda *a: None)
    assert "toy2" not in catalogue()


def test_a_bound_is_written_with_every_digit():
    grid = Param("grid", int, min=0, max=1 << 20)
    assert grid.allowed() == "an integer from 0 to 1048576"
    assert grid.check((1 << 20) + 1) == "must be <= 1048576, got 1048577"
    assert Param("s", float, min=0.5).allowed() == "a number >= 0.5"
    assert Param("k", int, max=64).check(65) == "must be <= 64, got 65"
