"""The text task: embedded corpus, local files, held-out tail, errors."""

from __future__ import annotations

import pytest
import torch

from latentloop.errors import UsageError
from latentloop.tasks.base import get_task
from latentloop.tasks.text import TextTask, default_corpus_text


def test_embedded_corpus_needs_no_download():
    text = default_corpus_text()
    assert 100_000 <= len(text.encode("utf-8")) <= 300_000
    task = get_task("text")
    assert task.metric == "perplexity" and task.vocab_size == 259
    assert len(task.stream) == len(text.encode("utf-8")) + 1  # bytes + one <eos>


def test_heldout_is_the_last_five_percent_and_training_never_reads_it():
    task = TextTask(seq_len=64)
    n = len(task.stream)
    assert abs((n - task.split_at) / n - 0.05) < 0.001
    for step in range(50):
        inputs, labels = task.train_batch(step, 32)
        assert inputs.shape == labels.shape == (32, 64)
        assert torch.equal(inputs[:, 1:], labels[:, :-1])  # labels are the next tokens
    # The largest possible training window ends before the held-out part.
    assert task.split_at - task.seq_len - 1 + task.seq_len < task.split_at
    held = [x for x, _, _ in task.heldout_batches(16)]
    first = held[0][0]
    assert torch.equal(first, torch.from_numpy(task.stream[task.split_at : task.split_at + 64]))


def test_local_files_and_folders(tmp_path):
    (tmp_path / "a.txt").write_text("alpha beta gamma delta " * 40)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("epsilon zeta eta theta " * 40)
    one = TextTask(paths=str(tmp_path / "a.txt"), seq_len=16)
    assert one.decode(one.stream[:11].tolist()) == "alpha beta "
    both = TextTask(paths=f"{tmp_path / 'a.txt'},{tmp_path / 'sub' / 'b.txt'}", seq_len=16)
    folder = TextTask(paths=str(tmp_path), seq_len=16)
    assert len(both.stream) == len(folder.stream) == len(one.stream) + 23 * 40 + 1
    assert torch.equal(*(t.train_batch(3, 4, seed=9)[0] for t in (both, folder)))


def test_errors_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        TextTask(paths=str(tmp_path / "missing.txt"))
    small = tmp_path / "small.txt"
    small.write_text("tiny")
    with pytest.raises(UsageError, match="too small"):
        TextTask(paths=str(small), seq_len=128)
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\xff\xfe\x00" * 100)
    with pytest.raises(UsageError, match="UTF-8"):
        TextTask(paths=str(binary))
    with pytest.raises(UsageError):
        TextTask(seq_len=0)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UsageError, match=r"no \.txt"):
        TextTask(paths=str(empty))
