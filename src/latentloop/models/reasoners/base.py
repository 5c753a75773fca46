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
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from latentloop.errors import UsageError
from latentloop.hub import PushToHub, reasoner_model_card, write_model_card
from latentloop.io import atomic_path, atomic_write_text, writing_to
from latentloop.models.reasoners.heads import HALTING, HaltHead, SequenceValueHead, ValueHead
from latentloop.nn import BLOCKS, AxialRotaryEmbedding, RMSNorm, RotaryEmbedding, SequenceMLPBlock

MIXERS = ("attention", "mlp", "mlp-t")
ROPE_LAYOUTS = ("pairs", "halves")
POS_ENCODINGS = ("rope", "learned", "rope+learned", "none")
INITS = ("default", "lecun")
GUIDANCE = ("posterior", "prior", "none")
GUIDED_TRANSITIONS = ("all", "last")
TARGET_SCALES = ("input", "unscaled")
GRAM_STATES = ("posterior", "prior")
KL_REDUCTIONS = ("sum", "mean")
NOISE_HEADS = ("linear", "swiglu")
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

    The official TinyRecursiveModels/HRM architectures (see :mod:`latentloop.convert`) set ``norm_weight``
    false (weight-free RMSNorm), ``expansion`` (the MLP width ``hidden`` becomes ``expansion * dim * 2/3``
    rounded up to a multiple of 256), ``mixer="mlp-t"`` (TRM's ``mlp_t``: a sequence MLP of that rounded width
    whose residual is normalised over the sequence axis), ``rope_layout="halves"`` (rotary pairs ``i`` and
    ``i + head_dim / 2``), ``puzzle_dim`` (a puzzle embedding narrower than its
    ``puzzle_tokens`` positions, zero-padded), ``h_layers`` (HRM's H stack deeper or shallower than its L
    stack) and ``init="lecun"`` (truncated LeCun-normal weights, see :func:`lecun_init`).
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
    # GRAM's noise: posterior (the paper's model), prior (no posterior and no KL: the paper's ablation "without
    # stochastic guidance") or none (fixed N(0, 0.1²) noise, no noise heads: "stochasticity only"); gram.py
    guidance: str = "posterior"
    # GRAM's training transitions that draw from the posterior: all T of a step, or only the last, the one
    # whose KL the loss charges (the first T - 1 then draw from the prior, as at inference); gram.py
    guided_transitions: str = "all"
    # > 0: GRAM's posterior sees each target cell from a random one of the first target_reveal supervision
    # steps on (drawn once per sample), so the target enters the state a few cells a step; gram.py
    target_reveal: int = 0
    # > 0: this share of GRAM's training samples draw their noise from the prior for their whole trajectory, as
    # at inference, and are charged no KL (a CVAE's and a GSNN's objective mixed, Sohn et al. 2015); gram.py
    prior_share: float = 0.0
    # GRAM's target embedding: scaled by sqrt(dim) as the input's is (input), so the posterior sees y as loudly
    # as u; or unscaled, RMS 1/sqrt(dim), the reading of runs trained before this option; gram.py
    target_scale: str = "input"
    # Training GRAM where inference runs it (gram.py, "Training the prior where it is used"). carry: the state a
    # training trajectory carries to its next supervision step, the posterior's sample (the paper) or the
    # prior's, as at inference. heads: the state the halt and value heads read, the posterior's (the paper) or
    # the prior's, detached, judged by the task's verifier. prior_ce: the weight of the cross-entropy of the
    # prior's decode beside the posterior's.
    carry: str = "posterior"
    heads: str = "posterior"
    prior_ce: float = 0.0
    # GRAM's KL summed over the latent's positions (the paper's reading) or averaged over them; gram.py
    kl_reduce: str = "sum"
    # GRAM's noise heads: one linear layer (σ unbounded above), or Table 4's SwiGLU MLP per parameter with
    # σ in (0, 1]; gram.py
    noise_head: str = "linear"
    rope_base: float = 10_000.0
    # > 0: the input is a grid of this width read row by row, and attention uses axial 2-D RoPE over its rows
    # and columns (nn.rope.AxialRotaryEmbedding) instead of 1-D RoPE over the flat sequence
    rope_grid: int = 0
    rope_layout: str = "pairs"  # which dimensions rotate together: adjacent pairs | halves (HRM/TRM code)
    # how attention knows positions: rotary tables (rope), a learned embedding per position added to the
    # input (learned, HRM/TRM's pos_encodings="learned"), both, or none (TRM's pos_encodings="none": its mlp-t
    # mixer reads each position through its own weights; attention then sees a set)
    pos_encoding: str = "rope"
    norm_eps: float = 1e-5
    halting: str = "bce"  # how the Q-head is trained and read: bce | q-learning (see heads.py)
    puzzles: int = 0  # puzzle identifiers with learned embeddings (ARC: one per task and augmentation)
    puzzle_tokens: int = 1  # embedding positions prepended per puzzle (GRAM paper: 16)
    puzzle_dim: int = 0  # width of a puzzle's learned embedding; 0 = puzzle_tokens * dim (the rest is zeros)
    norm_weight: bool = True  # False: RMSNorm without a learned scale
    expansion: float = 0.0  # > 0: hidden = expansion * dim * 2/3 rounded up to a multiple of 256
    h_layers: int = 0  # HRM's high-level module: its blocks (0 = n_layers)
    init: str = "default"  # default | lecun (truncated LeCun-normal weights)

    def __post_init__(self) -> None:
        if self.expansion < 0:
            raise UsageError(f"model.expansion must be >= 0, got {self.expansion}")
        if self.expansion:
            self.hidden = swiglu_width(self.expansion, self.dim)
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise UsageError(
                    f"model.{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}"
                )
        if self.rope_layout == "halves" and self.rope_grid:
            raise UsageError("model.rope_grid needs model.rope_layout=pairs")
        if self.h_layers < 0:
            raise UsageError(f"model.h_layers must be at least 0, got {self.h_layers}")
        if not 0 <= self.puzzle_dim <= self.puzzle_tokens * self.dim:
            raise UsageError(
                f"model.puzzle_dim must be in [0, puzzle_tokens * dim = {self.puzzle_tokens * self.dim}], "
                f"got {self.puzzle_dim}"
            )
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
        if self.target_reveal < 0:
            raise UsageError(f"model.target_reveal must be at least 0, got {self.target_reveal}")
        if not 0 <= self.prior_share < 1:
            raise UsageError(f"model.prior_share must be in [0, 1), got {self.prior_share}")
        if self.prior_share and self.guidance != "posterior":
            raise UsageError("model.prior_share needs a posterior to share with (model.guidance posterior)")
        if self.prior_ce < 0:
            raise UsageError(f"model.prior_ce must be at least 0, got {self.prior_ce}")
        if self.guidance != "posterior" and self.trains_prior_path:
            raise UsageError(
                "model.carry, model.heads and model.prior_ce need GRAM's posterior (model.guidance posterior)"
            )

    @property
    def trains_prior_path(self) -> bool:
        """Whether GRAM's training also follows its prior's sample (``carry``, ``heads`` or ``prior_ce``)."""
        return (self.carry, self.heads, self.prior_ce) != ("posterior", "posterior", 0)

    @property
    def prefix_len(self) -> int:
        """Positions the puzzle embedding prepends to the input (0 without puzzle embeddings)."""
        return self.puzzle_tokens if self.puzzles else 0

    @property
    def positions(self) -> int:
        """Length of the latent states: the prefix and the input."""
        return self.seq_len + self.prefix_len

    @property
    def puzzle_width(self) -> int:
        """Width of one puzzle's learned embedding (before its zero padding to ``puzzle_tokens * dim``)."""
        return self.puzzle_dim or self.puzzle_tokens * self.dim


# The settings of ReasonerConfig that take one of a few names, with those names.
_CHOICES = {
    "rope_layout": ROPE_LAYOUTS,
    "pos_encoding": POS_ENCODINGS,
    "init": INITS,
    "halting": HALTING,
    "block": BLOCKS,
    "mixer": MIXERS,
    "guidance": GUIDANCE,
    "guided_transitions": GUIDED_TRANSITIONS,
    "target_scale": TARGET_SCALES,
    "carry": GRAM_STATES,
    "heads": GRAM_STATES,
    "kl_reduce": KL_REDUCTIONS,
    "noise_head": NOISE_HEADS,
}


def swiglu_width(expansion: float, width: int) -> int:
    """The official HRM/TRM SwiGLU width: ``round(expansion * width * 2/3)`` rounded up to a multiple of 256."""
    return -(round(expansion * width * 2 / 3) // -256) * 256


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
    state: torch.Tensor | None = None  # [B, P + L, dim]  the latent the decoder reads
    # GRAM in training: the decode of the prior's sample of the same step, beside the posterior's ``logits``
    prior_logits: torch.Tensor | None = None


class ReasoningModule(nn.Module):
    """``f(state, injection)``: ``n_layers`` bidirectional blocks applied to ``state + injection``.

    Always ends in an RMSNorm (post-norm and sandwich blocks do by construction, pre-norm gets a final norm):
    GRAM needs a normalised state, or the KL between noise heads explodes.
    """

    def __init__(self, config: ReasonerConfig, n_layers: int | None = None) -> None:
        super().__init__()
        c = config
        layers = n_layers if n_layers is not None else c.n_layers
        if c.mixer == "attention":
            block = BLOCKS[c.block]
            self.layers = nn.ModuleList(
                block(
                    c.dim,
                    c.n_heads,
                    c.hidden,
                    c.norm_eps,
                    norm_weight=c.norm_weight,
                    rope_halves=c.rope_layout == "halves",
                )
                for _ in range(layers)
            )
        else:
            official = c.mixer == "mlp-t"
            mix_hidden = swiglu_width(c.expansion or 4.0, c.positions) if official else 0
            self.layers = nn.ModuleList(
                SequenceMLPBlock(
                    c.positions, c.dim, c.hidden, c.norm_eps, mix_hidden, official, c.norm_weight
                )
                for _ in range(layers)
            )
        pre_norm = c.block == "pre-norm" and c.mixer == "attention"
        self.final_norm = RMSNorm(c.dim, c.norm_eps, c.norm_weight) if pre_norm else None

    def forward(
        self, state: torch.Tensor, injection: torch.Tensor | None, rope: torch.Tensor | None
    ) -> torch.Tensor:
        x = state if injection is None else state + injection
        for layer in self.layers:
            x = layer(x, rope, causal=False)
        return self.final_norm(x) if self.final_norm is not None else x


class Reasoner(PushToHub, nn.Module):
    """Base class: input embedding, rotary tables, decoder, halting and value heads, checkpoint I/O.

    Subclasses set ``arch`` (which registers them by that name), build their recursive modules, and implement :meth:`initial_carry` and
    :meth:`forward` (one supervision step). Their capabilities are declared, each False by default:
    ``stochastic`` (a step draws noise, so parallel samples differ and a value head can rank them: GRAM) and
    ``generative`` (the model decodes with its own sampler, ``sample(inputs, steps, temperature)`` returning
    ``(tokens [S, N, L], values [S, N])``, and is trained on its own loss: the AR and MDLM baselines), and
    :meth:`posterior_in` (a step given the target draws its noise from a posterior that sees it, and from a
    prior without it: GRAM, whose prior's gap to its posterior is then measured).
    """

    arch: str = ""
    stochastic: bool = False
    generative: bool = False

    @classmethod
    def posterior_in(cls, config: ReasonerConfig) -> bool:
        """Whether a model of this class built from ``config`` has a posterior (GRAM's target-guided noise)."""
        return False

    @property
    def has_posterior(self) -> bool:
        """Whether this model has a posterior (see :meth:`posterior_in`)."""
        return self.posterior_in(self.config)

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
        self.puzzle_embed = nn.Embedding(config.puzzles, config.puzzle_width) if config.puzzles else None
        if self.puzzle_embed is not None:
            nn.init.zeros_(self.puzzle_embed.weight)
        self.rope = rotary_embedding(config, config.positions)
        self.pos_embed = None
        if "learned" in config.pos_encoding:
            self.pos_embed = nn.Embedding(config.positions, config.dim)
            nn.init.normal_(self.pos_embed.weight, std=1.0 / math.sqrt(config.dim))
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.halt_head = HaltHead(config.dim)
        self.value_head = ValueHead(config.dim)

    # -- pieces the models share ----------------------------------------------------------------------------
    def embed_input(
        self, inputs: torch.Tensor, puzzle_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(e_x, rope)``: the input embedding (scaled to unit RMS like the normalised states), after the
        puzzle's embedding positions when the model has them, and the rotary tables of its positions (None
        without rope in ``pos_encoding``). A learned position embedding is added to the input's and the sum
        scaled by ``1/sqrt(2)``, which keeps it at unit RMS (as HRM's code does)."""
        # Scaled once at the end, after the positions are added, in the official HRM/TRM order: a converted
        # checkpoint then rounds as the official code does.
        e_x = self.embed(inputs.long())
        if self.puzzle_embed is not None:
            if puzzle_ids is None:
                raise UsageError(
                    "this model was trained with puzzle embeddings: give each input its puzzle id"
                )
            prefix = self.puzzle_embed(puzzle_ids.long())
            padding = self.config.puzzle_tokens * self.config.dim - prefix.shape[-1]
            prefix = F.pad(prefix, (0, padding)).view(len(inputs), self.config.puzzle_tokens, -1)
            e_x = torch.cat([prefix.to(e_x.dtype), e_x], dim=1)
        if self.pos_embed is not None:
            e_x = (e_x + self.pos_embed.weight.to(e_x.dtype)) * math.sqrt(0.5)
        e_x = e_x * math.sqrt(self.config.dim)
        if "rope" not in self.config.pos_encoding:
            return e_x, None
        return e_x, self.rope.tables(torch.arange(e_x.shape[1], device=inputs.device))

    def init_state(self, name: str) -> None:
        """A fixed initial latent ``[dim]`` sampled once (truncated normal) and stored as a buffer."""
        self.register_buffer(name, nn.init.trunc_normal_(torch.empty(self.config.dim), std=1.0, a=-2, b=2))

    def broadcast_state(self, name: str, inputs: torch.Tensor) -> torch.Tensor:
        """The stored initial latent ``name`` expanded to ``[B, P + L, dim]``."""
        batch, length = inputs.shape
        return getattr(self, name).expand(batch, self.config.prefix_len + length, -1).clone()

    def readout(
        self, state: torch.Tensor, kl: torch.Tensor | None = None, head_state: torch.Tensor | None = None
    ) -> ReasonerOutput:
        """Logits (of the input's positions) from the state the decoder reads; halt logit (from the first
        position) and value from ``head_state``, by default that same state."""
        zeros = torch.zeros(state.shape[0], device=state.device)
        head_state = state if head_state is None else head_state
        q_halt, q_continue = self.halt_head(head_state)
        return ReasonerOutput(
            logits=self.logits_of(state),
            halt_logit=q_halt,
            continue_logit=q_continue,
            value=self.value_head(head_state),
            kl=zeros if kl is None else kl,
            state=state,
        )

    def logits_of(self, state: torch.Tensor) -> torch.Tensor:
        """The logits ``[B, L, V]`` of the input's positions."""
        return self.lm_head(state[:, self.config.prefix_len :])

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
        """Write ``config.json`` and the weights (``weights``) into folder ``path``, each file atomically; with
        the default weights also a Hub model card ``README.md``, so the folder is ready for ``push_to_hub``."""
        path = Path(path)
        with writing_to(path):
            path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path / "config.json", json.dumps(self.config_dict(), indent=1) + "\n")
        with atomic_path(path / weights) as temp:
            save_file({k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}, temp)
        if weights == "model.safetensors":  # other weights (the trainer's raw ones) sit beside these
            write_model_card(path, self.model_card())

    def model_card(self, repo_id: str | None = None) -> str:
        """The ``README.md`` that :meth:`save_pretrained` writes (its usage names ``repo_id``)."""
        # Every parameter, frozen or not: an EMA copy is saved with gradients switched off.
        parameters = sum(p.numel() for p in self.parameters())
        return reasoner_model_card(self.arch, self.config, parameters, repo_id)

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


def truncated_normal_(tensor: torch.Tensor, std: float) -> torch.Tensor:
    """Fill ``tensor`` from a normal truncated to two standard deviations whose *actual* standard deviation is
    ``std`` (the scale is corrected for the truncation, as JAX's initialisers and the official HRM/TRM code
    do; ``nn.init.trunc_normal_`` alone gives a narrower spread)."""
    if std == 0:
        return nn.init.zeros_(tensor)
    # Variance of a standard normal truncated to [-2, 2]: 1 - 2 * 2 * pdf(2) / mass.
    mass = math.erf(2 / math.sqrt(2))
    pdf = math.exp(-2) / math.sqrt(2 * math.pi)
    scale = std / math.sqrt(1 - 4 * pdf / mass)
    return nn.init.trunc_normal_(tensor, std=scale, a=-2 * scale, b=2 * scale)


@torch.no_grad()
def lecun_init(model: Reasoner) -> None:
    """``model.init="lecun"``: every linear weight truncated-normal with std ``1/sqrt(fan_in)`` and zero biases,
    the token and learned position embeddings with std ``1/sqrt(dim)``, as in the official HRM/TRM. The Q-head
    keeps its start (zero weights, bias -5) and the puzzle embeddings stay zero."""
    for name, module in model.named_modules():
        if name.startswith("halt_head"):
            continue
        if isinstance(module, nn.Linear):
            truncated_normal_(module.weight, 1 / math.sqrt(module.in_features))
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    truncated_normal_(model.embed.weight, 1 / math.sqrt(model.config.dim))
    if model.pos_embed is not None:
        truncated_normal_(model.pos_embed.weight, 1 / math.sqrt(model.config.dim))


def num_parameters(model: nn.Module) -> int:
    """Trainable parameters (buffers such as the fixed initial state excluded)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
