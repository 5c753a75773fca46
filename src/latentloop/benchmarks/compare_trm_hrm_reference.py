"""Side-by-side check of latentloop's TRM and HRM against the official TinyRecursiveModels code.

The official code is not part of latentloop: pass a checkout of the public repository
``SamsungSAILMontreal/TinyRecursiveModels`` with ``--reference DIR``. Its ``models/`` package is imported at
run time (it needs ``pydantic`` and ``einops``). HRM is taken from that repository's
``models/recursive_reasoning/hrm.py``, the HRM model of ``sapientinc/HRM`` with PyTorch's attention in place
of FlashAttention.

For each variant (TRM with attention or ``mlp_t``, HRM; each with rotary, learned or no position encodings,
the official ``pos_encodings`` ``rope``, ``learned`` and ``none``) the script builds the official model on random
fp32 weights, with a random Q-head so that samples halt at different steps, and saves its state dict as
``pretrain.py`` does (one variant with the ``_orig_mod.`` prefix of a compiled model). It converts that file
with :func:`latentloop.convert.official_reasoner` and runs 16 supervision steps of the official ACT training
loop on one batch in both (halting on, exploration off; a halted sample restarts at the next step). It
reports, as one JSON object:

* ``parity``: per variant, the max |Δ| over all steps of the logits, ``q_halt``, ``q_continue`` and both carried
  states, whether the halting decisions agree at every step, how many samples halted, the max |Δ| of the loss
  (stable-max cross-entropy plus half the halting BCE, and for HRM the bootstrapped ``q_continue`` BCE; the
  official loss divided by the batch size), and of every weight's gradient after the first step; target 1e-5;
* ``speed``: training examples per second of one supervision step (forward, loss and backward; no optimizer),
  official and latentloop, eager fp32, one thread, at the official Sudoku architecture scaled down (h 128,
  4 heads, 2 layers, H_cycles 3, L_cycles 6, batch 64, 81 positions), medians of interleaved repeats.

``--fixture DIR`` also writes, per variant, the official weights, the batch and the official outputs of every
step as ``DIR/<variant>.safetensors``: the test suite checks the conversion against these without the
official code.

Usage::

    python benchmarks/compare_trm_hrm_reference.py --reference /path/to/TinyRecursiveModels
"""

from __future__ import annotations

import copy
import importlib
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from latentloop.convert import act_rollout, act_step, convert_state_dict, official_reasoner, strip_prefixes
from latentloop.data.labels import IGNORE_LABEL
from latentloop.errors import ArgumentParser, UsageError
from latentloop.io import emit_json_report
from latentloop.models.reasoners import Reasoner

TOLERANCE = 1e-5
STEPS = 16
# Official carry name -> latentloop's, per kind.
CARRY = {"trm": {"z_H": "y", "z_L": "z"}, "hrm": {"z_H": "z_H", "z_L": "z_L"}}
MODULES = {"trm": "models.recursive_reasoning.trm", "hrm": "models.recursive_reasoning.hrm"}
CLASSES = {"trm": "TinyRecursiveReasoningModel_ACTV1", "hrm": "HierarchicalReasoningModel_ACTV1"}


def arch(kind: str, **changes: Any) -> dict[str, Any]:
    """A small official architecture of ``kind`` (the keys of its ``config/arch/*.yaml``)."""
    base = {
        "name": f"recursive_reasoning.{kind}@{CLASSES[kind]}",
        "H_cycles": 2,
        "L_cycles": 3,
        "H_layers": 1 if kind == "hrm" else 0,
        "L_layers": 2,
        "hidden_size": 16,
        "num_heads": 2,
        "expansion": 2,
        "puzzle_emb_ndim": 16,
        "puzzle_emb_len": 2,
        "pos_encodings": "rope",
        "halt_max_steps": STEPS,
        "halt_exploration_prob": 0.0,
        "forward_dtype": "float32",
        "mlp_t": False,
        "no_ACT_continue": True,
    }
    return {**base, **changes}


# The position encodings' variants have one layer (they differ from the first three only in the input
# embedding, and their fixtures stay small) and a width whose square root, the embedding scale, is not a power
# of two: multiplying by it rounds, so the order of the embedding's arithmetic must be the official one.
SMALL = {"L_layers": 1, "hidden_size": 24, "num_heads": 2}
VARIANTS = {
    "trm-attention": ("trm", arch("trm"), True),  # (kind, architecture, saved as a compiled model)
    "trm-mlp_t": ("trm", arch("trm", mlp_t=True), False),
    "hrm": ("hrm", arch("hrm", puzzle_emb_len=0), False),
    # TRM's best Sudoku-Extreme model (87.4%): its README's ``arch.mlp_t=True arch.pos_encodings=none``
    "trm-mlp_t-none": ("trm", arch("trm", mlp_t=True, pos_encodings="none", **SMALL), False),
    "trm-mlp_t-learned": ("trm", arch("trm", mlp_t=True, pos_encodings="learned", **SMALL), False),
    "trm-attention-learned": ("trm", arch("trm", pos_encodings="learned", **SMALL), True),
    "trm-attention-none": ("trm", arch("trm", pos_encodings="none", **SMALL), False),
    "hrm-learned": ("hrm", arch("hrm", puzzle_emb_len=0, pos_encodings="learned", **SMALL), False),
    "hrm-none": ("hrm", arch("hrm", puzzle_emb_len=0, pos_encodings="none", **SMALL), False),
}
# Q-head biases (q_halt, q_continue) under which samples halt at different steps, not all at once or never.
Q_BIAS = {
    "trm-attention": (-1.7, 0.0),
    "trm-mlp_t": (-1.0, 0.0),
    "hrm": (0.0, -0.5),
    "trm-mlp_t-none": (-0.5, 0.0),
    "trm-mlp_t-learned": (-1.0, 0.0),
    "trm-attention-learned": (-0.5, 0.0),
    "trm-attention-none": (-0.7, 0.0),
    "hrm-learned": (0.0, 0.0),
    "hrm-none": (-0.5, 0.0),
}
SHAPE = {"batch": 4, "seq_len": 9, "vocab": 12, "puzzles": 3}  # the parity checks'
SPEED_SHAPE = {"batch": 64, "seq_len": 81, "vocab": 11, "puzzles": 1}  # the official Sudoku data's


def import_reference(folder: Path) -> dict[str, Any]:
    """The official model classes and loss head, imported from a TinyRecursiveModels checkout."""
    if not (folder / "models" / "recursive_reasoning" / "trm.py").is_file():
        raise UsageError(
            f"{folder} is not a TinyRecursiveModels checkout (no models/recursive_reasoning/trm.py)"
        )
    sys.path.insert(0, str(folder))
    try:
        classes = {kind: getattr(importlib.import_module(MODULES[kind]), CLASSES[kind]) for kind in MODULES}
        classes["loss_head"] = importlib.import_module("models.losses").ACTLossHead
    except ImportError as error:
        raise UsageError(
            f"the official code does not import: {error} (it needs pydantic and einops)"
        ) from None
    return classes


def build_official(
    classes: dict[str, Any],
    kind: str,
    architecture: dict[str, Any],
    seed: int,
    q_bias: tuple[float, float] = (0.0, 0.0),
    shape: dict[str, int] = SHAPE,
) -> Any:
    """The official model inside its ACT loss head, with a random Q-head and puzzle embedding (the official
    start, zeros and bias -5, would never halt and would hide the puzzle prefix)."""
    config = {k: v for k, v in architecture.items() if k != "name"}
    config |= {
        "batch_size": shape["batch"],
        "seq_len": shape["seq_len"],
        "vocab_size": shape["vocab"],
        "num_puzzle_identifiers": shape["puzzles"],
    }
    torch.manual_seed(seed)
    head = classes["loss_head"](classes[kind](config), loss_type="stablemax_cross_entropy")
    inner = head.model.inner
    with torch.no_grad():
        inner.q_head.weight.normal_(0.0, architecture["hidden_size"] ** -0.5)
        inner.q_head.bias.copy_(torch.tensor(q_bias))
        if architecture["puzzle_emb_ndim"]:
            inner.puzzle_emb.weights.normal_(0.0, 1.0)
    return head


def make_batch(seed: int, shape: dict[str, int] = SHAPE) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Random puzzles and labels; a quarter of the labels are unscored (``IGNORE_LABEL``, in both codes)."""
    g = torch.Generator().manual_seed(seed)
    size = (shape["batch"], shape["seq_len"])
    inputs = torch.randint(1, shape["vocab"], size, generator=g)
    labels = torch.randint(1, shape["vocab"], size, generator=g)
    labels[torch.rand(size, generator=g) < 0.25] = IGNORE_LABEL
    puzzle_ids = torch.randint(0, shape["puzzles"], (shape["batch"],), generator=g)
    return {"inputs": inputs, "puzzle_ids": puzzle_ids}, labels


def official_batch(batch: dict[str, torch.Tensor], labels: torch.Tensor) -> dict[str, torch.Tensor]:
    return {
        "inputs": batch["inputs"].to(torch.int32),
        "labels": labels.to(torch.int32),
        "puzzle_identifiers": batch["puzzle_ids"].to(torch.int32),
    }


@torch.no_grad()
def official_rollout(head: Any, batch: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """The official ACT training loop, ``STEPS`` steps on one batch (training mode: halting on)."""
    head.train()
    carry = head.initial_carry(batch)
    records = []
    for _ in range(STEPS):
        carry, loss, _, outputs, _ = head(
            return_keys=["logits", "q_halt_logits", "q_continue_logits"], carry=carry, batch=batch
        )
        records.append(
            {
                "logits": outputs["logits"].float(),
                "q_halt": outputs["q_halt_logits"].float(),
                "q_continue": outputs["q_continue_logits"].float(),
                "halted": carry.halted.clone(),
                "loss": loss.float() / len(batch["inputs"]),
                "carry.z_H": carry.inner_carry.z_H.float(),
                "carry.z_L": carry.inner_carry.z_L.float(),
            }
        )
    return records


def compare(kind: str, theirs: list[dict], ours: list[dict]) -> dict[str, Any]:
    """Max |Δ| per quantity over every step, and whether the halting decisions agree."""
    names = {"logits": "logits", "q_halt": "q_halt", "q_continue": "q_continue", "loss": "loss"}
    names |= {f"carry.{o}": f"carry.{m}" for o, m in CARRY[kind].items()}
    worst = dict.fromkeys(names, 0.0)
    for official, mine in zip(theirs, ours, strict=True):
        for key, my_key in names.items():
            diff = (official[key].double() - mine[my_key].double()).abs().max()
            worst[key] = max(worst[key], float(diff))
    halting = all(bool((o["halted"] == m["halted"]).all()) for o, m in zip(theirs, ours, strict=True))
    return {
        "max_abs_diff": worst,
        "halting_agrees": halting,
        "halted_per_step": [int(o["halted"].sum()) for o in theirs],
    }


def gradient_check(head: Any, model: Reasoner, kind: str, batch: dict, labels: torch.Tensor) -> float:
    """Max |Δ| between the official gradients of the first step (converted to latentloop's layout) and
    latentloop's; the puzzle embedding, which the official code trains apart, is left out."""
    head, model = copy.deepcopy(head), copy.deepcopy(model)
    head.train()
    official = official_batch(batch, labels)
    _, loss, _, _, _ = head(return_keys=[], carry=head.initial_carry(official), batch=official)
    (loss / len(labels)).backward()
    grads = {k: p.grad for k, p in head.named_parameters() if p.grad is not None}
    theirs = convert_state_dict(kind, strip_prefixes(grads), model.config)
    model.train()
    act_step(model, model.initial_carry(batch), batch, labels, False)[2].backward()
    mine = dict(model.named_parameters())
    return max(float((theirs[k] - mine[k].grad).abs().max()) for k in theirs if mine[k].grad is not None)


def parity(classes: dict[str, Any], fixture: Path | None, seed: int) -> dict[str, Any]:
    results = {}
    for name, (kind, architecture, compiled) in VARIANTS.items():
        head = build_official(classes, kind, architecture, seed, Q_BIAS[name])
        batch, labels = make_batch(seed + 1)
        state = head.state_dict()
        if compiled:
            state = {f"_orig_mod.{k}": v for k, v in state.items()}
        with tempfile.TemporaryDirectory() as folder:
            file = Path(folder) / "step_1"
            torch.save(state, file)
            model = official_reasoner(kind, file, architecture, seq_len=SHAPE["seq_len"])
        theirs = official_rollout(head, official_batch(batch, labels))
        with torch.no_grad():
            ours = act_rollout(model, batch, labels, STEPS)
        result = compare(kind, theirs, ours)
        result["gradient_max_abs_diff"] = gradient_check(head, model, kind, batch, labels)
        values = [*result["max_abs_diff"].values(), result["gradient_max_abs_diff"]]
        result["passes"] = result["halting_agrees"] and max(values) <= TOLERANCE
        result["saved_keys_prefix"] = "_orig_mod.model.inner." if compiled else "model.inner."
        result["arch"] = {
            k: architecture[k] for k in ("mlp_t", "pos_encodings", "hidden_size", "L_layers", "H_layers")
        }
        results[name] = result
        if fixture is not None:
            write_fixture(fixture / f"{name}.safetensors", kind, architecture, state, batch, labels, theirs)
    return results


def write_fixture(
    path: Path,
    kind: str,
    architecture: dict[str, Any],
    state: dict[str, torch.Tensor],
    batch: dict[str, torch.Tensor],
    labels: torch.Tensor,
    records: list[dict[str, torch.Tensor]],
) -> None:
    """The official weights (as saved), the batch and the official outputs of every step."""
    tensors = {f"official.{k}": v.contiguous() for k, v in state.items()}
    tensors |= {f"batch.{k}": v.contiguous() for k, v in batch.items()} | {"batch.labels": labels}
    for step, record in enumerate(records):
        tensors |= {f"step{step}.{k}": v.contiguous() for k, v in record.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {"kind": kind, "arch": json.dumps(architecture), "seq_len": str(SHAPE["seq_len"])}
    save_file(tensors, str(path), metadata=metadata)


# Speed ------------------------------------------------------------------------------------------------------
SPEED_ARCH = {"H_cycles": 3, "L_cycles": 6, "L_layers": 2, "hidden_size": 128, "num_heads": 4, "expansion": 4}


def speed(classes: dict[str, Any], repeats: int, seed: int) -> dict[str, Any]:
    """Training examples per second of one supervision step, official vs latentloop, interleaved."""
    shape = SPEED_SHAPE
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    results = {}
    try:
        for kind in ("trm", "hrm"):
            architecture = arch(kind, **SPEED_ARCH, puzzle_emb_ndim=0, puzzle_emb_len=0)
            if kind == "hrm":
                architecture["H_layers"] = 2
            head = build_official(classes, kind, architecture, seed, shape=shape)
            with tempfile.TemporaryDirectory() as folder:
                file = Path(folder) / "step_1"
                torch.save(head.state_dict(), file)
                model = official_reasoner(kind, file, architecture, seq_len=shape["seq_len"])
            batch, labels = make_batch(seed + 1, shape)
            official = official_batch(batch, labels)
            head.train()
            model.train()

            def theirs() -> None:
                _, loss, _, _, _ = head(return_keys=[], carry=head.initial_carry(official), batch=official)  # noqa: B023
                (loss / shape["batch"]).backward()

            def ours() -> None:
                act_step(model, model.initial_carry(batch), batch, labels, False)[2].backward()  # noqa: B023

            times: dict[str, list[float]] = {"official": [], "latentloop": []}
            for call in (theirs, ours):  # warm-up
                call()
            calls = [("official", theirs), ("latentloop", ours)]
            for repeat in range(repeats):
                # Each goes first in every other repeat: neither gains from the other's warm caches.
                for name, call in calls if repeat % 2 == 0 else calls[::-1]:
                    head.zero_grad(set_to_none=True)
                    model.zero_grad(set_to_none=True)
                    start = time.perf_counter()
                    call()
                    times[name].append(time.perf_counter() - start)
            rate = {name: shape["batch"] / statistics.median(t) for name, t in times.items()}
            results[kind] = {
                "examples_per_s": {k: round(v, 1) for k, v in rate.items()},
                "ratio_latentloop_over_official": round(rate["latentloop"] / rate["official"], 3),
                "passes": rate["latentloop"] >= rate["official"],
                "architecture": {k: architecture[k] for k in (*SPEED_ARCH, "H_layers")},
            }
    finally:
        torch.set_num_threads(threads)
    return {
        "repeats": repeats,
        "batch": shape["batch"],
        "positions": shape["seq_len"],
        "threads": 1,
        "dtype": "float32",
        **results,
    }


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", type=Path, required=True, help="a TinyRecursiveModels checkout")
    parser.add_argument("--fixture", type=Path, help="also write the test fixtures into this folder")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats of each speed measurement")
    parser.add_argument("--no-speed", action="store_true", help="only the parity checks")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", help="also write the JSON report here")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    try:
        classes = import_reference(args.reference.resolve())
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    torch.set_default_dtype(torch.float32)
    report: dict[str, Any] = {
        "reference": str(args.reference.name),
        "machine": {"processor": platform.processor() or platform.machine(), "torch": torch.__version__},
        "tolerance": TOLERANCE,
        "steps": STEPS,
        "parity": parity(classes, args.fixture, args.seed),
    }
    if not args.no_speed:
        report["speed"] = speed(classes, args.repeats, args.seed)
    report["passes"] = all(r["passes"] for r in report["parity"].values()) and all(
        r["passes"] for k, r in report.get("speed", {}).items() if isinstance(r, dict)
    )
    emit_json_report(report, args.output)
    return (
        0
        if all(math.isfinite(v) for r in report["parity"].values() for v in r["max_abs_diff"].values())
        else 1
    )


if __name__ == "__main__":
    sys.exit(main())
