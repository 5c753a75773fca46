"""Side-by-side check of latentloop's recurrent-depth LM against the official huginn-0125 modeling code.

The official code (``raven_modeling_minimal.py`` and ``raven_config_minimal.py`` from the public repository
``seal-rg/recurrent-pretraining``, folder ``recpre/``) is not part of latentloop: put both files in a folder and
pass it with ``--reference DIR``; they are imported at run time and need ``transformers`` (4.x, or 5.x with the shims below).

The script builds a small random fp32 latentloop model, writes it with ``save_pretrained`` (huginn-0125 layout),
reads that folder's ``config.json`` with the official ``RavenConfig`` and loads its ``model.safetensors`` into the
official ``RavenForCausalLM`` with ``load_state_dict``. It then reports, as one JSON object:

* ``checkpoint``: whether the official classes read our folder as is (config and weight keys);
* ``logits``: max |Δ| of fp32 logits at several depths with ``init_scale=0`` (full forward and cached decode),
  target <= 1e-4; when a depth misses it, a per-module comparison names the first module that differs;
* ``generation``: greedy tokens/s at equal depth (ours: ``latentloop.models.generation.generate``, eager and
  with ``compile=True``; theirs: ``generate_minimal`` and the Hugging Face ``generate`` with their cache),
  token agreement, speed ratios (target >= 2) as medians over interleaved repeats, and the max |Δ| between
  the logits each of our paths chose its tokens from and the official full forward pass over the same
  sequence (target <= 1e-4); the compiled path's compilation is paid in the warm-up and reported apart;
* ``profile`` (with ``--profile``, or when a reference path is faster): where our generation time goes.

Run-time shims. With transformers 4.x (tested: 4.57.6) none is needed. With transformers >= 5 (tested: 5.24.0)
these are applied by monkeypatching after import, never by editing the official file, and each one applied is
listed under ``reference.shims`` in the JSON:

* ``RavenForCausalLM._tied_weights_keys``: 5.x wants a ``{target: source}`` mapping instead of the 4.x list, so it
  becomes ``{"lm_head.weight": "transformer.wte.weight"}`` (otherwise the constructor fails in ``tie_weights``);
* ``CausalLMOutputRecurrentLatents``: 5.x renames the keyword ``past_key_values`` to ``cache`` in every
  ``ModelOutput.__init__``, so the output class is replaced by an identical one whose field is named ``cache``;
* ``_get_initial_cache_position`` / ``_update_model_kwargs_for_generation``: ``generate_minimal`` calls these 4.x
  ``GenerationMixin`` helpers; 5.x removed the first and no longer advances ``cache_position`` in the second, so
  both get their 4.x behaviour back on the official class.

The official Hugging Face ``generate`` path does not fit the 5.x generation loop at all; under 5.x only
``generate_minimal`` is timed (``reference.generation_paths_skipped`` says so).

Usage::

    python benchmarks/compare_huginn_reference.py --reference /tmp/huginn_ref
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import json
import platform
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn
from torch.profiler import ProfilerActivity, profile

try:  # only this comparison needs transformers, which latentloop does not depend on
    import transformers
except ImportError:
    transformers = None

from latentloop.errors import ArgumentParser
from latentloop.io import emit_json_report
from latentloop.models.generation import generate
from latentloop.models.kv_cache import RecurrentKVCache
from latentloop.models.recurrent_depth import RecurrentDepthConfig, RecurrentDepthLM

REFERENCE_FILES = ("raven_config_minimal.py", "raven_modeling_minimal.py")
OURS = {"latentloop": False, "latentloop_compiled": True}  # our generation paths: name -> compile
PACKAGE = "huginn_reference"


class SetupError(RuntimeError):
    """The reference code cannot be found or imported: reported as one line, exit status 2."""


# Command line -----------------------------------------------------------------------------------------------


def int_list(text: str) -> list[int]:
    """``"1,4,8"`` -> ``[1, 4, 8]`` (argparse type)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and check the command line; ``--quick`` shrinks the defaults not given explicitly."""
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--reference",
        type=Path,
        required=True,
        help="folder with raven_modeling_minimal.py and raven_config_minimal.py",
    )
    parser.add_argument("--quick", action="store_true", help="small, fast run")
    parser.add_argument("--depths", type=int_list, default=[1, 4, 8, 32], help="depths for the logit check")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="max |Δ logits| allowed")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per row for the logit check")
    parser.add_argument("--batch", type=int, default=2, help="rows for the logit check")
    parser.add_argument("--decode-tokens", type=int, default=4, help="tokens decoded one by one with caches")
    parser.add_argument("--gen-depths", type=int_list, help="depths for the generation timing (default 8,32)")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, help="greedy tokens per generate call (default 32)")
    parser.add_argument("--repeats", type=int, help="timed repeats; medians are reported (default 5)")
    parser.add_argument(
        "--reference-generate",
        default="minimal,hf",
        help="official generation paths to time: minimal (generate_minimal), hf (Hugging Face generate)",
    )
    parser.add_argument("--profile", action="store_true", help="always profile our generation")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-embd", type=int, default=256)
    parser.add_argument("--n-heads", type=int, default=4)
    parser.add_argument("--layers", type=int_list, default=[1, 2, 1], help="prelude,core,coda layers")
    parser.add_argument("--intermediate-size", type=int, default=704)
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.gen_depths is None:
        args.gen_depths = [8] if args.quick else [8, 32]
    if args.new_tokens is None:
        args.new_tokens = 16 if args.quick else 32
    if args.repeats is None:
        args.repeats = 2 if args.quick else 5
    if args.quick and args.depths == [1, 4, 8, 32]:
        args.depths = [1, 4, 32]
    if len(args.layers) != 3:
        parser.error("--layers takes three numbers: prelude,core,coda")
    for name in ("seq_len", "batch", "prompt_len", "new_tokens", "repeats", "threads", "decode_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.decode_tokens >= args.seq_len:
        parser.error("--decode-tokens must be smaller than --seq-len")
    if max(args.seq_len, args.prompt_len + args.new_tokens) > args.block_size:
        parser.error("--block-size must cover --seq-len and --prompt-len + --new-tokens")
    args.reference_generate = [p.strip() for p in args.reference_generate.split(",") if p.strip()]
    if not args.reference_generate or set(args.reference_generate) - {"minimal", "hf"}:
        parser.error("--reference-generate takes minimal, hf or minimal,hf")
    return args


# Loading the official code ----------------------------------------------------------------------------------


def load_reference(folder: Path) -> tuple[types.ModuleType, types.ModuleType, list[str]]:
    """Import the official config and modeling files from ``folder`` as package ``huginn_reference`` (the
    modeling file imports its config relatively); returns both modules and the shims applied."""
    folder = folder.expanduser().resolve()
    missing = [name for name in REFERENCE_FILES if not (folder / name).is_file()]
    if missing:
        raise SetupError(
            f"{folder} lacks {', '.join(missing)} (copy them from seal-rg/recurrent-pretraining/recpre)"
        )
    if transformers is None:
        raise SetupError("the official code needs transformers: pip install 'transformers<5'")
    major = int(transformers.__version__.split(".")[0])
    package = types.ModuleType(PACKAGE)
    package.__path__ = [str(folder)]
    sys.modules[PACKAGE] = package
    modules = {}
    try:
        for name in ("raven_config_minimal", "raven_modeling_minimal"):
            spec = importlib.util.spec_from_file_location(f"{PACKAGE}.{name}", folder / f"{name}.py")
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            modules[name] = module
    except Exception as error:  # the official file runs arbitrary import-time code
        raise SetupError(f"importing the official code failed: {type(error).__name__}: {error}") from None
    transformers.logging.set_verbosity_error()
    modeling = modules["raven_modeling_minimal"]
    shims = apply_transformers5_shims(modeling) if major >= 5 else []
    return modules["raven_config_minimal"], modeling, shims


def apply_transformers5_shims(modeling: types.ModuleType) -> list[str]:
    """Make the official file (written for transformers 4.x) run under transformers >= 5; returns what was done.

    Only module globals and class attributes of the imported reference are replaced; the file is not edited.
    """
    ModelOutput = transformers.utils.ModelOutput

    shims = []
    model_cls = modeling.RavenForCausalLM
    if isinstance(getattr(model_cls, "_tied_weights_keys", None), list):
        # 5.x reads a {target: source} mapping; 4.x took a list of targets tied to the input embedding.
        model_cls._tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}
        shims.append("RavenForCausalLM._tied_weights_keys = {'lm_head.weight': 'transformer.wte.weight'}")

    output_cls = modeling.CausalLMOutputRecurrentLatents
    if "past_key_values" in getattr(output_cls, "__dataclass_fields__", {}):
        # 5.x renames the keyword past_key_values to cache in every ModelOutput __init__, so an output class with a
        # past_key_values field cannot be built; the replacement names the field cache (5.x maps the old name).
        @dataclass
        class CausalLMOutputRecurrentLatents(ModelOutput):
            loss: torch.Tensor | None = None
            log_ppl: torch.Tensor | None = None
            logits: torch.Tensor | None = None
            cache: Any = None
            latent_states: torch.Tensor | None = None
            hidden_states: torch.Tensor | None = None
            attention_maps: dict[int, torch.Tensor] | None = None
            stats: dict | None = None

        modeling.CausalLMOutputRecurrentLatents = CausalLMOutputRecurrentLatents
        shims.append("CausalLMOutputRecurrentLatents: field past_key_values renamed cache")

    if not hasattr(model_cls, "_get_initial_cache_position"):
        # generate_minimal calls these 4.x GenerationMixin helpers; 5.x dropped the first and no longer advances
        # cache_position in the second. Both are restored with their 4.x behaviour for an empty cache.
        def _get_initial_cache_position(self: Any, seq_length: int, device: Any, model_kwargs: dict) -> dict:
            model_kwargs["cache_position"] = torch.arange(seq_length, device=device)
            return model_kwargs

        def _update_model_kwargs_for_generation(
            self: Any, outputs: Any, model_kwargs: dict, *_: Any, **kw: Any
        ) -> dict:
            model_kwargs["past_key_values"] = outputs["cache"]
            position = model_kwargs.get("cache_position")
            if position is not None:
                model_kwargs["cache_position"] = position[-1:] + kw.get("num_new_tokens", 1)
            return model_kwargs

        model_cls._get_initial_cache_position = _get_initial_cache_position
        model_cls._update_model_kwargs_for_generation = _update_model_kwargs_for_generation
        shims.append(
            "RavenForCausalLM._get_initial_cache_position / _update_model_kwargs_for_generation: 4.x behaviour "
            "(generate_minimal only; the Hugging Face generate path is not timed under transformers>=5)"
        )
    return shims


def build_models(
    args: argparse.Namespace, folder: Path, config_module: types.ModuleType, modeling: types.ModuleType
) -> tuple[RecurrentDepthLM, nn.Module, dict[str, Any]]:
    """Our random model, saved to ``folder`` and loaded into the official class; plus a report of the loading."""
    prelude, core, coda = args.layers
    config = RecurrentDepthConfig(
        n_embd=args.n_embd,
        n_heads=args.n_heads,
        n_layers_in_prelude=prelude,
        n_layers_in_recurrent_block=core,
        n_layers_in_coda=coda,
        intermediate_size=args.intermediate_size,
        vocab_size=args.vocab_size,
        block_size=args.block_size,
    )
    torch.manual_seed(args.seed)
    ours = RecurrentDepthLM(config).float().eval()
    ours.save_pretrained(folder)
    report: dict[str, Any] = {}

    # The config: first exactly as the official loader reads a folder, then (if that fails) from the same JSON
    # without the keys RavenConfig cannot take as keyword arguments.
    raven_config_cls = config_module.RavenConfig
    try:
        raven_config = raven_config_cls.from_pretrained(str(folder))
        report["config_json_loads_with_official_class"] = True
    except Exception as error:
        report["config_json_loads_with_official_class"] = False
        report["config_json_error"] = f"{type(error).__name__}: {error}"
        data = json.loads((folder / "config.json").read_text())
        dropped = [key for key in ("tie_word_embeddings",) if key in data]
        for key in dropped:
            data.pop(key)
        report["config_json_keys_dropped_for_fallback"] = dropped
        raven_config = raven_config_cls(**data)
    fields = {
        "n_embd": config.n_embd,
        "n_heads": config.n_heads,
        "head_dim": config.head_dim,
        "n_layers_in_prelude": config.n_layers_in_prelude,
        "n_layers_in_recurrent_block": config.n_layers_in_recurrent_block,
        "n_layers_in_coda": config.n_layers_in_coda,
        "intermediate_size": config.intermediate_size,
        "vocab_size": config.vocab_size,
        "block_size": config.block_size,
        "rope_base": config.rope_base,
        "norm_eps": config.norm_eps,
        "tie_embeddings": config.tie_embeddings,
        "qk_bias": config.qk_bias,
    }
    report["config_field_mismatches"] = {
        name: {"ours": value, "official": getattr(raven_config, name, None)}
        for name, value in fields.items()
        if getattr(raven_config, name, None) != value
    }

    torch.manual_seed(args.seed + 1)
    reference = modeling.RavenForCausalLM(raven_config).float().eval()
    own_freqs = reference.freqs_cis.detach().clone()
    state = load_file(str(folder / "model.safetensors"))
    result = reference.load_state_dict(state, strict=False)
    report["missing_keys"] = sorted(result.missing_keys)
    report["unexpected_keys"] = sorted(result.unexpected_keys)
    report["lm_head_tied_to_wte"] = (
        reference.lm_head.weight.data_ptr() == reference.transformer.wte.weight.data_ptr()
    )
    # Our freqs_cis buffer replaced theirs on load; check it against the one their code computes.
    report["freqs_cis_max_abs_diff_vs_official"] = float(
        (state["freqs_cis"].float() - own_freqs.float()).abs().max()
    )
    report["parameters"] = ours.num_parameters()
    return ours, reference, report


# Logits -----------------------------------------------------------------------------------------------------


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| in fp32."""
    return float((a.float() - b.float()).abs().max())


@torch.no_grad()
def compare_full_forward(
    ours: RecurrentDepthLM, reference: nn.Module, ids: torch.Tensor, depth: int
) -> float:
    """Max |Δ| of the logits of one full forward pass at ``depth`` (zero initial state)."""
    a = ours(ids, num_steps=depth, init_scale=0.0).logits
    b = reference(ids, num_steps=depth, init_scale=0.0).logits
    return max_abs_diff(a, b)


@torch.no_grad()
def compare_cached_decode(
    ours: RecurrentDepthLM,
    reference: nn.Module,
    modeling: types.ModuleType,
    ids: torch.Tensor,
    depth: int,
    n: int,
) -> float:
    """Prefill all but the last ``n`` tokens with each side's KV cache, decode those ``n`` one at a time, and
    return the max |Δ| over all logits produced."""
    config = ours.config
    length = ids.shape[1]
    cache = RecurrentKVCache(ids.shape[0], config.n_heads, config.head_dim, length, None, torch.float32)
    theirs_cache = modeling.HuginnDynamicCache()
    prefix = length - n
    worst = max_abs_diff(
        ours(ids[:, :prefix], num_steps=depth, init_scale=0.0, cache=cache).logits,
        reference(
            input_ids=ids[:, :prefix],
            num_steps=depth,
            init_scale=0.0,
            past_key_values=theirs_cache,
            use_cache=True,
            cache_position=torch.arange(prefix),
        ).logits,
    )
    for t in range(prefix, length):
        a = ours(ids[:, t : t + 1], num_steps=depth, init_scale=0.0, cache=cache).logits
        b = reference(
            input_ids=ids[:, t : t + 1],
            num_steps=depth,
            init_scale=0.0,
            past_key_values=theirs_cache,
            use_cache=True,
            cache_position=torch.tensor([t]),
        ).logits
        worst = max(worst, max_abs_diff(a, b))
    return worst


@torch.no_grad()
def locate_difference(
    ours: RecurrentDepthLM, reference: nn.Module, ids: torch.Tensor, depth: int, tolerance: float
) -> dict[str, Any]:
    """Record every same-named module's outputs on both sides (in our call order) and report where they first
    differ by more than ``tolerance``. Both models share the huginn module names, so names match one to one."""
    theirs_modules = dict(reference.named_modules())
    records: dict[str, dict[str, list[torch.Tensor]]] = {"ours": {}, "theirs": {}}
    order: list[tuple[str, int]] = []
    handles = []

    def hook_for(side: str, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            tensor = output[0] if isinstance(output, (tuple, list)) else output
            if not isinstance(tensor, torch.Tensor):
                tensor = getattr(output, "logits", None)
            if isinstance(tensor, torch.Tensor):
                calls = records[side].setdefault(name, [])
                calls.append(tensor.detach().float().clone())
                if side == "ours":
                    order.append((name, len(calls) - 1))

        return hook

    for name, module in ours.named_modules():
        if name and name in theirs_modules:
            handles.append(module.register_forward_hook(hook_for("ours", name)))
            handles.append(theirs_modules[name].register_forward_hook(hook_for("theirs", name)))
    try:
        ours(ids, num_steps=depth, init_scale=0.0)
        reference(ids, num_steps=depth, init_scale=0.0)
    finally:
        for handle in handles:
            handle.remove()
    rows = []
    for name, call in order:
        theirs_calls = records["theirs"].get(name, [])
        if call >= len(theirs_calls) or theirs_calls[call].shape != records["ours"][name][call].shape:
            rows.append(
                {"module": name, "call": call, "max_abs_diff": None, "note": "no matching call/shape"}
            )
            continue
        rows.append(
            {
                "module": name,
                "call": call,
                "max_abs_diff": max_abs_diff(records["ours"][name][call], theirs_calls[call]),
            }
        )
    first = next((r for r in rows if r["max_abs_diff"] is None or r["max_abs_diff"] > tolerance), None)
    return {
        "depth": depth,
        "first_module_over_tolerance": first,
        "modules_compared": len(rows),
        "largest": sorted(
            (r for r in rows if r["max_abs_diff"] is not None), key=lambda r: r["max_abs_diff"], reverse=True
        )[:8],
    }


def check_logits(
    ours: RecurrentDepthLM, reference: nn.Module, modeling: types.ModuleType, args: argparse.Namespace
) -> dict[str, Any]:
    """Logit differences at every ``--depths`` value (full forward and cached decode), with a per-module
    diagnosis when a depth exceeds the tolerance."""
    generator = torch.Generator().manual_seed(args.seed + 2)
    ids = torch.randint(0, args.vocab_size, (args.batch, args.seq_len), generator=generator)
    single = ids[:1]
    per_depth = {}
    for depth in args.depths:
        per_depth[f"r={depth}"] = {
            "full_forward_max_abs_diff": compare_full_forward(ours, reference, ids, depth),
            "cached_decode_max_abs_diff": compare_cached_decode(
                ours, reference, modeling, single, depth, args.decode_tokens
            ),
        }
    worst = max(max(v.values()) for v in per_depth.values())
    report: dict[str, Any] = {
        "dtype": "float32",
        "init_scale": 0.0,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "decode_tokens": args.decode_tokens,
        "per_depth": per_depth,
        "max_abs_diff": worst,
        "tolerance": args.tolerance,
        "within_tolerance": worst <= args.tolerance,
    }
    failing = [d for d in args.depths if max(per_depth[f"r={d}"].values()) > args.tolerance]
    if failing:
        report["diagnosis"] = [
            locate_difference(ours, reference, ids, d, args.tolerance) for d in sorted({1, failing[0]})
        ]
    return report


# Generation -------------------------------------------------------------------------------------------------


def generation_runners(
    ours: RecurrentDepthLM, reference: nn.Module, prompt: torch.Tensor, depth: int, args: argparse.Namespace
) -> dict[str, Callable[[], torch.Tensor]]:
    """Callables returning the full greedy sequence [1, T0 + new] for each implementation at ``depth``."""
    GenerationConfig = transformers.GenerationConfig

    n = args.new_tokens

    def config() -> Any:
        return GenerationConfig(max_new_tokens=n, do_sample=False, use_cache=True, pad_token_id=0)

    def latentloop(compiled: bool) -> torch.Tensor:
        return generate(
            ours, prompt, max_new_tokens=n, num_steps=depth, init_scale=0.0, compile=compiled
        ).sequences

    runners: dict[str, Callable[[], torch.Tensor]] = {
        name: functools.partial(latentloop, compiled) for name, compiled in OURS.items()
    }
    if "minimal" in args.reference_generate:
        # generate_minimal reads max_new_tokens from its keyword arguments, not from the GenerationConfig
        # (otherwise it falls back to GenerationConfig.max_length = 20 tokens in all).
        runners["official_generate_minimal"] = lambda: reference.generate_minimal(
            prompt, config(), num_steps=depth, init_scale=0.0, max_new_tokens=n
        )
    if "hf" in args.reference_generate:
        runners["official_hf_generate"] = lambda: reference.generate(
            prompt, config(), num_steps=depth, init_scale=0.0
        )
    return runners


def token_agreement(a: torch.Tensor, b: torch.Tensor, start: int) -> dict[str, Any]:
    """Compare the new tokens (from ``start``) of two [1, T] sequences."""
    x, y = a[0, start:], b[0, start:]
    n = min(len(x), len(y))
    same = x[:n] == y[:n]
    diverged = (~same).nonzero()
    return {
        "identical": bool(len(x) == len(y) and torch.equal(x, y)),
        "agreement": float(same.double().mean()) if n else 1.0,
        "first_divergence": int(diverged[0]) if diverged.numel() else None,
        "new_tokens": [len(x), len(y)],
    }


@torch.no_grad()
def chosen_logits_diff(
    ours: RecurrentDepthLM, reference: nn.Module, prompt: torch.Tensor, depth: int, n: int, compiled: bool
) -> float:
    """Max |Δ| between the logits our greedy decoding chose each new token from and the official model's full
    forward pass over the generated sequence (positions T0 - 1 onwards)."""
    out = generate(
        ours, prompt, max_new_tokens=n, num_steps=depth, init_scale=0.0, compile=compiled, return_logits=True
    )
    theirs = reference(out.sequences[:, :-1], num_steps=depth, init_scale=0.0).logits
    return max_abs_diff(out.logits, theirs[:, prompt.shape[1] - 1 :])


@torch.no_grad()
def check_generation(
    ours: RecurrentDepthLM, reference: nn.Module, args: argparse.Namespace
) -> dict[str, Any]:
    """Greedy tokens/s of our paths and the official ones at each ``--gen-depths`` value, interleaved per
    repeat, with speed ratios (median of per-repeat ratios), token agreement and chosen-logit differences."""
    generator = torch.Generator().manual_seed(args.seed + 3)
    prompt = torch.randint(0, args.vocab_size, (1, args.prompt_len), generator=generator)
    report: dict[str, Any] = {}
    for depth in args.gen_depths:
        runners = generation_runners(ours, reference, prompt, depth, args)
        outputs, warmup_seconds = {}, {}
        for name, run in runners.items():  # warm-up (the compiled path compiles here) and outputs
            start = time.perf_counter()
            outputs[name] = run()
            warmup_seconds[name] = time.perf_counter() - start
        tps: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(args.repeats):
            for name, run in runners.items():
                start = time.perf_counter()
                sequence = run()
                tps[name].append((sequence.shape[1] - args.prompt_len) / (time.perf_counter() - start))
        theirs = [name for name in runners if name not in OURS]
        entry: dict[str, Any] = {
            "tokens_per_second": {name: statistics.median(v) for name, v in tps.items()},
            "tokens_per_second_runs": tps,
            "warmup_seconds": warmup_seconds,
            "speed_ratio_ours_over": {
                mine: {
                    name: statistics.median(a / b for a, b in zip(tps[mine], tps[name], strict=True))
                    for name in theirs
                }
                for mine in OURS
            },
            "token_agreement_with_ours": {
                mine: {
                    name: token_agreement(outputs[mine], outputs[name], args.prompt_len) for name in theirs
                }
                for mine in OURS
            },
            "chosen_logits_max_abs_diff_vs_official_forward": {
                mine: chosen_logits_diff(ours, reference, prompt, depth, args.new_tokens, compiled)
                for mine, compiled in OURS.items()
            },
        }
        report[f"r={depth}"] = entry
    summary: dict[str, Any] = {
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "greedy": True,
        "batch_size": 1,
        "target_ratio": 2.0,
        "logit_tolerance": args.tolerance,
    }
    for mine in OURS:
        ratios = [r for entry in report.values() for r in entry["speed_ratio_ours_over"][mine].values()]
        agreements = [a for e in report.values() for a in e["token_agreement_with_ours"][mine].values()]
        worst_logits = max(e["chosen_logits_max_abs_diff_vs_official_forward"][mine] for e in report.values())
        summary[mine] = {
            "min_speed_ratio": min(ratios) if ratios else None,
            "all_outputs_identical": all(a["identical"] for a in agreements),
            "chosen_logits_max_abs_diff": worst_logits,
            "meets_target": bool(ratios)
            and min(ratios) >= 2.0
            and all(a["identical"] for a in agreements)
            and worst_logits <= args.tolerance,
        }
    return {**summary, "per_depth": report}


# Profiling --------------------------------------------------------------------------------------------------


@torch.no_grad()
def profile_ours(ours: RecurrentDepthLM, args: argparse.Namespace, depth: int) -> dict[str, Any]:
    """Where one greedy ``generate`` call spends its time: top torch ops (self CPU time) and wall time per model
    part (forward hooks; the rest is Python-side decoding overhead outside the modules)."""
    generator = torch.Generator().manual_seed(args.seed + 3)
    prompt = torch.randint(0, args.vocab_size, (1, args.prompt_len), generator=generator)

    def call() -> None:
        generate(ours, prompt, max_new_tokens=args.new_tokens, num_steps=depth, init_scale=0.0)

    call()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total_self = sum(e.self_cpu_time_total for e in events) or 1
    top_ops = [
        {
            "op": e.key,
            "calls": e.count,
            "self_cpu_ms": e.self_cpu_time_total / 1000,
            "share": e.self_cpu_time_total / total_self,
        }
        for e in events[:15]
    ]

    groups: dict[str, float] = {}
    stack: list[float] = []
    handles = []
    parts = {
        "wte": ours.transformer.wte,
        "prelude": ours.transformer.prelude,
        "adapter": ours.transformer.adapter,
        "core_block": ours.transformer.core_block,
        "coda": ours.transformer.coda,
        "ln_f": ours.transformer.ln_f,
        "lm_head": ours.lm_head,
    }
    for group, container in parts.items():
        modules = list(container) if isinstance(container, nn.ModuleList) else [container]
        for module in modules:
            handles.append(module.register_forward_pre_hook(lambda *_: stack.append(time.perf_counter())))

            def post(*_: Any, group: str = group) -> None:
                groups[group] = groups.get(group, 0.0) + time.perf_counter() - stack.pop()

            handles.append(module.register_forward_hook(post))
    try:
        start = time.perf_counter()
        call()
        total = time.perf_counter() - start
    finally:
        for handle in handles:
            handle.remove()
    inside = sum(groups.values())
    return {
        "depth": depth,
        "top_ops_self_cpu": top_ops,
        "wall_seconds": total,
        "wall_seconds_by_part": {**groups, "outside_modules": total - inside},
    }


# Main -------------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Load the official code, build both models and return the whole report."""
    torch.set_num_threads(args.threads)
    config_module, modeling, shims = load_reference(args.reference)
    skipped = []
    if int(transformers.__version__.split(".")[0]) >= 5 and "hf" in args.reference_generate:
        # The official prepare_inputs_for_generation does not fit the 5.x generate loop (cache passed as `cache`,
        # inputs no longer sliced), so only generate_minimal is timed there.
        args.reference_generate = [path for path in args.reference_generate if path != "hf"]
        skipped.append(
            "hf: the official file's Hugging Face generate path does not run under transformers>=5"
        )
        if not args.reference_generate:
            raise SetupError("with transformers>=5 only --reference-generate minimal can be timed")

    report: dict[str, Any] = {
        "benchmark": "compare_huginn_reference",
        "reference": {
            "folder": str(args.reference.expanduser().resolve()),
            "transformers": transformers.__version__,
            "shims": shims,
            "generation_paths": args.reference_generate,
            "generation_paths_skipped": skipped,
        },
        "environment": {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "threads": torch.get_num_threads(),
            "device": "cpu",
        },
        "model": {
            "n_embd": args.n_embd,
            "n_heads": args.n_heads,
            "layers": args.layers,
            "intermediate_size": args.intermediate_size,
            "vocab_size": args.vocab_size,
            "block_size": args.block_size,
            "dtype": "float32",
            "weights": "random",
        },
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="latentloop-huginn-") as tmp:
        ours, reference, loading = build_models(args, Path(tmp) / "checkpoint", config_module, modeling)
    report["checkpoint"] = loading
    report["logits"] = check_logits(ours, reference, modeling, args)
    report["generation"] = check_generation(ours, reference, args)
    per_depth = report["generation"]["per_depth"]
    slower = [
        d
        for d in args.gen_depths
        if min(per_depth[f"r={d}"]["speed_ratio_ours_over"]["latentloop"].values()) < 1.0
    ]
    if args.profile or slower:
        report["profile"] = profile_ours(ours, args, slower[0] if slower else args.gen_depths[-1])
    report["wall_seconds"] = time.perf_counter() - started
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """Print the JSON report; exit status 2 with one line when the reference cannot be used."""
    args = parse_args(argv)
    try:
        report = run(args)
    except SetupError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    emit_json_report(report, args.output, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
