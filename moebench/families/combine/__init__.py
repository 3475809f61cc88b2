"""Combine PULL-tile family (seed 002): the LDS a gfx1250 combine PULL tile needs, old rule vs new.

Host-only: the model is integer arithmetic over the kernel's sizing expressions, so a sweep
evaluates it on the host and records which combine path each shape takes. No kernel is launched
and nothing is timed. kernels.py holds the model (pure Python, no torch) and the two rules as
variants; the results page's sections (moebench.report.sections.combine) read records and that model.
"""

from moebench.core.family import FamilySpec, Param, VariantSpec

# The LDS budget the PR sizes against: 320 KB. It reproduces every figure in the PR and review.
LDS_BUDGET = 320 * 1024

FAMILY = FamilySpec(
    name="combine",
    doc="LDS need of the combine PULL tile (MORI EPv2, gfx1250): chunk rule, tile, path taken",
    host_only=True,
    params={
        p.name: p
        for p in (
            Param("world", int, default=8, min=1, max=64,
                  help="ranks npes (EpCfgIsValid: <= 64 on wave64, <= 32 on wave32)"),
            Param("topk", int, default=6, min=1, max=63, model_key="topk",
                  help="experts per token K (EpCfgIsValid: <= 63 on wave64, <= 31 on wave32)"),
            Param("hidden", int, default=7168, min=1, model_key="hidden", help="model width H, elements"),
            Param("warps", int, default=8, min=1, max=32,
                  help="warpPerBlock of the combine launch (<= 16 on wave64, <= 32 on wave32)"),
            Param("budget", int, default=LDS_BUDGET, min=1, help="LDS bytes the PULL tile may use"),
            Param("tdm", int, default=2, min=1,
                  help="MORI_COMB_TDM: the old rule's fixed chunk count, the new rule's least one"),
            Param("dtype", str, default="bf16", choices=("bf16", "fp32"), help="element type of the rows"),
            Param("use_weights", bool, default=True,
                  help="combine carries per-token weights: a second pointer array in LDS"),
            Param("compact_npes", int, default=4, role="launch", min=1, max=64,
                  help="old rule only: srcMax compacts to npes when npes <= this and npes < topk "
                       "(main's literal 4)"),
        )
    },
    default_pivot={"rows": "topk", "cols": "world", "metric": "path"},
    variants=(
        VariantSpec("old", params=("compact_npes",),
                    doc="main: chunks = MORI_COMB_TDM; srcMax = npes if npes <= 4 and npes < topk else topk"),
        VariantSpec("new", doc="the PR: srcMax = min(npes, topk); chunks = the least count >= MORI_COMB_TDM whose tile "
                               "fits the budget"),
    ),
    package=__name__,
)

