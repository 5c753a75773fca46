"""The reasoner interface shared by every puzzle model (Direct, Looped, HRM, TRM, GRAM).

A reasoner maps an input grid ``x`` (token ids ``[B, L]``) to logits over the same positions. Its latent
state, the *carry* (a dict of tensors), persists across supervision steps::

    carry = model.initial_carry(batch)                  # the fixed initial state, broadcast to the batch
    carry, out = model(carry, batch, target=None | y)   # ONE supervision step: T transitions, gradient only
                                                        # through the last; out.logits [B, L, V],
                                                        # out.halt_logit [B], out.value [B], out.kl [B]

``batch`` is a dict with ``"inputs"`` (``[B, L]`` token ids) and, for a model with puzzle embeddings
(``config.puzzles > 0``, ARC), ``"puzzle_ids"`` (``[B]``): the puzzle's ``puzzle_tokens`` learned embeddings
are then prepended to the input, so the latent states have ``P + L`` positions and the decoder reads the last
``L``. The returned carry is detached, so the next step
never backpropagates into this one. Checkpoints are ``config.json`` (``model_type`` ``reasoner-<arch>``) plus
``model.safetensors``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from latentloop.errors import UsageError
from latentloop.models.reasoners.heads import HALTING, HaltHead, SequenceValueHead, ValueHead
from latentloop.nn import BLOCKS, AxialRotaryEmbedding, RMSNorm, RotaryEmbedding, SequenceMLPBlock

MIXERS = ("attention", "mlp")
Carry = dict[str, torch.Tensor]
# arch -> class of every reasoner defined so far: a subclass with an ``arch`` registers itself (see Reasoner).
REASONERS: dict[str, type[Reasoner]] = {}


@dataclass
class ReasonerConfig:
    """Sizes and recursion settings of a reasoner (fields a model does not use are ignored by it).

    ``cycles`` is T, the transitions per supervision step (TRM's T, HRM's H_cycles, GRAM's T, the Looped
    model's applications); ``inner`` is the low-level updates per transition (GRAM's K, TRM's n, HRM's
    L_cycles). ``vocab_size``/``seq_len`` 0 mean "take them from the task". ``beta`` and ``kl_balance`` are
    GRAM's (see :mod:`latentloop.models.reasoners.gram`).
    """

    vocab_size: int = 0
    seq_len: int = 0
    dim: int = 128
    n_heads: int = 4
    n_layers: int = 2
    hidden: int = 256
    block: str = "post-norm"
    mixer: str = "attention"
    n_sup: int = 16
    cycles: int = 3
    inner: int = 4
    beta: float = 0.07
    kl_balance: float = 0.8
    rope_base: float = 10_000.0
    # > 0: the input is a grid of this width read row by row, and attention uses axial 2-D RoPE over its rows
    # and columns (nn.rope.AxialRotaryEmbedding) instead of 1-D RoPE over the flat sequence
    rope_grid: int = 0
    norm_eps: float = 1e-5
    halting: str = "bce"  # how the Q-head is trained and read: bce | q-learning (see heads.py)
    puzzles: int = 0  # puzzle identifiers with learned embeddings (ARC: one per task and augmentation)
    puzzle_tokens: int = 1  # embedding positions prepended per puzzle (GRAM paper: 16)

    def __post_init__(self) -> None:
        if self.halting not in HALTING:
            raise UsageError(f"model.halting must be one of {', '.join(HALTING)}, got {self.halting!r}")
        if self.block not in BLOCKS:
            raise UsageError(f"model.block must be one of {', '.join(BLOCKS)}, got {self.block!r}")
        if self.mixer not in MIXERS:
            raise UsageError(f"model.mixer must be one of {', '.join(MIXERS)}, got {self.mixer!r}")
        for name in ("dim", "n_heads", "n_layers", "hidden", "n_sup", "cycles", "inner"):
            if getattr(self, name) < 1:
                raise UsageError(f"model.{name} must be at least 1, got {getattr(self, name)}")
        if self.puzzles < 0 or self.puzzle_tokens < 1:
            raise UsageError("model.puzzles must be at least 0 and model.puzzle_tokens at least 1")
        if self.dim % self.n_heads or (self.dim // self.n_heads) % 2:
            raise UsageError(f"model.dim {self.dim} must split into {self.n_heads} heads of even size")
        if self.rope_grid < 0 or (self.rope_grid and self.seq_len and self.seq_len % self.rope_grid):
            raise UsageError(
                f"model.rope_grid {self.rope_grid} must be 0 or a row width that divides seq_len"
            )
        if self.rope_grid and (self.puzzles or (self.dim // self.n_heads) % 4):
            raise UsageError("model.rope_grid needs no puzzle embeddings and a head size divisible by 4")
        if self.beta < 0 or not 0 <= self.kl_balance <= 1:
            raise UsageError("model.beta must be >= 0 and model.kl_balance in [0, 1]")

    @property
    def prefix_len(self) -> int:
        """Positions the puzzle embedding prepends to the input (0 without puzzle embeddings)."""
        return self.puzzle_tokens if self.puzzles else 0

    @property
    def positions(self) -> int:
        """Length of the latent states: the prefix and the input."""
        return self.seq_len + self.prefix_len


def rotary_embedding(config: ReasonerConfig, positions: int) -> RotaryEmbedding:
    """The rotary tables of ``positions`` positions: axial over rows of ``config.rope_grid`` cells when it is
    set, 1-D otherwise."""
    head_dim = config.dim // config.n_heads
    if config.rope_grid:
        return AxialRotaryEmbedding(head_dim, positions, config.rope_grid, config.rope_base)
    return RotaryEmbedding(head_dim, positions, config.rope_base)


@dataclass
class ReasonerOutput:
    """What one supervision step returns besides the carry."""

    logits: torch.Tensor  # [B, L, V]
    halt_logit: torch.Tensor  # [B]  q_halt: halt when sigmoid > 0.5 (bce halting)
    value: torch.Tensor  # [B]  predicted accuracy in (0, 1)
    kl: torch.Tensor  # [B]  KL(posterior || prior) of the step's last transition; 0 when deterministic
    # [B] or scalar: a task loss the model computes itself (AR's next-token CE, MDLM's weighted masked CE),
    # used by the trainer in place of the CE of ``logits``; None for the models trained on that CE.
    loss: torch.Tensor | None = None
    continue_logit: torch.Tensor | None = None  # [B]  q_continue (Q-learning halting: halt when q_halt > it)
    state: torch.Tensor | None = None  # [B, P + L, dim]  the latent the heads read


class ReasoningModule(nn.Module):
    """``f(state, injection)``: ``n_layers`` bidirectional blocks applied to ``state + injection``.

    Always ends in an RMSNorm (post-norm and sandwich blocks do by construction, pre-norm gets a final norm):
    GRAM needs a normalised state, or the KL between noise heads explodes.
    """

    def __init__(self, config: ReasonerConfig, n_layers: int | None = None) -> None:
        super().__init__()
        c = config
        layers = n_layers if n_layers is not None else c.n_layers
        if c.mixer == "mlp":
            self.layers = nn.ModuleList(
                SequenceMLPBlock(c.positions, c.dim, c.hidden, c.norm_eps) for _ in range(layers)
            )
        else:
            block = BLOCKS[c.block]
            self.layers = nn.ModuleList(block(c.dim, c.n_heads, c.hidden, c.norm_eps) for _ in range(layers))
        self.final_norm = RMSNorm(c.dim, c.norm_eps) if c.block == "pre-norm" and c.mixer != "mlp" else None

    def forward(
        self, state: torch.Tensor, injection: torch.Tensor | None, rope: torch.Tensor | None
    ) -> torch.Tensor:
        x = state if injection is None else state + injection
        for layer in self.layers:
            x = layer(x, rope, causal=False)
        return self.final_norm(x) if self.final_norm is not None else x


class Reasoner(nn.Module):
    """Base class: input embedding, rotary tables, decoder, halting and value heads, checkpoint I/O.

    Subclasses set ``arch`` (which registers them by that name), build their recursive modules, and implement :meth:`initial_carry` and
    :meth:`forward` (one supervision step). Their capabilities are declared, each False by default:
    ``stochastic`` (a step draws noise, so parallel samples differ and a value head can rank them: GRAM) and
    ``generative`` (the model decodes with its own sampler, ``sample(inputs, steps, temperature)`` returning
    ``(tokens [S, N, L], values [S, N])``, and is trained on its own loss: the AR and MDLM baselines).
    """

    arch: str = ""
    stochastic: bool = False
    generative: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass that names an ``arch`` joins :data:`REASONERS`, where training, evaluation, experiments
        and the command line find models by name."""
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("arch"):
            REASONERS[cls.arch] = cls

    def __init__(self, config: ReasonerConfig) -> None:
        super().__init__()
        if config.vocab_size < 1 or config.seq_len < 1:
            raise UsageError("model.vocab_size and model.seq_len must be set (they come from the task)")
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        nn.init.normal_(self.embed.weight, std=1.0 / math.sqrt(config.dim))
        # Which task (and augmentation) a grid comes from: ARC's rule is not in the test input alone. Starts
        # at zero (as in HRM/TRM), so an identifier seen in no training row is a blank prefix.
        self.puzzle_embed = (
            nn.Embedding(config.puzzles, config.puzzle_tokens * config.dim) if config.puzzles else None
        )
        if self.puzzle_embed is not None:
            nn.init.zeros_(self.puzzle_embed.weight)
        self.rope = rotary_embedding(config, config.positions)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.halt_head = HaltHead(config.dim)
        self.value_head = ValueHead(config.dim)

    # -- pieces the models share ----------------------------------------------------------------------------
    def embed_input(
        self, inputs: torch.Tensor, puzzle_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(e_x, rope)``: the input embedding (scaled to unit RMS like the normalised states), after the
        puzzle's embedding positions when the model has them, and the rotary tables of its positions."""
        e_x = self.embed(inputs.long()) * math.sqrt(self.config.dim)
        if self.puzzle_embed is not None:
            if puzzle_ids is None:
                raise UsageError(
                    "this model was trained with puzzle embeddings: give each input its puzzle id"
                )
            prefix = self.puzzle_embed(puzzle_ids.long()).view(len(inputs), self.config.puzzle_tokens, -1)
            e_x = torch.cat([prefix.to(e_x.dtype) * math.sqrt(self.config.dim), e_x], dim=1)
        return e_x, self.rope.tables(torch.arange(e_x.shape[1], device=inputs.device))

    def init_state(self, name: str) -> None:
        """A fixed initial latent ``[dim]`` sampled once (truncated normal) and stored as a buffer."""
        self.register_buffer(name, nn.init.trunc_normal_(torch.empty(self.config.dim), std=1.0, a=-2, b=2))

    def broadcast_state(self, name: str, inputs: torch.Tensor) -> torch.Tensor:
        """The stored initial latent ``name`` expanded to ``[B, P + L, dim]``."""
        batch, length = inputs.shape
        return getattr(self, name).expand(batch, self.config.prefix_len + length, -1).clone()

    def readout(self, state: torch.Tensor, kl: torch.Tensor | None = None) -> ReasonerOutput:
        """Logits (of the input's positions), halt logit (from the first position) and value from the state
        the decoder reads."""
        zeros = torch.zeros(state.shape[0], device=state.device)
        q_halt, q_continue = self.halt_head(state)
        return ReasonerOutput(
            logits=self.lm_head(state[:, self.config.prefix_len :]),
            halt_logit=q_halt,
            continue_logit=q_continue,
            value=self.value_head(state),
            kl=zeros if kl is None else kl,
            state=state,
        )

    # -- the interface -------------------------------------------------------------------------------------
    def initial_carry(self, batch: dict[str, torch.Tensor]) -> Carry:
        """The carry before the first supervision step."""
        raise NotImplementedError

    def forward(  # type: ignore[override]
        self, carry: Carry, batch: dict[str, torch.Tensor], target: torch.Tensor | None = None
    ) -> tuple[Carry, ReasonerOutput]:
        """One supervision step (see the module docstring)."""
        raise NotImplementedError

    # -- checkpoints ---------------------------------------------------------------------------------------
    @property
    def model_type(self) -> str:
        return f"reasoner-{self.arch}"

    def config_dict(self) -> dict[str, Any]:
        """``config.json`` of a checkpoint."""
        return {"model_type": self.model_type, "arch": self.arch, **dataclasses.asdict(self.config)}

    def save_pretrained(self, path: str | Path, weights: str = "model.safetensors") -> None:
        """Write ``config.json`` and the weights (``weights``) into folder ``path``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(self.config_dict(), indent=1) + "\n")
        save_file({k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}, path / weights)

    def load_weights(self, file: str | Path) -> None:
        """Load a safetensors file written by :meth:`save_pretrained` (one-line error when damaged)."""
        try:
            self.load_state_dict(load_file(str(file)))
        except FileNotFoundError:
            raise UsageError(f"checkpoint weights {file} are missing") from None
        except Exception as error:  # safetensors and load_state_dict raise several types
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise UsageError(f"checkpoint weights {file} do not load: {reason}") from None

    def load_fitted_value_head(self, file: str | Path) -> None:
        """Replace the trained value head by a :class:`SequenceValueHead` fitted to this model's samples
        (``value_head.safetensors``, see :mod:`latentloop.train.value`)."""
        c = self.config
        head = SequenceValueHead(c.positions, c.dim, c.hidden, c.norm_eps)
        try:
            head.load_state_dict(load_file(str(file)))
        except Exception as error:  # safetensors and load_state_dict raise several types
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise UsageError(f"fitted value head {file} does not load: {reason}") from None
        self.value_head = head.to(self.lm_head.weight.device)


def num_parameters(model: nn.Module) -> int:
    """Trainable parameters (buffers such as the fixed initial state excluded)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
