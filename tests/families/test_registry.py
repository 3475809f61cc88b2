"""The family registry: variants are declared once, by the decorator on their builder, and the
torch-free catalogue (read from the source text) and the running kernels modules agree."""

import subprocess
import sys
from pathlib import Path

import pytest

from moebench.families import BUILTIN, FamilySpec, Param, catalogue, declared_variants, get_family

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", BUILTIN)
def test_catalogue_and_kernels_module_agree(name):
    fam = get_family(name)
    assert fam.variants, name
    source = {v.name: v for v in declared_variants(Path(sys.modules[fam.kernels.rsplit(".", 1)[0]].__file__)
                                                   .with_name("kernels.py"), fam)}
    fam.load()
    assert list(source) == list(fam.variants)
    for vname, v in fam.variants.items():
        assert v.builder is not None, f"{name}.{vname} is declared but has no builder"
        assert v == source[vname]  # name, doc, params, env, source: the same on both sides
        for p in v.launch_params:
            assert fam.params[p].role == "launch", (name, vname, p)


def test_the_catalogue_imports_no_torch():
    code = ("import sys; from moebench.families import catalogue; from moebench.core.spec import load_spec; "
            "[load_spec(n) for n in ('count-block', 'act-grid', 'combine-lds', 'layer', 'layer-count', 'layer-act')]; "
            "cat = catalogue(); "
            "assert all(f.variants for f in cat.values()); "
            "bad = [m for m in ('torch', 'triton') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def _family(tmp_path, source: str) -> FamilySpec:
    pkg = tmp_path / "fam_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from moebench.families import FamilySpec, Param\n"
                                     "FAMILY = FamilySpec(name='toy', doc='toy', package=__name__, params={\n"
                                     "    'n': Param('n', int), 'w': Param('w', int, default=4, role='launch')})\n")
    (pkg / "kernels.py").write_text("from fam_pkg import FAMILY\n" + source)
    sys.path.insert(0, str(tmp_path))
    try:
        for m in [m for m in sys.modules if m.startswith("fam_pkg")]:
            del sys.modules[m]
        import fam_pkg

        return fam_pkg.FAMILY
    finally:
        sys.path.remove(str(tmp_path))


def test_a_declaration_the_source_text_cannot_read_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="must be literals"):
        _family(tmp_path, "P = ('w',)\n@FAMILY.variant('a', doc='x', params=P)\ndef build(i, p, d): pass\n")


def test_drift_between_source_and_module_is_caught(tmp_path):
    fam = _family(tmp_path, "@FAMILY.variant('a', doc='x', params=('w',))\ndef build(i, p, d): pass\n")
    assert list(fam.variants) == ["a"] and fam.variants["a"].builder is None
    fam.variants["a"].doc = "something else"  # as if the text said one thing and the module another
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(ValueError, match="differs from what the source text says"):
            fam.load()
    finally:
        sys.path.remove(str(tmp_path))


def test_unknown_launch_parameter_and_double_registration_are_refused():
    fam = FamilySpec(name="toy2", doc="", params={"w": Param("w", int, default=1, role="launch"),
                                                  "n": Param("n", int)})
    with pytest.raises(ValueError, match="'n' is not a launch parameter"):
        fam.variant("a", doc="", params=("n",))
    fam.variant("a", doc="", params=("w",))(lambda *a: None)
    with pytest.raises(ValueError, match="registered twice"):
        fam.variant("a", doc="", params=("w",))(lambda *a: None)
    assert "toy2" not in catalogue()
