"""Official TinyRecursiveModels and HRM checkpoints as latentloop reasoners.

The official ``pretrain.py`` saves ``model.state_dict()`` of its ACT loss head with ``torch.save``: keys such as
``_orig_mod.model.inner.L_level.layers.0.self_attn.qkv_proj.weight`` (``_orig_mod.`` when the model was
compiled), and it writes the run's configuration as ``all_config.yaml`` beside the checkpoints. The
architecture itself is the ``arch`` part of that file, or one of its ``config/arch/*.yaml``.

Both official models map onto latentloop's TRM and HRM exactly:

- blocks are post-norm with a weight-free RMSNorm (``model.norm_weight: false``), a fused QKV projection and
  a SwiGLU of width ``expansion * dim * 2/3`` rounded up to 256 (``model.expansion``);
- TRM's ``mlp_t`` is ``model.mixer: mlp-t``; HRM's separate stacks are ``n_layers`` (L) and ``h_layers`` (H);
- ``puzzle_emb_ndim`` and ``puzzle_emb_len`` become ``puzzle_dim`` and ``puzzle_tokens``, ``H_cycles`` and
  ``L_cycles`` become ``cycles`` and ``inner``, ``halt_max_steps`` becomes ``n_sup``;
- rotary embeddings rotate the two halves of each head, as in the official code (``model.rope_layout:
  halves``; latentloop's own models rotate adjacent pairs);
- ``pos_encodings`` ``rope``, ``learned`` and ``none`` become ``model.pos_encoding`` of the same name (TRM's
  best Sudoku model is ``mlp_t`` with ``none``); the learned table ``embed_pos`` becomes ``pos_embed``;
- the official ``q_head`` (``[q_halt, q_continue]``) is split into the halting head's two outputs; TRM with
  ``no_ACT_continue`` halts on ``q_halt > 0`` (``halting: bce``), HRM on ``q_halt > q_continue``
  (``halting: q-learning``).

latentloop's value head has no official counterpart: it keeps its initial weights (and the converted run
config trains it with weight 0).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from latentloop.config import load_yaml
from latentloop.errors import UsageError
from latentloop.families import family
from latentloop.models.reasoners import Reasoner, ReasonerConfig, build_reasoner
from latentloop.models.reasoners.heads import halt_decision
from latentloop.tasks.base import get_task, parse_task_spec
from latentloop.train.deep_supervision import next_step_continue_target, supervision_loss
from latentloop.train.loop import train
from latentloop.train.run_config import ReasonerTrainConfig

KINDS = ("trm", "hrm")
# The official model classes each kind accepts (the ``name`` of its architecture yaml).
_MODEL_NAMES = {
    "trm": ("recursive_reasoning.trm@TinyRecursiveReasoningModel_ACTV1",),
    "hrm": (
        "hrm.hrm_act_v1@HierarchicalReasoningModel_ACTV1",
        "recursive_reasoning.hrm@HierarchicalReasoningModel_ACTV1",
    ),
}
_PREFIXES = ("_orig_mod.", "model.", "inner.")
# The official ``pos_encodings``: each is latentloop's ``model.pos_encoding`` of the same name.
OFFICIAL_POS_ENCODINGS = ("rope", "learned", "none")


def read_official_config(path: str | Path) -> dict[str, Any]:
    """The architecture of an official run: ``path`` is its ``all_config.yaml`` (the ``arch`` part is taken)
    or an architecture yaml such as ``config/arch/trm.yaml``. ``${.key}`` references to a sibling key (the
    architecture yamls' ``puzzle_emb_ndim: ${.hidden_size}``) are resolved."""
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise UsageError(f"{path} does not hold an official configuration (a YAML mapping)")
    arch = data.get("arch", data)
    if not isinstance(arch, dict) or "name" not in arch:
        raise UsageError(f"{path} has no official architecture (no 'name' key, at the top or under 'arch')")
    resolved = dict(arch)
    for key, value in arch.items():
        match = re.fullmatch(r"\$\{\.(\w+)\}", value) if isinstance(value, str) else None
        if match:
            if match.group(1) not in arch:
                raise UsageError(f"{path}: {key} refers to {match.group(1)}, which the architecture lacks")
            resolved[key] = arch[match.group(1)]
    return resolved


def load_official_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint saved by the official ``pretrain.py``, their key prefixes removed.

    Read with ``torch.load(weights_only=True)``: nothing is unpickled but tensors, and a file that is not a
    plain dict of tensors is refused."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"official checkpoint {path} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch.load raises many types for files that are not plain tensor pickles
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UsageError(f"{path} is not a plain state dict of tensors: {reason}") from None
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise UsageError(f"{path} is not a plain state dict of tensors")
    return strip_prefixes(state)


def strip_prefixes(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with the official wrappers' key prefixes removed: ``_orig_mod.`` (compiled), ``model.`` (the
    ACT loss head) and ``inner.`` (the ACT wrapper)."""
    stripped = {}
    for key, value in state.items():
        for prefix in _PREFIXES:
            key = key.removeprefix(prefix)
        stripped[key] = value
    return stripped


def reasoner_config(
    kind: str,
    arch: dict[str, Any],
    state: dict[str, torch.Tensor],
    seq_len: int | None = None,
) -> ReasonerConfig:
    """latentloop's config for official architecture ``arch`` of ``kind`` (trm or hrm), with the sizes the
    official code takes from its dataset read from the weights: vocabulary from the token embedding, puzzle
    count from the puzzle embedding, sequence length from ``mlp_t``'s width or else ``seq_len``."""
    if kind not in KINDS:
        raise UsageError(f"unknown official model {kind!r} (known: {', '.join(KINDS)})")
    name = str(arch.get("name", ""))
    if name not in _MODEL_NAMES[kind]:
        raise UsageError(
            f"the configuration is for {name!r}, not an official {kind.upper()} "
            f"({' or '.join(_MODEL_NAMES[kind])}); the other official variants are not supported"
        )
    pos_encoding = str(arch.get("pos_encodings", "rope"))
    if pos_encoding not in OFFICIAL_POS_ENCODINGS:
        raise UsageError(
            f"pos_encodings {pos_encoding!r} is not an official option (one of {', '.join(OFFICIAL_POS_ENCODINGS)})"
        )

    def need(key: str) -> Any:
        if key not in arch:
            raise UsageError(f"the official configuration lacks {key!r}")
        return arch[key]

    dim, heads = int(need("hidden_size")), int(need("num_heads"))
    puzzle_dim = int(arch.get("puzzle_emb_ndim", 0))
    puzzle_tokens = -(puzzle_dim // -dim)  # the official ceil division
    if kind == "trm" and int(arch.get("puzzle_emb_len", 16)):
        puzzle_tokens = int(arch.get("puzzle_emb_len", 16))
    if puzzle_tokens and not puzzle_dim:
        raise UsageError(
            "puzzle_emb_len > 0 with puzzle_emb_ndim 0 leaves prefix positions with no embedding "
            "(the official model cannot run it either); set puzzle_emb_len: 0"
        )

    def rows(key: str, axis: int = 0) -> int:
        if key not in state:
            raise UsageError(f"the checkpoint has no {key}, which its configuration implies")
        return int(state[key].shape[axis])

    vocab = rows("embed_tokens.embedding_weight")
    puzzles = rows("puzzle_emb.weights") if puzzle_dim else 0
    mlp_t = bool(arch.get("mlp_t", False))
    seq_len = _sequence_length(seq_len, rows if mlp_t else None, puzzle_tokens)
    # HRM halts on q_halt > q_continue, and so does TRM when trained with its continue loss.
    q_learning = kind == "hrm" or not arch.get("no_ACT_continue", True)
    halting = "q-learning" if q_learning else "bce"
    return ReasonerConfig(
        vocab_size=vocab,
        seq_len=seq_len,
        dim=dim,
        n_heads=heads,
        n_layers=int(need("L_layers")),
        h_layers=int(need("H_layers")) if kind == "hrm" else 0,
        expansion=float(need("expansion")),
        block="post-norm",
        mixer="mlp-t" if mlp_t else "attention",
        n_sup=int(need("halt_max_steps")),
        cycles=int(need("H_cycles")),
        inner=int(need("L_cycles")),
        rope_base=float(arch.get("rope_theta", 10_000.0)),
        norm_eps=float(arch.get("rms_norm_eps", 1e-5)),
        halting=halting,
        puzzles=puzzles,
        puzzle_tokens=max(puzzle_tokens, 1),
        puzzle_dim=puzzle_dim,
        norm_weight=False,
        rope_layout="halves",
        pos_encoding=pos_encoding,
        init="lecun",
    )


def _sequence_length(given: int | None, rows: Callable[..., int] | None, puzzle_tokens: int) -> int:
    """The puzzle's length: read from mlp_t's gate-up projection (``rows`` of the weights, which read the whole
    latent: prefix and puzzle) when the model has one, else the ``--seq-len`` given."""
    if rows is not None:
        inferred = rows("L_level.layers.0.mlp_t.gate_up_proj.weight", axis=1) - puzzle_tokens
        if given is not None and given != inferred:
            raise UsageError(f"--seq-len {given} does not fit mlp_t's weights ({inferred} positions)")
        return inferred
    if given is None:
        raise UsageError(
            "the sequence length is not in an attention model's weights: give --seq-len, or --task"
        )
    return given


def convert_state_dict(
    kind: str, state: dict[str, torch.Tensor], config: ReasonerConfig
) -> dict[str, torch.Tensor]:
    """latentloop's names and layouts for the official tensors ``state`` (prefixes already removed)."""
    stacks = {"trm": {"L_level": "net"}, "hrm": {"L_level": "L", "H_level": "H"}}[kind]
    inits = {"trm": ("y_init", "z_init"), "hrm": ("z_H_init", "z_L_init")}[kind]
    layer = {
        "self_attn.qkv_proj.weight": "attn.Wqkv.weight",
        "self_attn.o_proj.weight": "attn.proj.weight",
        "mlp.gate_up_proj.weight": "mlp.fc.weight",
        "mlp.down_proj.weight": "mlp.proj.weight",
        "mlp_t.gate_up_proj.weight": "mix.fc.weight",
        "mlp_t.down_proj.weight": "mix.proj.weight",
    }
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        value = value.float()
        if key == "embed_tokens.embedding_weight":
            out["embed.weight"] = value
        elif key == "embed_pos.embedding_weight":
            out["pos_embed.weight"] = value
        elif key == "lm_head.weight":
            out["lm_head.weight"] = value
        elif key in ("q_head.weight", "q_head.bias"):
            part = key.rsplit(".", 1)[1]
            out[f"halt_head.proj.{part}"] = value[0:1]
            out[f"halt_head.continue_proj.{part}"] = value[1:2]
        elif key == "puzzle_emb.weights":
            out["puzzle_embed.weight"] = value
        elif key in ("H_init", "L_init"):
            out[inits[key == "L_init"]] = value
        else:
            match = re.fullmatch(r"(L_level|H_level)\.layers\.(\d+)\.(.+)", key)
            if not match or match.group(1) not in stacks or match.group(3) not in layer:
                raise UsageError(
                    f"the checkpoint holds {key!r}, which an official {kind.upper()} does not have"
                )
            stack, index, part = match.groups()
            out[f"{stacks[stack]}.layers.{index}.{layer[part]}"] = value
    return out


def official_state_dict(model: Reasoner) -> dict[str, torch.Tensor]:
    """The state dict the official code's ``ACTLossHead`` of an official-layout latentloop TRM or HRM holds
    (``model.inner.`` keys, as ``pretrain.py`` saves it without compiling): the inverse of
    :func:`convert_state_dict`. The value head, which the official models lack, is left out."""
    c = model.config
    official_layout = (
        c.pos_encoding in OFFICIAL_POS_ENCODINGS and not c.norm_weight and c.rope_layout == "halves"
    )
    if model.arch not in KINDS or not official_layout or c.mixer == "mlp":
        raise UsageError(
            "only a trm or hrm with the official layout (model.norm_weight false, model.rope_layout halves, "
            f"mixer attention or mlp-t, pos_encoding {', '.join(OFFICIAL_POS_ENCODINGS)}) has an official state dict"
        )
    stacks = {"net": "L_level", "L": "L_level", "H": "H_level"}
    layer = {
        "attn.Wqkv.weight": "self_attn.qkv_proj.weight",
        "attn.proj.weight": "self_attn.o_proj.weight",
        "mlp.fc.weight": "mlp.gate_up_proj.weight",
        "mlp.proj.weight": "mlp.down_proj.weight",
        "mix.fc.weight": "mlp_t.gate_up_proj.weight",
        "mix.proj.weight": "mlp_t.down_proj.weight",
    }
    inits = {"y_init": "H_init", "z_init": "L_init", "z_H_init": "H_init", "z_L_init": "L_init"}
    mine = model.state_dict()
    official = {
        "embed_tokens.embedding_weight": mine["embed.weight"],
        "lm_head.weight": mine["lm_head.weight"],
        "q_head.weight": torch.cat([mine["halt_head.proj.weight"], mine["halt_head.continue_proj.weight"]]),
        "q_head.bias": torch.cat([mine["halt_head.proj.bias"], mine["halt_head.continue_proj.bias"]]),
    }
    if c.puzzles:
        official["puzzle_emb.weights"] = mine["puzzle_embed.weight"]
    if "pos_embed.weight" in mine:
        official["embed_pos.embedding_weight"] = mine["pos_embed.weight"]
    for key, value in mine.items():
        if key in inits:
            official[inits[key]] = value
        match = re.fullmatch(r"(net|L|H)\.layers\.(\d+)\.(.+)", key)
        if match:
            stack, index, part = match.groups()
            official[f"{stacks[stack]}.layers.{index}.{layer[part]}"] = value
    return {f"model.inner.{k}": v.detach().clone() for k, v in official.items()}


def official_reasoner(
    kind: str,
    checkpoint: str | Path | dict[str, torch.Tensor],
    arch: str | Path | dict[str, Any],
    seq_len: int | None = None,
) -> Reasoner:
    """The latentloop reasoner that computes what the official ``kind`` model (trm or hrm) of ``checkpoint``
    (a file saved by ``pretrain.py``, or its loaded state dict) computes.

    ``arch`` is the official architecture (a path to ``all_config.yaml`` or an architecture yaml, or the
    mapping itself); ``seq_len`` is needed for attention models, whose weights do not hold it. Every
    official tensor must find its place and fit its shape; one that does not is a one-line error."""
    state = (
        strip_prefixes(checkpoint) if isinstance(checkpoint, dict) else load_official_state_dict(checkpoint)
    )
    arch = read_official_config(arch) if not isinstance(arch, dict) else arch
    config = reasoner_config(kind, arch, state, seq_len)
    with torch.random.fork_rng(devices=[]):  # the value head's initial weights, the same for every conversion
        torch.manual_seed(0)
        model = build_reasoner(kind, config)
    mine = model.state_dict()
    converted = convert_state_dict(kind, state, config)
    for key, value in converted.items():
        if key not in mine:
            raise UsageError(f"the official tensor for {key!r} has no place in latentloop's {kind.upper()}")
        if tuple(value.shape) != tuple(mine[key].shape):
            raise UsageError(
                f"official tensor for {key!r} has shape {tuple(value.shape)}, the configuration gives "
                f"{tuple(mine[key].shape)} (check the architecture yaml and --seq-len)"
            )
    missing = sorted(k for k in mine if k not in converted and not k.startswith("value_head."))
    if missing:
        raise UsageError(
            f"the official checkpoint lacks {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}"
        )
    model.load_state_dict({**mine, **converted})
    return model.eval()


def official_train_settings(config: dict[str, Any]) -> dict[str, Any]:
    """latentloop ``train`` settings that follow an official ``all_config.yaml`` (those it states) and the
    official training recipe: stable-max loss, halting slots with exploration, Q loss weight 0.5."""
    arch = config.get("arch", {}) if isinstance(config.get("arch"), dict) else {}
    loss = arch.get("loss", {}) if isinstance(arch.get("loss"), dict) else {}
    settings: dict[str, Any] = {
        "stablemax": loss.get("loss_type", "stablemax_cross_entropy") == "stablemax_cross_entropy",
        "replace_halted": True,
        "halt_weight": 0.5,
        "value_weight": 0.0,
    }
    if "halt_exploration_prob" in arch:
        settings["halt_exploration"] = float(arch["halt_exploration_prob"])
    for official, ours in (
        ("lr", "lr"),
        ("weight_decay", "weight_decay"),
        ("global_batch_size", "batch_size"),
        ("lr_warmup_steps", "warmup_steps"),
        ("ema_rate", "ema"),
    ):
        if official in config:
            settings[ours] = config[official]
    if "beta1" in config and "beta2" in config:
        settings["betas"] = [float(config["beta1"]), float(config["beta2"])]
    if "lr_min_ratio" in config:
        settings["min_lr_ratio"] = float(config["lr_min_ratio"])
    return settings


def act_step(
    model: Reasoner,
    carry: dict[str, torch.Tensor],
    batch: dict[str, torch.Tensor],
    labels: torch.Tensor,
    last: bool | torch.Tensor,
    stablemax: bool = True,
) -> tuple[dict[str, torch.Tensor], Any, torch.Tensor]:
    """One supervision step and its loss as the official ACT loss head computes it, divided by the batch
    size: cross-entropy (stable-max by default) plus half the halting BCE, and under Q-learning halting half
    the BCE of ``q_continue`` against the next step's bootstrapped target (``last``: which samples take their
    final step). Returns ``(carry, output, loss)``."""
    tc = ReasonerTrainConfig(stablemax=stablemax, halt_weight=0.5, value_weight=0.0)
    carry, out = model(carry, batch, target=labels)
    target = None
    if model.config.halting == "q-learning":
        target = next_step_continue_target(model, carry, batch, labels, last)
    return carry, out, supervision_loss(out, labels, 0.0, tc, target)[0]


def act_rollout(
    model: Reasoner,
    batch: dict[str, torch.Tensor],
    labels: torch.Tensor,
    steps: int,
    stablemax: bool = True,
    reference: Sequence[dict[str, torch.Tensor]] | None = None,
) -> list[dict[str, torch.Tensor]]:
    """``steps`` supervision steps of the official ACT training loop on one fixed ``batch``, without updates:
    a sample that halted restarts from the initial carry at the next step (the official loop then loads the
    next puzzle into its slot; here the batch stays the same), a sample halts when its Q-head says so or after
    ``n_sup`` steps, and exploration is off so the run is deterministic.

    Each step's record holds the logits, ``q_halt``, ``q_continue``, the carry, which samples halted, and the
    loss of :func:`act_step`. Labels ``IGNORE_LABEL`` are not scored, as in the official code.

    With ``reference`` (another run's records, in these keys) every step starts from the reference's carry and
    halting after the step before instead of its own, so each step is compared from the same state: over a
    rollout the recursion amplifies rounding (by up to 10x a step), and two implementations that agree to 1e-6
    on one step drift apart on a machine whose kernels round differently."""

    size = len(labels)
    halted = torch.ones(size, dtype=torch.bool)
    count = torch.zeros(size, dtype=torch.long)
    carry = model.initial_carry(batch)
    records = []
    for step in range(steps):
        if reference is not None and step > 0:
            before = reference[step - 1]
            carry = {k: before[f"carry.{k}"] for k in carry}
            halted = before["halted"]
        initial = model.initial_carry(batch)
        carry = {k: torch.where(halted.view(-1, 1, 1), initial[k], v) for k, v in carry.items()}
        count = torch.where(halted, 0, count) + 1
        last = count >= model.config.n_sup
        carry, out, loss = act_step(model, carry, batch, labels, last, stablemax)
        halted = last | halt_decision(out.halt_logit, out.continue_logit, model.config.halting).detach()
        records.append(
            {
                "logits": out.logits.detach(),
                "q_halt": out.halt_logit.detach(),
                "q_continue": out.continue_logit.detach(),
                "halted": halted.clone(),
                "loss": loss.detach(),
                **{f"carry.{k}": v.detach() for k, v in carry.items()},
            }
        )
    return records


def convert_run(
    kind: str,
    checkpoint: str | Path,
    config: str | Path,
    out: str | Path,
    task: str | None = None,
    seq_len: int | None = None,
    overrides: Sequence[str] = (),
) -> Path:
    """Convert an official ``kind`` checkpoint (trm or hrm) with its configuration ``config``
    (``all_config.yaml`` or an architecture yaml) into ``out``.

    With ``task`` (a task spec such as ``sudoku`` or ``sudoku:data=DIR``) ``out`` becomes a latentloop run
    folder: the converted weights in ``out/imported``, a run config whose ``train.init_from`` names them (its
    training settings follow the official run's where it states them), the task's data, and a step-0
    checkpoint, so ``eval``, ``solve --model`` and ``train`` (to continue training) take it as any run.
    Without a task, ``out`` is a checkpoint folder (``config.json``, ``model.safetensors``). ``overrides``
    are ``key=value`` settings of the run config. Nothing is left behind when the conversion fails."""

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out} already exists and is not empty")
    stated = load_yaml(config)
    arch = read_official_config(config)
    model = official_reasoner(kind, checkpoint, arch, seq_len or _task_seq_len(task))
    created = not out.exists()
    try:
        if task is None:
            model.save_pretrained(out)
            return out
        imported = out / "imported"
        model.save_pretrained(imported)
        settings = official_train_settings(stated) | {"init_from": str(imported.resolve())}
        data = {"model": dataclasses.asdict(model.config), "train": settings}
        train(family(kind).build_config(data, list(overrides), task=task, arch=kind), out, stop_at=0)
        return out
    except BaseException:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        else:
            for child in out.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        raise


def _task_seq_len(task: str | None) -> int | None:
    """The sequence length of task spec ``task`` (None without one)."""
    if task is None:
        return None

    name, options = parse_task_spec(task)
    return int(get_task(name, **options).seq_len) or None
