"""Opening a trained run: a reasoner's EMA model, its task and the dataset it trained on; an LM's tokenizer."""

from __future__ import annotations

from pathlib import Path

from latentloop.data.dataset import PuzzleDataset, load_dataset
from latentloop.data.tokenizers import Tokenizer, load_tokenizer
from latentloop.errors import UsageError
from latentloop.models.reasoners import Reasoner, load_reasoner
from latentloop.tasks.base import Task, get_task, parse_task_spec
from latentloop.train.checkpoint import resolve_checkpoint, run_folder_of
from latentloop.train.run_config import load_reasoner_run_config, load_run_config


def load_run(run: str | Path, task_spec: str | None = None) -> tuple[Reasoner, Task, Path, Path | None]:
    """``(EMA model, task, checkpoint, run folder)`` of a run folder or checkpoint folder."""
    checkpoint = resolve_checkpoint(run)
    model = load_reasoner(checkpoint).eval()
    folder = run_folder_of(checkpoint)
    if task_spec:
        name, options = parse_task_spec(task_spec)
        task = get_task(name, **options)
    elif folder is not None:
        config = load_reasoner_run_config(folder / "config.yaml")
        task = get_task(config.task.name, **config.task.options)
    else:
        raise UsageError(f"{checkpoint} is not inside a run folder; name its task with --task")
    if task.seq_len != model.config.seq_len or task.vocab_size != model.config.vocab_size:
        raise UsageError(
            f"the model was trained for puzzles of {model.config.seq_len} tokens (vocabulary "
            f"{model.config.vocab_size}); task {task.name!r} has {task.seq_len} ({task.vocab_size})"
        )
    return model, task, checkpoint, folder


def run_dataset(run: str | Path, folder: Path | None) -> PuzzleDataset:
    """The dataset a run folder trained on (``OUT/data``, its config's ``train.data``, or the official folder
    its task reads as it is)."""
    data = folder / "data" if folder is not None else None
    if folder is not None:
        config = load_reasoner_run_config(folder / "config.yaml")
        official = get_task(config.task.name, **config.task.options).official_dataset()
        if official is not None:
            tc = config.train
            return official.puzzle_dataset(tc.train_size, tc.test_size, tc.validation)
        configured = config.train.data
        data = Path(configured) if configured else data
    if data is None or not (data / "metadata.json").is_file():
        raise UsageError(f"no test data found for {run} (expected {data}/metadata.json)")
    return load_dataset(data)


def lm_tokenizer(checkpoint: str | Path, spec: str | Path | None = None) -> Tokenizer:
    """The tokenizer of a looped LM's checkpoint folder: ``spec`` when given, else the folder's
    ``tokenizer.json``, else the one its run trained with (the text task's ``tokenizer``), else bytes."""
    checkpoint = Path(checkpoint)
    if spec is None and (checkpoint / "tokenizer.json").is_file():
        spec = checkpoint / "tokenizer.json"
    folder = run_folder_of(checkpoint)
    if spec is None and folder is not None:
        spec = load_run_config(folder / "config.yaml").task.options.get("tokenizer")
    return load_tokenizer(spec)
