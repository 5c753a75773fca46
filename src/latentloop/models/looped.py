"""What a looped language model declares about its loop, so that one set of test-time tools serves every one.

A looped LM applies a block of shared layers ``r`` times per token. Generation
(:func:`latentloop.models.generation.generate`), the exit criteria, the KV cache and the harness drive any model
through the same few methods::

    ctx = model.context(length, attention_mask, cache=cache)   # positions, mask and cache of new tokens
    e   = model.embed(input_ids, ctx)                          # what the loop reads: embedding (+ prelude)
    s_0 = model.initialize_state(e, init_scale)                # the loop's first state
    s_i = model.core_step(s_{i-1}, e, ctx, i - 1)               # one pass through the shared layers
    x   = model.head_input(s_r, ctx)                           # what the output layer reads (coda, norm)
    p   = model.predict(s_r, ctx)                              # fp32 logits: model.lm_head(x)

and the config names ``n_heads``, ``head_dim``, ``n_layers_in_recurrent_block``, ``mean_recurrence``,
``block_size`` and ``vocab_size``. Where two models' loops differ, each says so in its :class:`LoopSpec`
(``model.loop``), and tools that depend on the difference read the spec, never the model's name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoopSpec:
    """The shape of a model's loop.

    - ``prelude`` / ``coda``: layers run once before / after the loop.
    - ``input_injection``: every step reads the token's embedding again (Huginn's adapter on ``[s, e]``);
      without it, the embedding enters only through the initial state.
    - ``random_initial_state``: the loop starts from noise (scaled by ``init_scale``) rather than from the
      embedding, so K trajectories of one prompt differ (width in latent space).
    - ``exit_gate``: a learned gate gives each step an exit probability (``model.exit_lambda(state)``).
    """

    prelude: bool
    coda: bool
    input_injection: bool
    random_initial_state: bool
    exit_gate: bool
