"""lm-evaluation-harness for the recurrent-depth LM: a model class for lm-eval and a sweep over depths.

:class:`LatentloopLM` implements lm-eval's ``LM`` interface around
:class:`~latentloop.models.recurrent_depth.RecurrentDepthLM`, and is registered as ``latentloop``, so once
this module is imported ``simple_evaluate(model="latentloop", model_args={"pretrained": PATH, "num_steps": 8})``
works like any of lm-eval's own models. :func:`depth_sweep` runs ``simple_evaluate`` once per depth;
``latentloop harness`` prints its table.

- ``loglikelihood`` and ``loglikelihood_rolling`` come from latentloop's own forward pass at ``num_steps``
  core iterations (fp32 on the CPU by default), in left-padded batches: the attention mask hides the padding
  and positions count only real tokens, so each row scores as it would alone.
- ``generate_until`` calls :func:`latentloop.models.generation.generate` (greedy unless a task asks for
  sampling) with the same depth plus the exit criterion and ``kv_share``, which only decoding uses.
- The initial latent state defaults to zeros (``init_scale=0``), so scores are deterministic and do not
  depend on how requests are batched; ``init_scale=1`` draws it at random as in training.

lm-eval is an optional dependency (``pip install latentloop[eval]``); importing this module needs it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval import simple_evaluate
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.tasks import TaskManager, get_task_dict
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from latentloop.data.tokenizers import Tokenizer, load_tokenizer
from latentloop.errors import UsageError
from latentloop.hub import resolve_model
from latentloop.infer.runs import lm_tokenizer
from latentloop.models import generation
from latentloop.models.generation import ExitCriterion, quantized_copy
from latentloop.models.looped_lms import load_looped_lm
from latentloop.models.ouro import OuroLM
from latentloop.models.recurrent_depth import RecurrentDepthLM
from latentloop.train.checkpoint import resolve_checkpoint

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# generation_kwargs a task may set, besides the stop strings and the length
_SAMPLING_KEYS = ("do_sample", "temperature", "top_k", "top_p")
_LENGTH_KEYS = ("max_gen_toks", "max_new_tokens")


def _positive_int(name: str, value: Any, allow_none: bool = False) -> int | None:
    """``value`` as an int >= 1 (lm-eval passes model_args as strings or numbers); one-line error otherwise."""
    if value is None and allow_none:
        return None
    try:
        number = int(value)
        if isinstance(value, bool) or float(value) != number:
            raise ValueError
    except (TypeError, ValueError):
        raise UsageError(f"{name} must be a whole number, got {value!r}") from None
    if number < 1:
        raise UsageError(f"{name} must be at least 1, got {number}")
    return number


@register_model("latentloop")
class LatentloopLM(LM):
    """lm-eval's ``LM`` interface for a recurrent-depth checkpoint.

    ``pretrained``: a checkpoint folder, a run folder (its newest checkpoint), a Hub id of either (at ``revision``),
    or a model object. ``tokenizer``: a ``tokenizer.json`` (default: the checkpoint's own, else its run's, else
    latentloop's byte tokenizer). ``num_steps``: core iterations (default: the config's mean). ``exit`` (e.g.
    ``"kl:5e-4"``) and ``kv_share`` are passed on to generation. ``init_scale``: the initial latent state's scale
    (0, the default: zeros). ``max_length`` (default ``block_size``) bounds a scored window; ``prefix_token_id``
    (default ``<eos>``, the document separator latentloop trains with) conditions a text's first token.
    ``max_gen_toks`` is the generation length when a task sets none; ``seed`` seeds sampling, for tasks that ask for
    it. ``device`` and ``dtype`` (``float32``, ``bfloat16``, ``float16``) say where and how the weights are loaded,
    ``weights`` (``int8``) in which format the linear and embedding weights are kept; log-probabilities are fp32
    always.
    """

    def __init__(
        self,
        pretrained: str | Path | RecurrentDepthLM | OuroLM,
        revision: str | None = None,
        tokenizer: str | Path | Tokenizer | None = None,
        num_steps: int | None = None,
        exit: str | None = None,
        kv_share: int | None = None,
        init_scale: float = 0.0,
        batch_size: int | str = 8,
        max_length: int | None = None,
        max_gen_toks: int = 256,
        prefix_token_id: int | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        weights: str | None = None,
        seed: int = 0,
        **unknown: Any,
    ) -> None:
        super().__init__()
        unknown.pop("max_batch_size", None)  # lm-eval passes it to every model; batches here have one size
        if unknown:
            raise UsageError(f"unknown latentloop model argument(s): {', '.join(sorted(unknown))}")
        if dtype not in _DTYPES:
            raise UsageError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
        self.checkpoint = None if isinstance(pretrained, (RecurrentDepthLM, OuroLM)) else str(pretrained)
        folder = None
        if isinstance(pretrained, (RecurrentDepthLM, OuroLM)):
            if revision is not None:
                raise UsageError("revision applies only to a Hub model id")
            model = pretrained if weights is None else quantized_copy(pretrained, weights)
        else:
            target = _device(device)
            folder = _checkpoint_folder(pretrained, revision)
            model = load_looped_lm(folder, dtype=_DTYPES[dtype], device=target, weights=weights)
        self.model = model.eval()
        self._device = self.model.embedding.weight.device
        self.weights = weights
        if isinstance(tokenizer, Tokenizer):
            self.tokenizer = tokenizer
        else:
            self.tokenizer = load_tokenizer(tokenizer) if folder is None else lm_tokenizer(folder, tokenizer)
        config = self.model.config
        if self.tokenizer.vocab_size > config.vocab_size:
            raise UsageError(
                f"the tokenizer has {self.tokenizer.vocab_size} ids, more than the model's vocab_size "
                f"{config.vocab_size}"
            )
        self.num_steps = _positive_int("num_steps", num_steps, allow_none=True) or config.mean_recurrence
        self.exit_spec = None if exit in (None, "", "none") else str(exit)
        ExitCriterion.parse(self.exit_spec)  # a bad spec fails here, before any request runs
        self.kv_share = _positive_int("kv_share", kv_share, allow_none=True)
        self.init_scale = float(init_scale)
        if self.init_scale < 0:
            raise UsageError(f"init_scale must not be negative, got {self.init_scale}")
        if str(batch_size).startswith("auto"):
            raise UsageError("batch_size must be a number (automatic batch sizes are not supported)")
        self.batch_size = _positive_int("batch_size", batch_size)
        self.max_length = _positive_int("max_length", max_length, allow_none=True) or config.block_size
        if self.max_length > config.block_size:
            raise UsageError(
                f"max_length {self.max_length} exceeds the model's block_size {config.block_size}"
            )
        self.max_gen_toks = _positive_int("max_gen_toks", max_gen_toks)
        self.prefix_token_id = self.tokenizer.eos_id if prefix_token_id is None else prefix_token_id
        if not isinstance(self.prefix_token_id, int) or not 0 <= self.prefix_token_id < config.vocab_size:
            raise UsageError(
                f"prefix_token_id must be a token id below {config.vocab_size}, got {prefix_token_id!r}"
            )
        self.seed = int(seed)

    # lm-eval's three request types --------------------------------------------------------------------------
    def loglikelihood(self, requests: list, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """``log p(continuation | context)`` and whether greedy decoding gives the continuation, per request."""
        pairs = [self._encode_pair(*request.args[:2]) for request in requests]
        results = self._score(pairs, disable_tqdm)
        for request, result in zip(requests, results, strict=True):
            self.cache_hook.add_partial("loglikelihood", request.args, result)
        return results

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        """``log p(text)`` of whole texts, each token predicted once, in windows of at most ``max_length``."""
        windows, owners = [], []
        for index, request in enumerate(requests):
            tokens = self.tokenizer.encode(request.args[0])
            for window in get_rolling_token_windows(tokens, self.prefix_token_id, self.max_length, 1):
                context, continuation = make_disjoint_window(window)
                windows.append((list(context), list(continuation)))
                owners.append(index)
        totals = [0.0] * len(requests)
        for owner, (logprob, _) in zip(owners, self._score(windows, disable_tqdm), strict=True):
            totals[owner] += logprob
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        """Continue each context until one of its stop strings, the end-of-text token or ``max_gen_toks``."""
        results: list[str | None] = [None] * len(requests)
        groups: dict[str, tuple[dict[str, Any], list[int]]] = {}
        for index, request in enumerate(requests):
            kwargs = request.args[1] if len(request.args) > 1 else {}
            key = json.dumps(kwargs, sort_keys=True, default=str)
            groups.setdefault(key, (kwargs, []))[1].append(index)
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc="generate_until")
        for kwargs, indices in groups.values():
            options = self._generation_options(kwargs)
            length = options["max_new_tokens"]
            contexts = {i: self._context_tokens(requests[i].args[0], length) for i in indices}
            for batch in self._batches(indices, key=lambda i: len(contexts[i])):
                texts = self._generate([contexts[i] for i in batch], options)
                for i, text in zip(batch, texts, strict=True):
                    results[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
                bar.update(len(batch))
        bar.close()
        return results  # type: ignore[return-value]

    def get_model_info(self) -> dict[str, Any]:
        """What lm-eval records about the model in its results' ``config``."""
        return {
            "checkpoint": self.checkpoint,
            "num_steps": self.num_steps,
            "exit": self.exit_spec,
            "kv_share": self.kv_share,
            "init_scale": self.init_scale,
            "weights": self.weights,
            "max_length": self.max_length,
            "tokenizer": self.tokenizer.name,
        }

    # Scoring ----------------------------------------------------------------------------------------------------
    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Token ids of context and continuation; spaces at the context's end move to the continuation, and the
        continuation's ids are those of the joined text past the context's (so merges across the boundary are
        scored as the tokenizer would split the whole), as lm-eval's own models do."""
        trailing = len(context) - len(context.rstrip())
        if trailing:
            context, continuation = context[:-trailing], context[-trailing:] + continuation
        if not context:
            return [self.prefix_token_id], self.tokenizer.encode(continuation)
        whole = self.tokenizer.encode(context + continuation)
        context_ids = self.tokenizer.encode(context)
        return context_ids, whole[len(context_ids) :]

    def _score(
        self, pairs: Sequence[tuple[list[int], list[int]]], disable_tqdm: bool = False
    ) -> list[tuple[float, bool]]:
        """Summed log-probability and greedy match of each continuation after its context, batched."""
        results: list[tuple[float, bool] | None] = [None] * len(pairs)
        todo = []
        for index, (_, continuation) in enumerate(pairs):
            if not continuation:
                results[index] = (0.0, True)
            elif len(continuation) > self.max_length:
                raise UsageError(
                    f"a continuation of {len(continuation)} tokens does not fit max_length {self.max_length}"
                )
            else:
                todo.append(index)
        lengths = {i: min(len(pairs[i][0]) + len(pairs[i][1]) - 1, self.max_length) for i in todo}
        batches = self._batches(todo, key=lambda i: lengths[i])
        for batch in tqdm(batches, disable=disable_tqdm, desc="loglikelihood"):
            # The window's last max_length + 1 tokens: inputs drop the last one, targets the first.
            rows = [(pairs[i][0] + pairs[i][1])[-(self.max_length + 1) :] for i in batch]
            ids, mask = self._left_pad([row[:-1] for row in rows])
            with torch.inference_mode():
                logits = self.model(
                    ids, num_steps=self.num_steps, init_scale=self.init_scale, attention_mask=mask
                ).logits
            logprobs = F.log_softmax(logits.float(), dim=-1)
            for row, i in enumerate(batch):
                target = torch.tensor(pairs[i][1], device=logprobs.device)
                scored = logprobs[row, -len(target) :]
                total = float(scored.gather(-1, target[:, None]).sum())
                results[i] = (total, bool((scored.argmax(-1) == target).all()))
        return results  # type: ignore[return-value]

    def _batches(self, indices: list[int], key) -> list[list[int]]:
        """``indices`` longest first (the largest batch comes first, and padding stays small), in batches."""
        ordered = sorted(indices, key=lambda i: -key(i))
        return [ordered[start : start + self.batch_size] for start in range(0, len(ordered), self.batch_size)]

    def _left_pad(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(row) for row in rows)
        ids = torch.full((len(rows), width), self.tokenizer.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, row in enumerate(rows):
            ids[r, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[r, width - len(row) :] = 1
        return ids.to(self._device), mask.to(self._device)

    # Generation -------------------------------------------------------------------------------------------------
    def _generation_options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """A task's ``generation_kwargs`` as :func:`generate` options; keys it does not know are refused
        rather than ignored, so a task never runs with settings other than it asked for."""
        kwargs = dict(kwargs or {})
        until = kwargs.pop("until", None)
        until = [until] if isinstance(until, str) else list(until or [])
        length = self.max_gen_toks
        for key in _LENGTH_KEYS:
            if key in kwargs:
                length = _positive_int(key, kwargs.pop(key))
        sampling = {key: kwargs.pop(key) for key in _SAMPLING_KEYS if key in kwargs}
        if kwargs:
            raise UsageError(f"unsupported generation_kwargs: {', '.join(sorted(kwargs))}")
        temperature = float(sampling.get("temperature") or 0.0)
        do_sample = bool(sampling.get("do_sample", False)) and temperature > 0
        # Room for at least one context token: a task's length beyond the window is cut to fit.
        length = min(length, self.max_length - 1)
        stop_tokens = [self.tokenizer.eos_id]
        for text in until:
            ids = self.tokenizer.encode(text)
            # A stop string that is one token ends its row at that token: the text cut at the stop string is
            # the same, and decoding stops early instead of running to max_gen_toks.
            if len(ids) == 1 and self.tokenizer.decode(ids) == text:
                stop_tokens.append(ids[0])
        return dict(
            until=[text for text in until if text],
            max_new_tokens=length,
            do_sample=do_sample,
            temperature=temperature if do_sample else 1.0,
            top_k=sampling.get("top_k"),
            top_p=sampling.get("top_p"),
            stop_tokens=stop_tokens,
        )

    def _context_tokens(self, context: str, max_new_tokens: int) -> list[int]:
        """The context's last tokens that leave room for ``max_new_tokens`` in the window."""
        ids = self.tokenizer.encode(context) or [self.prefix_token_id]
        return ids[-(self.max_length - max_new_tokens) :]

    def _generate(self, contexts: list[list[int]], options: dict[str, Any]) -> list[str]:
        ids, mask = self._left_pad(contexts)
        out = generation.generate(
            self.model,
            ids,
            max_new_tokens=options["max_new_tokens"],
            num_steps=self.num_steps,
            init_scale=self.init_scale,
            attention_mask=mask,
            do_sample=options["do_sample"],
            temperature=options["temperature"],
            top_k=options["top_k"],
            top_p=options["top_p"],
            stop_tokens=options["stop_tokens"],
            pad_token_id=self.tokenizer.pad_id,
            kv_share=self.kv_share,
            exit=self.exit_spec,
            generator=torch.Generator(device=self._device).manual_seed(self.seed),
        )
        stops = set(options["stop_tokens"])
        texts = []
        for row in out.sequences[:, ids.shape[1] :].tolist():
            ends = [k for k, token in enumerate(row) if token in stops]
            text = self.tokenizer.decode(row[: ends[0] + 1] if ends else row)
            for stop in options["until"]:
                text = text.split(stop)[0]
            texts.append(text)
        return texts


def _device(device: str) -> torch.device:
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise UsageError(f"device must be cpu, cuda or cuda:N, got {device!r}") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device {device!r}: no CUDA device is available")
    return resolved


def _checkpoint_folder(pretrained: str | Path, revision: str | None) -> Path:
    """The checkpoint folder of a checkpoint, a run folder (its newest checkpoint) or a Hub id of either."""
    return resolve_checkpoint(resolve_model(pretrained, revision))


# The depth sweep ------------------------------------------------------------------------------------------------
def task_manager(include_path: str | Path | None = None, include_defaults: bool = True):
    """lm-eval's ``TaskManager`` over its own tasks (unless ``include_defaults=False``) and the YAML task
    files under ``include_path``."""
    if include_path is not None and not Path(include_path).is_dir():
        raise UsageError(f"--include-path {include_path} is not a folder")
    return TaskManager(
        include_path=None if include_path is None else str(include_path), include_defaults=include_defaults
    )


def main_metric(
    task_results: dict[str, Any], config: dict[str, Any] | None = None
) -> tuple[str, float | None]:
    """A task's main metric as ``(name, value)``: the first of its config's ``metric_list`` (lm-eval's results
    do not keep that order), else the first metric its results hold (a group's). The filter suffix
    (``acc,none`` -> ``acc``) is dropped for the default filter."""
    metrics = [
        (name, filter_name)
        for name, _, filter_name in (key.partition(",") for key in task_results)
        if filter_name and not name.endswith("_stderr")
    ]
    wanted = [
        entry.get("metric") for entry in (config or {}).get("metric_list") or [] if isinstance(entry, dict)
    ]
    if wanted:
        metrics = sorted(metrics, key=lambda m: wanted.index(m[0]) if m[0] in wanted else len(wanted))
    if not metrics:
        return "", None
    name, filter_name = metrics[0]
    value = task_results[f"{name},{filter_name}"]
    label = name if filter_name == "none" else f"{name},{filter_name}"
    return label, (float(value) if isinstance(value, (int, float)) else None)


def depth_sweep(
    model: LatentloopLM,
    tasks: Sequence[str],
    depths: Sequence[int],
    manager: Any = None,
    limit: int | None = None,
    num_fewshot: int | None = None,
    bootstrap_iters: int = 100_000,
) -> dict[str, Any]:
    """Run lm-eval's ``simple_evaluate`` on ``tasks`` once per depth with the same model.

    Returns ``{"tasks", "num_steps", "metrics": {task: metric}, "table": {task: {depth: value}},
    "results": {depth: lm-eval's per-task results}}`` (depths as strings, as JSON keys are).
    """
    manager = manager if manager is not None else task_manager()
    known = set(manager.all_tasks)
    unknown = [name for name in tasks if name not in known]
    if unknown:
        raise UsageError(
            f"unknown lm-eval task(s): {', '.join(unknown)} (lm-eval's `lm_eval ls tasks` lists them; "
            "local task files go in --include-path)"
        )
    _check_tasks_load(manager, tasks)
    report: dict[str, Any] = {
        "tasks": list(tasks),
        "num_steps": [int(d) for d in depths],
        "metrics": {},
        "table": {},
        "results": {},
    }
    for depth in depths:
        model.num_steps = int(depth)
        out = simple_evaluate(
            model=model,
            tasks=list(tasks),
            task_manager=manager,
            limit=limit,
            num_fewshot=num_fewshot,
            bootstrap_iters=bootstrap_iters,
            log_samples=False,
            batch_size=model.batch_size,
        )
        results = out["results"]
        report["results"][str(depth)] = results
        for task, task_results in results.items():
            metric, value = main_metric(task_results, out.get("configs", {}).get(task))
            report["metrics"].setdefault(task, metric)
            report["table"].setdefault(task, {})[str(depth)] = value
    return report


def _check_tasks_load(manager: Any, tasks: Sequence[str]) -> None:
    """Build the tasks once before any depth runs, so that a task file lm-eval cannot read, a data file that
    is missing or a dataset that cannot be fetched is one line, not a traceback from inside lm-eval."""
    try:
        get_task_dict(list(tasks), manager)
    except Exception as error:  # lm-eval and datasets raise anything from ValueError to their own types
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UsageError(f"lm-eval could not load {', '.join(tasks)}: {message}") from None


def format_table(report: dict[str, Any]) -> str:
    """The sweep as a text table: one row per task (its main metric), one column per depth."""
    depths = [str(d) for d in report["num_steps"]]
    header = ["task", "metric", *(f"r={d}" for d in depths)]
    rows = [header]
    for task, values in report["table"].items():
        cells = [_cell(values.get(d)) for d in depths]
        rows.append([task, report["metrics"].get(task, ""), *cells])
    widths = [max(len(row[c]) for row in rows) for c in range(len(header))]
    lines = []
    for row in rows:
        cells = [
            cell.ljust(w) if c < 2 else cell.rjust(w)
            for c, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    # Perplexities of a barely trained model run to many digits; four significant ones say enough.
    return f"{value:.4f}" if abs(value) < 1e5 else f"{value:.4g}"
