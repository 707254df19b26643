"""What one benchmarked variant is: a model (or a SwiftKV wiring of the base model) plus engine settings.

A variant is given on the command line as ``--variant SPEC``, where SPEC is either shorthand or a JSON object:

- ``base``: the model itself;
- ``swiftkv-50=15``: the base model converted to SwiftKV with l = 15 (hf engine: converted in-process, the
  untrained reference init, which times exactly like a trained checkpoint);
- ``swiftkv-50-acrosskv-3=15,3``: l = 15 with 3-way AcrossKV;
- ``{"id": "swiftkv-50", "model": "results/converted/smollm2-135m/swiftkv-50", "env": {"VLLM_PLUGINS": "swiftkv"},
  "args": ["--some-engine-flag"], "num_key_value_layers": 15, "key_value_group_size": 1}``: a model directory
  served with extra environment variables and engine arguments (how plugin-served SwiftKV rows are added).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import asdict, dataclass, field

from swiftkv.errors import SwiftKVError

_SHORT = re.compile(r"^(?P<id>[A-Za-z0-9][A-Za-z0-9._-]*)(=(?P<l>\d+)(,(?P<g>\d+))?)?$")


@dataclass
class VariantSpec:
    id: str
    model: str | None = None  # a model directory / hub id; None = the benchmark's MODEL argument
    num_key_value_layers: int | None = None  # l; None = not SwiftKV
    key_value_group_size: int = 1  # g
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the engine (vLLM plugins)
    args: list[str] = field(default_factory=list)  # extra engine arguments (vLLM)
    label: str | None = None  # legend text; defaults to the id
    again_of: str | None = None  # a second, interleaved measurement of that variant: the noise floor of a ratio

    @property
    def is_swiftkv(self) -> bool:
        return self.num_key_value_layers is not None

    def to_dict(self) -> dict:
        return asdict(self)


def parse_variant(text: str) -> VariantSpec:
    """A ``VariantSpec`` from shorthand (``id``, ``id=l``, ``id=l,g``) or a JSON object."""
    text = text.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise SwiftKVError(f"--variant {text!r} is not valid JSON ({err.msg}); see `swiftkv bench serve --help`") from None
        unknown = set(data) - set(VariantSpec.__dataclass_fields__)
        if unknown or "id" not in data:
            raise SwiftKVError(
                f"--variant JSON needs 'id' and may hold {', '.join(VariantSpec.__dataclass_fields__)}; "
                f"got {', '.join(sorted(data))}"
            )
        spec = VariantSpec(**data)
        spec.env = {str(k): str(v) for k, v in spec.env.items()}
        spec.args = [str(a) for a in spec.args]
    else:
        match = _SHORT.match(text)
        if not match:
            raise SwiftKVError(f"--variant {text!r}: use ID, ID=l, ID=l,g or a JSON object (see --help)")
        l, g = match["l"], match["g"]
        spec = VariantSpec(match["id"], num_key_value_layers=int(l) if l else None, key_value_group_size=int(g or 1))
    if spec.key_value_group_size < 1:
        raise SwiftKVError(f"variant {spec.id}: key_value_group_size must be >= 1")
    return spec


def reference_of(specs: list[VariantSpec]) -> VariantSpec:
    """The variant every speedup is relative to: ``base`` if given, else the first."""
    return next((s for s in specs if s.id == "base"), specs[0])


def again_spec(spec: VariantSpec) -> VariantSpec:
    """A second copy of ``spec``, measured interleaved with the others like any variant: its ratio to ``spec`` is
    what the machine's noise alone gives (the base-vs-base noise floor beside every speedup)."""
    return VariantSpec(**{**asdict(spec), "id": f"{spec.id}-again", "label": f"{spec.label or spec.id} (again)",
                          "again_of": spec.id})


def parse_variants(texts: list[str] | None, noise_floor: bool = False) -> list[VariantSpec]:
    """Parsed variants in order, ``base`` first if not given; ids must be unique. ``noise_floor``: the reference
    variant once more, last (``again_spec``)."""
    specs = [parse_variant(t) for t in (texts or ["base"])]
    if noise_floor:
        specs.append(again_spec(reference_of(specs)))
    ids = [s.id for s in specs]
    if len(set(ids)) != len(ids):
        raise SwiftKVError(f"variant ids must be unique, got {ids}")
    return specs


def round_order(names: list[str], seed: int, point: str, round_index: int) -> list[str]:
    """The variants' order in one round of one point: a permutation drawn from (seed, point, round), the same on
    every machine and run (``random.Random`` seeded with a string is), recorded with the results."""
    order = list(names)
    random.Random(f"{seed}/{point}/{round_index}").shuffle(order)
    return order
