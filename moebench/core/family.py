"""Kernel families: what a family declares, the registry, and the contract with the case pipeline
(a family's folder, and what a plugin registers: docs/plugins.md).

This module is core: it knows no family. It finds the built-in ones by package name
(``moebench.families``, every sub-package) when the catalogue is first asked for. The catalogue
knows every variant without importing torch; importing ``kernels.py`` (when a sweep runs) attaches
the builders. A family whose package fails breaks only itself: the catalogue leaves it out,
``broken()`` names it with its FILE:LINE error (``list`` shows it), and using it is a usage error.

A *parameter* is a shape parameter (``role="shape"``: it decides the inputs, and variants that
share them must agree bit for bit) or a launch parameter (``role="launch"``: block size, grid
cap, warps; it only changes how the same work is launched).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
import traceback
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from moebench import tritonpatch
from moebench.core.text import one_line, show
from moebench.errors import UsageError
from moebench.sources.plugins import current_source, current_suffix, load_installed, on_failure

REQUIRED = object()

# The built-in families: every sub-package of moebench.families (a new folder is a new family,
# nothing to register); plugins add to the catalogue at run time. Found by name, not imported:
# the contract sits below the families.
FAMILIES_PACKAGE = "moebench.families"
_FAMILIES_DIR = Path(importlib.util.find_spec(FAMILIES_PACKAGE).origin).parent
BUILTIN = tuple(sorted(m.name for m in pkgutil.iter_modules([str(_FAMILIES_DIR)]) if m.ispkg))


@dataclass(frozen=True)
class Param:
    name: str
    type: type
    default: Any = REQUIRED
    role: str = "shape"  # "shape" | "launch"
    choices: tuple | None = None
    pow2: bool = False
    min: float | None = None
    max: float | None = None
    model_key: str | None = None  # default taken from the model config under this key
    auto: str | None = None  # a value of 0 means this DeviceInfo attribute (grid 0 = sm_count)
    help: str = ""
    # the value names a variant of this family (the layer's count_variant): the accepted values are
    # the variants registered when the value is checked, plugins' included, not those at import
    variant_of: str | None = None

    def accepted(self) -> tuple | None:
        """The values `choices` allows, or the variants `variant_of` has now; None for any value."""
        if self.variant_of is not None:
            return tuple(get_family(self.variant_of).variants)
        return self.choices

    def check(self, value: Any) -> str | None:
        """What was expected, if `value` is not acceptable; else None."""
        if self.type in _KINDS:
            accepts, name = _KINDS[self.type]
            # isinstance(True, int) holds, but a bool is only a bool here
            if not isinstance(value, accepts) or (isinstance(value, bool) and self.type is not bool):
                return f"expected {name}, got {show(value)}"
        choices = self.accepted()
        if choices is not None and value not in choices:
            return f"expected one of {', '.join(map(str, choices))}; got {show(value)}"
        if self.pow2 and (value <= 0 or value & (value - 1)):
            return f"must be a power of two, got {value}"
        if self.min is not None and value < self.min:
            return f"must be >= {_bound(self.min)}, got {value}"
        if self.max is not None and value > self.max:
            return f"must be <= {_bound(self.max)}, got {value}"
        return None

    def allowed(self) -> str:
        """The accepted values, as a phrase for an error message."""
        bits = []
        choices = self.accepted()
        if choices is not None:
            return "one of " + ", ".join(map(str, choices))
        if self.pow2:
            bits.append("a power of two")
        else:
            bits.append(_KINDS[self.type][1])
        if self.min is not None and self.max is not None:
            bits.append(f"from {_bound(self.min)} to {_bound(self.max)}")
        elif self.min is not None:
            bits.append(f">= {_bound(self.min)}")
        elif self.max is not None:
            bits.append(f"<= {_bound(self.max)}")
        return " ".join(bits)


# a parameter type: the values it accepts (a bool is not a number here), and its name in messages
_KINDS = {
    int: ((int,), "an integer"),
    float: ((int, float), "a number"),
    str: ((str,), "a string"),
    bool: ((bool,), "true or false"),
}


def _bound(x: float) -> str:
    """A bound as written: every digit of a whole number (1048576, not :g's 1.04858e+06)."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


@dataclass
class VariantSpec:
    """A named launch configuration of a family."""

    name: str
    doc: str
    params: tuple[str, ...] = ()  # launch parameters this variant reads from the spec
    # launch parameter -> (kill-switch variable, shipped default): read from the environment at
    # resolve time
    env: dict[str, tuple[str, Any]] = field(default_factory=dict)
    source: str = "builtin"  # builtin | upstream | plugin FILE
    # an upstream variant names moebench's variants that implement the same kernel (its twins)
    twins: tuple[str, ...] = ()
    builder: Callable | None = field(default=None, repr=False, compare=False)
    # the variant's own work model, work(params, geometry, device) -> dict (bytes, ctas,
    # ctas_with_work, ...), where its kernel moves other bytes than the family's; else the family's
    work: Callable | None = field(default=None, repr=False, compare=False)

    @property
    def launch_params(self) -> tuple[str, ...]:
        """Every launch parameter the variant runs with: from the spec, then from the environment."""
        return tuple(self.params) + tuple(k for k in self.env if k not in self.params)


@dataclass(frozen=True)
class Preset:
    """How `moebench plot` draws a family by default."""

    x: str  # the swept launch parameter, on a log2 axis
    series: str  # one line per value
    title: str
    floor_panel: bool = False  # add a x-floor panel (x_floor against x)


@dataclass(kw_only=True, eq=False, repr=False)
class FamilySpec:
    """A kernel family's declarations. A built-in family declares its variants here (`variants`)
    and its kernels module (`package`.kernels) binds their builders; a plugin registers a variant
    and its builder at once (`variant`) as its file runs.

    `layers_per_launch(params)`: how many MoE layers one launch covers (1 unless the launch is a
    whole multi-layer step); per-step projections multiply by moe_layers / that.
    `graph_launches(params, spec_value)`: launches to capture per graph for this case, where one
    launch can be far longer than the µs-scale kernels the spec's value is set for.
    `resolve_more(variant, params, device, environ)`: a family whose launch builds other families'
    variants (the layer) resolves their launch values there, from the same environ, once per case;
    what it returns is added to the parameters the builder gets."""

    name: str
    doc: str
    params: dict[str, Param]
    # the module with the kernels, reference, inputs and variants: a built-in family's
    # `package`.kernels, or a plugin's own module (`kernels`)
    package: InitVar[str | None] = None
    kernels: str | None = None
    variants: Any = ()  # declared as a tuple of VariantSpec, kept as a dict by name
    rules: tuple[tuple[str, str], ...] = ()
    host_only: bool = False
    default_pivot: dict = field(default_factory=dict)
    plot: Preset | None = None
    cost: Callable[[dict], int] | None = None
    # how close a seed kernel must time to its upstream twin to count as the same mechanism
    twin_tolerance: float | None = None
    layers_per_launch: Callable[[dict], int] | None = None
    graph_launches: Callable[[dict, int], int] | None = None
    # the reference reads state a variant's builder prepares: never computed ahead of the build
    reference_after_build: bool = False
    resolve_more: Callable[[str, dict, Any, Mapping[str, str]], dict] | None = None
    origin: str = field(default="builtin", init=False)  # or the plugin that registered it (register_family)

    def __post_init__(self, package: str | None) -> None:
        self.default_pivot = dict(self.default_pivot or {})
        self.kernels = f"{package}.kernels" if package else self.kernels
        declared, self.variants = self.variants, {}
        for v in declared:
            self._check_declaration(v)
            self.variants[v.name] = v

    def __repr__(self) -> str:
        return f"FamilySpec({self.name!r}, variants={list(self.variants)})"

    @property
    def shape_params(self) -> tuple[str, ...]:
        return tuple(n for n, p in self.params.items() if p.role == "shape")

    @property
    def launch_params(self) -> tuple[str, ...]:
        return tuple(n for n, p in self.params.items() if p.role == "launch")

    def variant(self, name: str, *, doc: str, params: tuple[str, ...] = (),
                env: dict[str, tuple[str, Any]] | None = None, source: str | None = None,
                twins: tuple[str, ...] = (), work: Callable | None = None):
        """Decorator: `fn` builds variant `name`. For a kernel family, fn(inputs, params, device)
        -> Built; for a host-only family, fn(params) -> dict of results. `source` defaults to
        "builtin", or "plugin FILE" while a plugin file registers it; an arm's file (`pr --on
        plugin=FILE`) registers `name` + its suffix ("histogram@on"). `work(params, geometry,
        device) -> dict` is the variant's own work model (bytes moved, ctas, ctas_with_work, ...:
        what its floors are read against); without one the family's `work` stands for it."""
        name += current_suffix()
        if work is not None and not callable(work):
            raise TypeError(f"variant {name!r} of {self.name!r}: work= must be a function work(params, geometry, "
                            f"device) -> dict, got {show(work)}")
        declared = VariantSpec(name, doc, tuple(params), dict(env or {}), source or current_source() or "builtin",
                               tuple(twins), work=work)
        self._check_declaration(declared)

        def register(fn: Callable) -> Callable:
            problem = self.builder_problem(fn)
            if problem:
                raise TypeError(f"variant {name!r} of {self.name!r}: {problem}")
            have = self.variants.get(name)
            if have is not None and have.builder is not fn:
                raise ValueError(f"variant {name!r} of family {self.name!r} is registered twice "
                                 f"({have.source} and {declared.source}); give the new one another name")
            if have is None:
                declared.builder = fn
                self.variants[name] = declared
                on_failure(lambda: self.variants.pop(name, None))  # a plugin that then fails registers nothing
            return fn

        return register

    def builds(self, *names: str):
        """Decorator: `fn` builds the variants `names`, which the family declares (a built-in
        family's kernels module binds its builders this way)."""

        def bind(fn: Callable) -> Callable:
            problem = self.builder_problem(fn)
            for n in names:
                v = self.variants.get(n)
                if v is None:
                    raise ValueError(f"{getattr(fn, '__name__', fn)} builds variant {n!r}, which family "
                                     f"{self.name!r} does not declare ({', '.join(self.variants) or 'none'})")
                if problem:
                    raise TypeError(f"variant {n!r} of {self.name!r}: {problem}")
                v.builder = fn
            return fn

        return bind

    def _check_declaration(self, v: "VariantSpec") -> None:
        for p in v.launch_params:
            if p not in self.params or self.params[p].role != "launch":
                raise ValueError(f"variant {v.name!r} of {self.name!r}: {p!r} is not a launch parameter of the "
                                 f"family ({', '.join(self.launch_params) or 'none'})")

    def builder_problem(self, fn: Callable) -> str | None:
        """Why the session could not call `fn` as this family's builder, or None: a kernel family
        calls fn(inputs, params, device), a host-only family fn(params)."""
        expected = "fn(params)" if self.host_only else "fn(inputs, params, device)"
        if not callable(fn):
            return f"the decorated object is not a function; a builder is {expected}"
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            return None  # a builtin or C callable: nothing to read, the call will tell
        try:
            sig.bind(*((None,) if self.host_only else (None, None, None)))
        except TypeError as e:
            return (f"its builder {getattr(fn, '__name__', fn)}{sig} cannot be called as {expected}, as the "
                    f"session calls it ({e})")
        return None

    def work_model(self, variant: str, module) -> Callable:
        """The work model a variant's records use: its own, else the family's (`module.work`)."""
        return self.variants[variant].work or module.work

    def borrowed_work(self, variants) -> list[str]:
        """Of `variants`, the plugin variants of a family the plugin did not declare that bring no
        work model of their own: their bytes, CTAs with work and floors are the family's model."""
        out = []
        for name in dict.fromkeys(variants):
            v = self.variants.get(name)
            if v is not None and v.work is None and v.source.startswith("plugin") and self.origin != v.source:
                out.append(name)
        return out

    def builder(self, name: str) -> Callable:
        """The builder of a variant, importing the family's kernels module if needed."""
        v = self.variants[name]
        if v.builder is None and self.kernels:
            self.load()
        if v.builder is None:
            raise LookupError(f"variant {name!r} of {self.name!r} is declared but {self.kernels} registers no "
                              "builder for it")
        return v.builder

    def build(self, variant: str, inputs: Any, params: dict, device: Any) -> "Built":
        """The one way from a case to a launch: the variant's builder over `inputs` with the case's
        resolved parameters (`resolve`). The case pipeline, the counters child and the layer's count
        and act launches all build through here. A geometry key the pipeline reads that the builder
        did not give is an error naming the key and the variant (Geometry)."""
        built = self.builder(variant)(inputs, params, device)
        if not isinstance(built, Built):
            raise TypeError(f"variant {variant!r} of {self.name!r}: its builder returned {show(built)}, not a "
                            "Built(launch, output, reset, geometry)")
        built.geometry = Geometry(f"variant {variant!r} of {self.name!r}", built.geometry)
        return built

    def resolve(self, variant: str, params: dict, device: Any, environ: Mapping[str, str],
                origins: Mapping[str, str] | None = None) -> tuple[dict, dict]:
        """The parameters a variant's kernel runs with, and where each launch value came from.

        Launch parameters the variant reads from the spec keep their value (from "spec", or
        "default" where the spec left it to the family); 0 for a parameter with `auto` (grid)
        becomes that device property; parameters the variant takes from a kill-switch variable
        are read from `environ`, or get the shipped default. A malformed variable is a
        UsageError naming it and the accepted values."""
        v = self.variants[variant]
        out = dict(params)
        sources: dict[str, str] = {}
        for name in v.params:
            sources[name] = (origins or {}).get(name, "spec")
            p = self.params[name]
            if p.auto and out.get(name) == 0:
                out[name] = getattr(device, p.auto)
                sources[name] = f"device {p.auto} (spec: 0)"
        for name, (var, default) in v.env.items():
            out[name], sources[name] = read_switch(self.params[name], var, default, environ)
        if self.resolve_more is not None:
            out.update(self.resolve_more(variant, out, device, environ))
        return out, sources

    # what the case pipeline calls on a kernel family's module (touched_bytes is optional)
    KERNEL_API = ("build_inputs", "input_bytes", "reference", "check", "nonvacuity", "work")

    def load(self):
        """Import the kernels module (torch, triton) and return it."""
        if tritonpatch.interpreting():
            tritonpatch.interpreter_patches()
        if not self.kernels:
            return None
        module = importlib.import_module(self.kernels)
        missing = [] if self.host_only else [f for f in self.KERNEL_API if not callable(getattr(module, f, None))]
        if missing:
            raise UsageError(f"family {self.name!r} ({self.origin}): its module {self.kernels} does not define "
                             f"{', '.join(missing)}; a kernel family's module provides {', '.join(self.KERNEL_API)}")
        return module


def read_switch(p: Param, var: str, default: Any, environ: Mapping[str, str]) -> tuple[Any, str]:
    """A kill-switch variable's value for parameter `p`, or the shipped default when unset."""
    raw = environ.get(var)
    if raw is None or raw.strip() == "":
        return default, f"default {default} (${var} unset)"
    try:
        value = int(raw.strip(), 10) if p.type is int else p.type(raw.strip())
    except ValueError:
        value = None
    problem = p.check(value) if value is not None else f"expected {p.allowed()}, got {raw!r}"
    if problem:
        raise UsageError(f"${var}={raw!r}: {problem}; it sets {p.name}, which takes {p.allowed()}")
    return value, f"${var}"


# ----------------------------------------------------------------------------------- the contract


@dataclass
class Built:
    """What a variant builder returns: a zero-argument launch closure (allocation already done, so
    the closure can be captured in a CUDA graph), the output it writes, a reset that restores the
    pre-launch state (zero counters, poison outputs) and the launch geometry for the record."""

    launch: Callable[[], None]
    output: Any  # torch.Tensor checked after a launch
    reset: Callable[[], None]
    geometry: dict[str, Any] = field(default_factory=dict)
    # where geometry values the builder resolved itself came from (a launch built out of another
    # family's variant records that variant's kill switches here); merged into the record
    launch_from: dict[str, Any] = field(default_factory=dict)
    # why this launch cannot be bit-exact with the baseline launch by construction (an upstream
    # kernel that sums with float atomics): it is then checked against the reference only
    inexact: str = ""


class GeometryKeyError(KeyError):
    """A geometry key a variant's Built does not give; the message names the key and the variant."""

    def __str__(self) -> str:
        return str(self.args[0])


class Geometry(dict):
    """A Built's launch geometry. Reading a key the builder did not give (the family's work model
    reads its grid, block size, warps) raises GeometryKeyError naming that key and the variant,
    instead of a bare KeyError."""

    def __init__(self, owner: str, items: Mapping[str, Any] | None = None):
        super().__init__(items or {})
        self.owner = owner

    def __missing__(self, key: str):
        raise GeometryKeyError(f"{self.owner}: its Built's geometry has no {key!r}, which the family's work model "
                               f"reads (it gives {', '.join(map(str, self)) or 'none'})")

    def __reduce__(self):
        return dict, (dict(self),)


@dataclass
class Check:
    ok: bool
    detail: str = ""


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ----------------------------------------------------------------------------------- the catalogue

_CATALOGUE: dict[str, FamilySpec] | None = None
_BROKEN: dict[str, str] = {}  # family name (or "plugin WHERE") -> its one-line error


def catalogue() -> dict[str, FamilySpec]:
    """Every family that loads: the built-in ones, then those plugins registered (installed entry
    points and the files in $MOEBENCH_PLUGINS are loaded on first use; --plugin and a spec's
    plugins: add theirs when they are read). A built-in family whose package or declarations fail,
    or an installed plugin that fails, is left out and listed by `broken()`: the others still load."""
    global _CATALOGUE
    if _CATALOGUE is None:
        _CATALOGUE = {}
        for name in BUILTIN:
            try:
                fam = importlib.import_module(f"{FAMILIES_PACKAGE}.{name}").FAMILY
            except Exception as e:  # noqa: BLE001 - a broken family breaks only itself
                _BROKEN[name] = _load_error(e, _FAMILIES_DIR / name)
                continue
            _CATALOGUE[fam.name] = fam
        _BROKEN.update(load_installed())
    return _CATALOGUE


def switch_variables() -> set[str]:
    """Every kill-switch variable a variant of a loaded family reads (MCORE_COUNT_TOKENS_BLOCK, ...):
    a family that builds other families' variants (the layer) reads theirs too."""
    return {var for fam in catalogue().values() for v in fam.variants.values() for var, _ in v.env.values()}


def broken() -> dict[str, str]:
    """The families (by name) and installed plugins ("plugin WHERE") that failed to load, each with
    its one-line error naming file:line."""
    catalogue()
    return dict(_BROKEN)


def _load_error(e: BaseException, folder: Path) -> str:
    """An error from importing a family's package as one line, naming the file and line in that
    family's folder (or the deepest line in moebench) where it went wrong."""
    if isinstance(e, SyntaxError) and e.filename:
        return f"{e.filename}:{e.lineno}: SyntaxError: {e.msg}"
    frames = traceback.extract_tb(e.__traceback__)
    mine = [f for f in frames if Path(f.filename).is_relative_to(folder)] or \
        [f for f in frames if Path(f.filename).is_relative_to(_FAMILIES_DIR)] or frames
    where = f"{mine[-1].filename}:{mine[-1].lineno}: " if mine else ""
    return f"{where}{type(e).__name__}: {one_line(e)}"


def get_family(name: str) -> FamilySpec:
    """A family by name; KeyError when there is none; a UsageError (exit 2) naming file:line when
    it exists but failed to load."""
    cat = catalogue()
    if name not in cat:
        if name in _BROKEN:
            raise UsageError(family_error(name))
        raise KeyError(name)
    return cat[name]


def family_error(name: str) -> str | None:
    """Why family `name` cannot be used, as one line, or None when it loads (or does not exist)."""
    catalogue()
    why = _BROKEN.get(name)
    return f"family {name!r} failed to load: {why}" if why else None


def register_family(fam: FamilySpec) -> FamilySpec:
    """Add a family (from a plugin) to the catalogue."""
    if fam.origin == "builtin" and current_source():
        fam.origin = current_source()
    cat = catalogue()
    have = cat.get(fam.name)
    if have is not None and have is not fam:
        raise ValueError(f"family {fam.name!r} already exists ({have.origin}); give the new one another name")
    if have is None:
        on_failure(lambda: cat.pop(fam.name, None))  # a plugin that then fails registers nothing
    cat[fam.name] = fam
    return fam
