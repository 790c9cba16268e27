"""How the projections' weights are laid out for the matmul: a pure choice from the name asked
for and what stops each packing here (`problems`), then the packing itself.

    dense:  Linear.weight [in, out], multiplied by `x @ weight` (the reference; every device)
    onednn: oneDNN's blocked weight beside it (CPU float32; onednn_weights.py)
    mkl:    MKL's pre-packed panels beside it (CPU float32; mkl_weights.py)
    panels: products of up to PANEL_MAX_ROWS rows (decode steps) from the weight in panels, by
            a C kernel (CPU float32; panel_weights.py); more rows dense
    auto:   what this machine measured fastest for the model's projections (product_probe.py,
            cached per machine): at each range of row counts the fastest of dense, the panels and
            the one packing of PACKINGS kept (the fastest that nothing stops here); the panels
            held for the fused decode step wherever they build. The head (lm_head: one row a
            sampled sequence, a weight several times a layer's, read from memory every step)
            has a route of its own, measured on its own shape at decode row counts (HEAD_ROWS)

The choice is a `WeightLayout`: the packing the projections hold a copy in, whether they hold
one in panels too, and the route by row count between those and the dense weight
(pdserve/model/row_route.py), the head's where it has its own.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from pdserve.config import WEIGHT_LAYOUTS, WEIGHT_PACKINGS
from pdserve.cpu.mkl_weights import MklPanels
from pdserve.cpu.onednn_weights import OneDnnWeight
from pdserve.cpu.packed_weights import PackedWeight, PackSummary
from pdserve.cpu.panel_weights import load_row_panels
from pdserve.cpu.product_probe import (HEAD_ROWS, PROBE_ROWS, Pack, ProductRates, as_head, dense, probe_products,
                                      shape_counts)
from pdserve.measurements import measured
from pdserve.model.layers import Linear
from pdserve.model.row_route import DEFAULT_ROUTE, DENSE, MIN_PACKED_ROWS, PACKED, RowRoute
from pdserve.model.row_route import PANELS as PANEL_ROUTE
from pdserve.native.row_panels import RowPanels

# the packings in the order `auto` prefers them (measured: docs/BENCHMARKS.md, "oneDNN weights and a segment kernel")
_PACKING_TYPES: dict[str, type[PackedWeight]] = {"onednn": OneDnnWeight, "mkl": MklPanels}
PACKINGS: dict[str, type[PackedWeight]] = {name: _PACKING_TYPES[name] for name in WEIGHT_PACKINGS}
PANELS = "panels"

log = logging.getLogger(__name__)


class WeightLayoutUnavailable(RuntimeError):
    """A packing asked for where it cannot run (not a CPU, not float32, the library missing)."""


@dataclass(frozen=True)
class WeightLayout:
    many_rows: str  # the packing of PACKINGS the projections hold a copy in, or dense
    few_rows: str | None = None  # PANELS: the projections hold a copy in panels too (None: not)
    route: RowRoute = DEFAULT_ROUTE  # which copy a product of so many rows reads (row_route.py)
    rates: ProductRates | None = field(default=None, compare=False)  # what auto chose it by (measured here)
    head_route: RowRoute | None = None  # the lm_head's own route (auto, measured on its shape); None: `route`
    head_rates: ProductRates | None = field(default=None, compare=False)  # what the head's route was chosen by

    def __str__(self) -> str:
        """e.g. "panels up to 4 rows, mkl up to 16, dense up to 64, mkl beyond"; "onednn"; "dense";
        "...; the head: panels up to 256 rows, mkl beyond" where the head has a route of its own."""
        names = self._names(self.route)
        text = _joined(names)
        if self.few_rows is not None and all(name != self.few_rows for _, name in names):
            text += f", {self.few_rows} for fused decode steps only"
        return text if self.head_route is None else f"{text}; the head: {_joined(self._names(self.head_route))}"

    def _names(self, route: RowRoute) -> list[tuple[int | None, str]]:
        """(up to rows, the copy's name) of each range of `route`, adjacent equal names merged."""
        names: list[tuple[int | None, str]] = []
        for bound, kind in route.segments():
            name = self._name(kind)
            if names and names[-1][1] == name:
                names.pop()
            names.append((bound, name))
        return names

    def _name(self, kind: str) -> str:
        if kind == PANEL_ROUTE and self.few_rows is not None:
            return self.few_rows
        return self.many_rows if kind != DENSE else "dense"


def _joined(names: list[tuple[int | None, str]]) -> str:
    parts = [f"{name} up to {bound}" + (" rows" if i == 0 else "") for i, (bound, name) in enumerate(names[:-1])]
    parts.append(f"{names[-1][1]} beyond" if parts else names[-1][1])
    return ", ".join(parts)


def choose_weight_layout(name: str, problems: dict[str, str | None], rates: ProductRates | None = None) -> WeightLayout:
    """`problems`: packing (of PACKINGS, or PANELS) -> why it cannot run here (None: it can);
    `rates`: what `auto` chooses by (the layouts with no problem, measured here), else auto takes
    the first layout nothing stops. Raises ValueError for an unknown name, WeightLayoutUnavailable
    for a packing with a problem."""
    if name not in WEIGHT_LAYOUTS:
        raise ValueError(f"unknown weight layout {name!r}; choose one of {', '.join(WEIGHT_LAYOUTS)}")
    if name == "auto" and rates is not None:
        return replace(fastest_layout(rates), rates=rates)
    if name == "auto":
        many = next((packing for packing in PACKINGS if problems.get(packing) is None), "dense")
        return WeightLayout(many, None if problems.get(PANELS) else PANELS)
    if problem := problems.get(name):
        raise WeightLayoutUnavailable(f"{name} weights unavailable: {problem}; use --weight-layout dense")
    return WeightLayout("dense", PANELS) if name == PANELS else WeightLayout(name)


def fastest_layout(rates: ProductRates) -> WeightLayout:
    """At each probed row count the fastest of dense, the panels and the one packing kept (the
    packing fastest over every probe of two rows or more, where it beat dense at one); the
    panels held wherever measured, for the fused decode step (pdserve/engine/decode_probe.py)."""
    packing = _kept_packing(rates)
    route = fastest_route(rates, packing)
    many = packing if packing is not None and PACKED in route.kinds else "dense"
    return WeightLayout(many, PANELS if PANELS in rates.seconds else None, route)


def fastest_route(rates: ProductRates, packing: str | None) -> RowRoute:
    """At each probed row count the fastest of dense, the panels (where measured) and `packing` (from
    MIN_PACKED_ROWS rows; None: no packing)."""
    kinds = []
    for i, rows in enumerate(rates.rows):
        candidates = {DENSE: rates.seconds["dense"][i]}
        if PANELS in rates.seconds:
            candidates[PANEL_ROUTE] = rates.seconds[PANELS][i]
        if packing is not None and rows >= MIN_PACKED_ROWS:
            candidates[PACKED] = rates.seconds[packing][i]
        kinds.append(min(candidates, key=candidates.get))
    return RowRoute.by_probes(rates.rows, kinds)


def with_head_route(layout: WeightLayout, head_rates: ProductRates) -> WeightLayout:
    """`layout` with the head's own route: at each row count the head's rates were probed at, the
    fastest of the copies it holds (dense, the layout's packing, the panels)."""
    packing = layout.many_rows if layout.many_rows in head_rates.seconds else None
    return replace(layout, head_route=fastest_route(head_rates, packing), head_rates=head_rates)


def _kept_packing(rates: ProductRates) -> str | None:
    probes = [i for i, rows in enumerate(rates.rows) if rows >= MIN_PACKED_ROWS]
    packings = [name for name in rates.seconds if name in PACKINGS]
    if not packings or not probes:
        return None
    best = min(packings, key=lambda name: sum(rates.seconds[name][i] for i in probes))
    return best if any(rates.seconds[best][i] < rates.seconds["dense"][i] for i in probes) else None


def measure_products(model: nn.Module, problems: dict[str, str | None], panels: RowPanels | None) -> ProductRates:
    """The rates of dense and of every layout nothing stops here, for `model`'s projection shapes
    on torch's threads now: from this machine's cache, else probed now (about a second) and kept."""
    layouts = {"dense": dense, **{name: p.pack for name, p in PACKINGS.items() if problems.get(name) is None}}
    if panels is not None:
        layouts[PANELS] = panels.pack
    layers = getattr(model, "layers", None) or model
    shapes = shape_counts(m.weight for m in layers.modules() if isinstance(m, Linear))
    return _measured("products", shapes, layouts, panels, PROBE_ROWS)


def measure_head(head: Linear, layout: WeightLayout, panels: RowPanels | None) -> ProductRates | None:
    """The rates of the copies the head will hold under `layout` (dense, its packing, the panels)
    for the head's shape at HEAD_ROWS, each as the head computes it (as_head), kept as
    measure_products keeps its rates (a few seconds, once); None where it holds dense alone."""
    layouts = {"dense": as_head(DENSE)}
    if layout.many_rows in PACKINGS:
        layouts[layout.many_rows] = as_head(PACKED, PACKINGS[layout.many_rows].pack)
    if layout.few_rows == PANELS and panels is not None:
        layouts[PANELS] = as_head(PANEL_ROUTE, panels.pack)
    if len(layouts) == 1:
        return None
    return _measured("head-products", {tuple(head.weight.shape): 1}, layouts, panels, HEAD_ROWS)


def _measured(kind: str, shapes: dict[tuple[int, int], int], layouts: dict[str, Pack], panels: RowPanels | None,
              rows: tuple[int, ...]) -> ProductRates:
    depends_on = {"shapes": sorted(shapes.items()), "layouts": sorted(layouts), "threads": torch.get_num_threads(),
                  "panels": panels.library_name if panels is not None else None}
    if rows != PROBE_ROWS:
        depends_on["rows"] = list(rows)

    def probe() -> dict:
        log.info("measuring the layouts' rates (%s) on this machine (once; kept beside the kernels)", kind)
        return probe_products(shapes, layouts, rows).to_json()

    return ProductRates.from_json(measured(kind, depends_on, probe))


def packing_problems(device: str | torch.device, dtype: torch.dtype) -> dict[str, str | None]:
    """packing -> why it cannot run on `device` in `dtype` (None: it can; each probed here)."""
    return {name: packing.problem(device, dtype) for name, packing in PACKINGS.items()}


def apply_weight_layout(model: nn.Module, name: str, device: str | torch.device, dtype: torch.dtype) -> WeightLayout:
    """Lays out `model`'s projections as `name` asks; returns the layout used."""
    if name == "dense":  # no probe: nothing to pack
        return WeightLayout("dense")
    problems = packing_problems(device, dtype) if name != PANELS else {}
    panels, problems[PANELS] = load_row_panels(device, dtype) if name in ("auto", PANELS) else (None, None)
    rates = measure_products(model, problems, panels) if name == "auto" and _measurable(model, problems) else None
    layout = choose_weight_layout(name, problems, rates)
    head = _head(model)
    if rates is not None and head is not None and (head_rates := measure_head(head, layout, panels)) is not None:
        layout = with_head_route(layout, head_rates)
    if layout.many_rows != "dense":
        summary = pack_linears(model, PACKINGS[layout.many_rows], layout.route)
        log.info("packed %d projections (%.0f MB) as %s weights", summary.linears, summary.nbytes / 1e6,
                 layout.many_rows)
    if layout.few_rows == PANELS:
        summary = stream_linears(model, panels, layout.route)
        log.info("packed %d projections (%.0f MB) in panels", summary.linears, summary.nbytes / 1e6)
    if head is not None and layout.head_route is not None:
        head.route = layout.head_route
    log.info("projections: %s%s", layout, " (measured on this machine)" if rates is not None else "")
    return layout


def pack_linears(model: nn.Module, packing: type[PackedWeight], route: RowRoute = DEFAULT_ROUTE) -> PackSummary:
    """Packs every Linear of `model` with `packing`; each then multiplies from its packed weight
    where `route` says."""
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    for linear, packed in zip(linears, _packed(packing.pack, linears)):
        linear.packed, linear.route = packed, route
    return PackSummary(len(linears), sum(m.packed.nbytes for m in linears))


def stream_linears(model: nn.Module, panels: RowPanels, route: RowRoute = DEFAULT_ROUTE) -> PackSummary:
    """Packs every Linear of `model` in panels; each then multiplies from them where `route` says
    (by default up to PANEL_MAX_ROWS rows)."""
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    for linear, packed in zip(linears, _packed(panels.pack, linears)):
        linear.streamed, linear.route = packed, route
    return PackSummary(len(linears), sum(m.streamed.nbytes for m in linears))


def _packed(pack: Callable[[torch.Tensor], PackedWeight], linears: list[Linear]) -> list[PackedWeight]:
    """Each linear's weight packed, on every core (torch's copies and the libraries' packing release
    the GIL; a worker packs before it serves, when nothing else runs)."""
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        return list(pool.map(lambda linear: pack(linear.weight), linears))


def _head(model: nn.Module) -> Linear | None:
    """The model's lm_head where it is a Linear of its own (not a tensor-parallel head)."""
    head = getattr(model, "lm_head", None)
    return head if isinstance(head, Linear) else None


def _measurable(model: nn.Module, problems: dict[str, str | None]) -> bool:
    """Whether there is a layout besides dense to measure, and a projection to measure it on."""
    return any(problem is None for problem in problems.values()) and any(isinstance(m, Linear) for m in model.modules())
