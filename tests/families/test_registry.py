"""The family registry: variants are declared once, by the decorator on their builder, and the
torch-free catalogue (read from the source text) and the running kernels modules agree."""

import subprocess
import sys
from pathlib import Path

import pytest

from moebench.errors import MoebenchError
from moebench.core.family import BUILTIN, DeclarationError, FamilySpec, Param, catalogue, declared_variants, get_family

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
    code = ("import sys; from moebench.core.family import catalogue; from moebench.core.spec import load_spec; "
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


def test_a_declaration_the_source_text_cannot_read_names_file_line_and_why(tmp_path):
    with pytest.raises(DeclarationError, match=r"kernels.py:3: @variant params=: `tuple\(P\)` is not a literal"):
        _family(tmp_path, "P = ('w',)\n@FAMILY.variant('a', doc='x', params=tuple(P))\ndef build(i, p, d): pass\n")


def test_shared_parameter_tuples_are_read_from_the_text(tmp_path):
    fam = _family(tmp_path, "W = ('w',)\nDOC = 'shared ' + 'doc'\n"
                            "@FAMILY.variant('a', doc=DOC, params=W)\ndef a(i, p, d): pass\n"
                            "@FAMILY.variant('b', doc=DOC, params=(*W,), env={'w': ('MY_W', 4)})\ndef b(i, p, d): pass\n"
                            "W = ()\n@FAMILY.variant('c', doc='x', params=W)\ndef c(i, p, d): pass\n")
    assert [(v.name, v.doc, v.params) for v in fam.variants.values()] == [
        ("a", "shared doc", ("w",)), ("b", "shared doc", ("w",)), ("c", "x", ())]  # as Python reads it, in order
    assert fam.variants["b"].env == {"w": ("MY_W", 4)}
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(MoebenchError, match="does not define build_inputs"):  # a toy: no kernel API
            fam.load()  # ... but the import ran, and the running module agreed with the text
    finally:
        sys.path.remove(str(tmp_path))
    assert all(v.builder is not None for v in fam.variants.values())


@pytest.mark.parametrize("source,why", [
    ("from x import W\n", "name W is imported at line 2"),
    ("W = list(('w',))\n", "name W is assigned at line 2 from something the text does not give"),
    ("if True:\n    W = ('w',)\n", "name W is assigned inside a block at line 2"),
    ("", "name W is not assigned at module level before this line"),
])
def test_a_name_the_text_cannot_give_says_exactly_why(tmp_path, source, why):
    with pytest.raises(DeclarationError, match=why):
        _family(tmp_path, source + "@FAMILY.variant('a', doc='x', params=W)\ndef build(i, p, d): pass\n")


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
    """A copy of the package whose act family has a declaration the catalogue cannot read."""
    import shutil

    for d in ("moebench", "sweeps", "configs"):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__"))
    k = tmp_path / "moebench" / "families" / "act" / "kernels.py"
    text = k.read_text()
    assert '@FAMILY.variant("legacy", params=("num_warps",),' in text
    k.write_text(text.replace('@FAMILY.variant("legacy", params=("num_warps",),',
                              '@FAMILY.variant("legacy", params=tuple(["num_warps"]),'))
    line = 1 + text[:text.index('@FAMILY.variant("legacy"')].count("\n")
    return tmp_path, f"{k}:{line}: @variant params=: `tuple(['num_warps'])` is not a literal"


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
