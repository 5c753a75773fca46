"""Side-by-side check of latentloop's Ouro model against the official Ouro modeling code.

The official code (``modeling_ouro.py`` and ``configuration_ouro.py`` from an Ouro Hub repository, e.g.
``ByteDance/Ouro-1.4B``, which loads them with ``trust_remote_code``) is not part of latentloop: put both files in a
folder and pass it with ``--reference DIR``; they are imported at run time as a package and need ``transformers``
(tested: 4.56.2), which latentloop does not depend on, so run this script with a Python that has both.

The script builds a small random fp32 latentloop model, writes it with ``save_pretrained`` (the official layout),
builds the official ``OuroForCausalLM`` from that folder's ``config.json`` and loads its ``model.safetensors``
with a strict ``load_state_dict``. It reports, as one JSON object:

* ``parity``: at every depth 1..8 (the official ``total_ut_steps``), on a left-padded batch, max |Δ| of the
  logits, of every step's hidden state, of every step's exit-gate probability λ and of the logits read at the
  official ``exit_threshold``; then greedy generation with the cache, batched and left-padded, token for token
  against the official ``generate``, without the exit gate and with it (ours ``exit="gate-full:t"`` against
  the official ``early_exit_threshold=t``); target <= 1e-5;
* ``speed`` (with ``--speed``): greedy decode tokens/s at 4 and 8 steps on a model of hidden 512 and 8 layers,
  ours (eager; with ``prepack=True``, the linear weights repacked for oneDNN; compiled with ``--compile``; each
  of the last two also with ``screen_head=True``, the greedy token screened from an fp16 copy of the head)
  against the official ``generate`` with its cache, as medians of interleaved repeats, with the ratio and whether the tokens agree; and with the exit gate at a threshold, our
  ``exit="gate:t"`` (the steps after the exit skipped) and ``exit="gate-full:t"`` (every step computed, as
  the official code does, each token's steps after its exit run in the next tokens' passes; also prepacked,
  and prepacked with the screened head)
  against the official ``early_exit_threshold=t``: tokens, the mean core steps we compute per token, the
  mean core passes a token waits for, and the speed ratio. ``--batch B`` decodes B prompts at once. Beside them, at each depth,
  the weight products alone: every linear layer of the stack applied once per step and the head once, to B
  rows, one eager ``F.linear`` call each, and nothing else (no attention, norms or cache). At batch 1 these
  are matrix-vector products that read every weight from memory once per step, most of what decoding costs,
  so their rate says how much room a decoder built on ``F.linear`` has left (``share_of_floor``: a decoder's
  tokens/s over theirs); one whose products run faster than ``F.linear``'s can pass 1, as prepacked ones do
  at a few rows and compiled ones at one row (row dot products, :mod:`latentloop.nn.linear`).

``--fixture DIR`` also writes the tiny model (``DIR/model``, official layout) and what the official code computed
on it (``DIR/expected.safetensors``), the numbers ``tests/models/test_ouro_parity.py`` checks without the official
code or ``transformers``.

Usage::

    /tmp/ourovenv/bin/python -m latentloop.benchmarks.compare_ouro_reference --reference /tmp/ouro_ref \\
        --fixture tests/fixtures/ouro_tiny --speed
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

try:  # only this comparison needs transformers, which latentloop does not depend on
    import transformers
except ImportError:
    transformers = None

from latentloop.errors import ArgumentParser, UsageError
from latentloop.io import emit_json_report
from latentloop.models.generation import generate
from latentloop.models.ouro import OuroConfig, OuroLM
from latentloop.runtime import cpu_description

REFERENCE_FILES = ("configuration_ouro.py", "modeling_ouro.py")
PACKAGE = "ouro_reference"
THRESHOLDS = (0.5, 0.9)  # exit thresholds checked for parity


def parse_args(argv: Sequence[str] | None = None) -> Any:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", type=Path, required=True, help="folder with the official Ouro files")
    parser.add_argument("--fixture", type=Path, help="write the tiny model and the official outputs here")
    parser.add_argument("--max-depth", type=int, default=8, help="parity at depths 1..this")
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument(
        "--speed", action="store_true", help="also time greedy decoding (hidden 512, 8 layers)"
    )
    parser.add_argument("--compile", action="store_true", help="also time our compiled decoding")
    parser.add_argument("--speed-depths", type=str, default="4,8")
    parser.add_argument("--gate-thresholds", type=str, default="0.5,0.9,1.0")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=1, help="prompts decoded at once in the speed runs")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    return parser.parse_args(argv)


def load_reference(folder: Path) -> types.ModuleType:
    """Import the official files as the package ``ouro_reference`` (the modeling file imports its config
    relatively)."""
    if transformers is None:
        raise UsageError("the official code needs transformers: run this script with a Python that has it")
    missing = [name for name in REFERENCE_FILES if not (folder / name).is_file()]
    if missing:
        raise UsageError(f"{folder} lacks {missing[0]} (it must hold {', '.join(REFERENCE_FILES)})")
    package = types.ModuleType(PACKAGE)
    package.__path__ = [str(folder)]
    sys.modules[PACKAGE] = package
    for name in ("configuration_ouro", "modeling_ouro"):
        spec = importlib.util.spec_from_file_location(f"{PACKAGE}.{name}", folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    modeling = sys.modules[f"{PACKAGE}.modeling_ouro"]
    SHIMS.extend(apply_shims(modeling))
    return modeling


SHIMS: list[str] = []


def apply_shims(modeling: types.ModuleType) -> list[str]:
    """Run-time fixes of known upstream bugs, by monkeypatching after import (never by editing the file).

    ``UniversalTransformerCache.get_mask_sizes``: the upstream cache keeps its tensors outside the ``layers``
    list that Hugging Face's mask code reads, so the mask it builds for a decoding step is as long as the cache
    before the step (or the query alone), not cache plus query; with a padding mask, decoding then fails or
    attends wrongly. The shim returns ``(cached + query, 0)``.
    """
    cache_cls = modeling.UniversalTransformerCache

    def get_mask_sizes(self: Any, cache_position: torch.Tensor | int, layer_idx: int = 0) -> tuple[int, int]:
        query = cache_position if isinstance(cache_position, int) else cache_position.shape[0]
        return self.get_seq_length(layer_idx) + query, 0

    cache_cls.get_mask_sizes = get_mask_sizes
    return ["UniversalTransformerCache.get_mask_sizes: kv length = cached + query"]


def official_model(
    modeling: types.ModuleType, folder: Path, steps: int, threshold: float | None = None
) -> Any:
    """The official model on our saved folder, at ``steps`` loop steps (strict weight loading)."""
    data = json.loads((folder / "config.json").read_text())
    data.update(total_ut_steps=steps, early_exit_threshold=threshold)
    config_cls = sys.modules[f"{PACKAGE}.configuration_ouro"].OuroConfig
    config = config_cls(**{k: v for k, v in data.items() if k not in ("architectures", "model_type")})
    config._attn_implementation = "sdpa"
    model = modeling.OuroForCausalLM(config)
    model.load_state_dict(load_file(str(folder / "model.safetensors")), strict=True)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def tiny_config() -> OuroConfig:
    return OuroConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=64,
        max_position_embeddings=64,
        initializer_range=0.2,  # logits of order 1 and gate probabilities spread over (0, 1)
    )


def padded_batch(vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two rows of 8 tokens, the second left-padded by 3; positions count real tokens (as ``generate`` does)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (2, 8), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    ids[1, :3] = 0
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    return ids, mask, positions


def max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    """max |a - b| over the real (unpadded) positions when ``mask`` [B, S] is given (positions on axis 1)."""
    diff = (a.double() - b.double()).abs()
    if mask is not None:
        diff = diff[mask.bool()]
    return float(diff.max())


def parity(modeling: types.ModuleType, args: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor], Path]:
    torch.manual_seed(args.seed)
    ours = OuroLM(tiny_config()).eval()
    folder = Path(tempfile.mkdtemp(prefix="ouro_parity_")) / "model"
    ours.save_pretrained(folder)
    ours = OuroLM.from_pretrained(folder)
    ids, mask, positions = padded_batch(ours.config.vocab_size, args.seed)
    expected: dict[str, torch.Tensor] = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
    rows: list[dict[str, Any]] = []
    for steps in range(1, args.max_depth + 1):
        ref = official_model(modeling, folder, steps)
        with torch.no_grad():
            ref_out = ref(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
            _, hidden, gates = ref.model(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False
            )
            out = ours(
                ids, num_steps=steps, attention_mask=mask, position_ids=positions, return_trajectory=True
            )
            lambdas = torch.sigmoid(torch.stack(gates).squeeze(-1))  # [T, B, S]
            ours_lambdas = torch.stack([ours.exit_lambda(s) for s in out.trajectory])
            row = {
                "steps": steps,
                "logits": max_diff(out.logits, ref_out.logits, mask),
                "hidden_states": max(
                    max_diff(a, b, mask) for a, b in zip(out.trajectory, hidden, strict=True)
                ),
                "exit_lambda": max_diff(ours_lambdas.permute(1, 2, 0), lambdas.permute(1, 2, 0), mask),
            }
            expected[f"logits_{steps}"] = ref_out.logits
            expected[f"hidden_{steps}"] = torch.stack(hidden)
            expected[f"lambda_{steps}"] = lambdas
            for t in THRESHOLDS:
                ref_t = ref(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=positions,
                    use_cache=False,
                    exit_threshold=t,
                ).logits
                ours_t = ours(
                    ids, num_steps=steps, attention_mask=mask, position_ids=positions, exit_threshold=t
                ).logits
                row[f"threshold_{t}_logits"] = max_diff(ours_t, ref_t, mask)
                expected[f"threshold_{t}_logits_{steps}"] = ref_t
            theirs = ref.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, use_cache=True)
        mine = generate(ours, ids, attention_mask=mask, max_new_tokens=6, num_steps=steps).sequences
        row["generation_equal"] = bool(torch.equal(mine, theirs))
        expected[f"generated_{steps}"] = theirs
        for t in THRESHOLDS:  # the official generate reading each token at its exit, against gate-full:t
            with torch.no_grad():
                theirs_t = official_model(modeling, folder, steps, threshold=t).generate(
                    ids, attention_mask=mask, max_new_tokens=6, do_sample=False, use_cache=True
                )
            mine_t = generate(
                ours, ids, attention_mask=mask, max_new_tokens=6, num_steps=steps, exit=f"gate-full:{t}"
            ).sequences
            row[f"gate_full_{t}_generation_equal"] = bool(torch.equal(mine_t, theirs_t))
            expected[f"generated_gate_{t}_{steps}"] = theirs_t
        rows.append(row)
    equal = [key for key in rows[0] if key.endswith("generation_equal")]
    worst = {key: max(r[key] for r in rows) for key in rows[0] if key != "steps" and key not in equal}
    report = {
        "rows": rows,
        "worst": worst,
        "generation_equal_all": all(r[key] for r in rows for key in equal),
        "within_tolerance": all(v <= args.tolerance for v in worst.values()),
        "tolerance": args.tolerance,
    }
    return report, expected, folder


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def weight_products_floor(model: OuroLM, steps: int, rows: int, repeats: int, tokens: int = 8) -> float:
    """Median seconds per decoded position (one new token in each of ``rows`` rows) of the weight products
    alone: each linear layer of the stack (the exit gate included) applied ``steps`` times and the head once,
    to ``rows`` vectors."""
    weights = [m.weight for m in model.model.modules() if isinstance(m, nn.Linear)]
    inputs = [torch.randn(rows, w.shape[1]) for w in weights]
    head_input = torch.randn(rows, model.lm_head.weight.shape[1])

    def decode() -> None:
        with torch.no_grad():
            for _ in range(tokens):
                for _ in range(steps):
                    for x, w in zip(inputs, weights, strict=True):
                        F.linear(x, w)
                F.linear(head_input, model.lm_head.weight)

    decode()
    return round(statistics.median(timed(decode)[0] for _ in range(repeats)) / tokens, 5)


def speed_config() -> OuroConfig:
    """The model the speeds are measured on: hidden 512, 8 layers, 8 heads, Ouro's vocabulary of 49,152."""
    return OuroConfig(
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=8,
        num_attention_heads=8,
        vocab_size=49152,
        max_position_embeddings=256,
    )


def speed(modeling: types.ModuleType, args: Any) -> dict[str, Any]:
    torch.manual_seed(args.seed)
    config = speed_config()
    folder = Path(tempfile.mkdtemp(prefix="ouro_speed_")) / "model"
    OuroLM(config).save_pretrained(folder)
    ours = OuroLM.from_pretrained(folder)
    prompt = torch.randint(
        1, config.vocab_size, (args.batch, args.prompt_len), generator=torch.Generator().manual_seed(1)
    )
    n = args.new_tokens
    result: dict[str, Any] = {
        "model": {"hidden_size": 512, "layers": 8, "heads": 8, "intermediate": 1408, "vocab": 49152},
        "prompt_len": args.prompt_len,
        "batch": args.batch,
        "new_tokens": n,
        "repeats": args.repeats,
        "depths": {},
        "gate": {},
    }

    def ours_fn(
        steps: int,
        compiled: bool = False,
        exit: str | None = None,
        prepack: bool = False,
        screen: bool = False,
    ) -> Callable[[], torch.Tensor]:
        return lambda: generate(
            ours,
            prompt,
            max_new_tokens=n,
            num_steps=steps,
            compile=compiled,
            exit=exit,
            prepack=prepack,
            screen_head=screen,
        )

    def theirs_fn(ref: Any) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            with torch.no_grad():
                return ref.generate(
                    prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=True
                )

        return run

    for steps in [int(s) for s in args.speed_depths.split(",")]:
        ref = official_model(modeling, folder, steps)
        runners = {
            "latentloop": ours_fn(steps),
            "latentloop_prepacked": ours_fn(steps, prepack=True),
            "latentloop_prepacked_screened": ours_fn(steps, prepack=True, screen=True),
            "official_generate": theirs_fn(ref),
        }
        if args.compile:
            runners["latentloop_compiled"] = ours_fn(steps, compiled=True)
            runners["latentloop_compiled_screened"] = ours_fn(steps, compiled=True, screen=True)
        outputs = {name: fn() for name, fn in runners.items()}  # warm-up (and compilation)
        times: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(args.repeats):  # interleaved, so load on the machine hits every path alike
            for name, fn in runners.items():
                seconds, _ = timed(fn)
                times[name].append(seconds)
        theirs_tokens = outputs["official_generate"][:, args.prompt_len :]
        row: dict[str, Any] = {}
        for name in runners:
            tokens = outputs[name]
            tokens = tokens.sequences if hasattr(tokens, "sequences") else tokens
            median = statistics.median(times[name])
            row[name] = {
                "tokens_per_second": round(args.batch * n / median, 2),  # every row's new tokens
                "median_seconds": round(median, 4),
                "same_tokens_as_official": bool(torch.equal(tokens[:, args.prompt_len :], theirs_tokens)),
            }
        base = row["official_generate"]["tokens_per_second"]
        for name in runners:
            if name != "official_generate":
                row[name]["speedup_vs_official"] = round(row[name]["tokens_per_second"] / base, 3)
        floor = weight_products_floor(ours, steps, args.batch, args.repeats)
        floor_rate = args.batch / floor
        row["weight_products_floor"] = {
            "tokens_per_second": round(floor_rate, 2),
            "seconds_per_position": floor,
        }
        for name in runners:
            row[name]["share_of_floor"] = round(row[name]["tokens_per_second"] / floor_rate, 3)
        result["depths"][str(steps)] = row
    steps = 4
    for t in [float(s) for s in args.gate_thresholds.split(",")]:
        ref = official_model(modeling, folder, steps, threshold=t)
        runners = {
            "latentloop_gate": ours_fn(steps, exit=f"gate:{t}"),
            "latentloop_gate_full": ours_fn(steps, exit=f"gate-full:{t}"),
            "latentloop_gate_full_prepacked": ours_fn(steps, exit=f"gate-full:{t}", prepack=True),
            "latentloop_gate_full_prepacked_screened": ours_fn(
                steps, exit=f"gate-full:{t}", prepack=True, screen=True
            ),
            "official_generate": theirs_fn(ref),
        }
        outputs = {name: fn() for name, fn in runners.items()}
        theirs = outputs["official_generate"]
        times = {name: [] for name in runners}
        for _ in range(args.repeats):
            for name, fn in runners.items():
                times[name].append(timed(fn)[0])
        medians = {name: statistics.median(v) for name, v in times.items()}
        row = {"steps": steps, "core_steps_official": steps}
        for name in (name for name in runners if name != "official_generate"):
            mine = outputs[name]
            agreement = (mine.sequences[:, args.prompt_len :] == theirs[:, args.prompt_len :]).float().mean()
            row[name] = {
                "same_tokens_as_official": bool(torch.equal(mine.sequences, theirs)),
                "token_agreement": round(float(agreement), 4),
                "mean_core_steps": round(mine.mean_steps, 3),
                "mean_core_passes": round(mine.mean_passes, 3),
                "speedup_vs_official": round(medians["official_generate"] / medians[name], 3),
            }
        result["gate"][str(t)] = row
    return result


def run(args: Any) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    modeling = load_reference(args.reference)
    report: dict[str, Any] = {
        "benchmark": "compare_ouro_reference",
        "environment": {
            "cpu": cpu_description(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "threads": args.threads,
        },
    }
    report["reference"] = {"folder": str(args.reference), "shims": SHIMS}
    report["parity"], expected, folder = parity(modeling, args)
    if args.fixture is not None:
        args.fixture.mkdir(parents=True, exist_ok=True)
        target = args.fixture / "model"
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(folder, target)
        save_file(
            {k: v.contiguous() for k, v in expected.items()}, str(args.fixture / "expected.safetensors")
        )
    if args.speed:
        report["speed"] = speed(modeling, args)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    emit_json_report(run(args), args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
