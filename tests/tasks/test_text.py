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


def test_heldout_is_the_last_five_percent_and_training_never_reads_it(tmp_path):
    task = TextTask(seq_len=64)
    n = len(task.stream)
    assert abs((n - task.split_at) / n - 0.05) < 0.001
    for step in range(50):
        inputs, labels = task.train_batch(step, 32)
        assert inputs.shape == labels.shape == (32, 64)
        assert torch.equal(inputs[:, 1:], labels[:, :-1])  # labels are the next tokens
    held = [x for x, _, _ in task.heldout_batches(16)]
    first = held[0][0]
    assert torch.equal(first, torch.from_numpy(task.stream[task.split_at : task.split_at + 64]))

    # A corpus whose held-out tail is a sentinel that the training text never contains ('#' bytes, then the
    # final <eos>), starting exactly at the split: 180 letters + 19 '#' + <eos> = 200 tokens, 10% held out.
    # Few window starts, many draws: a window running even one token into the tail would be drawn.
    (tmp_path / "corpus.txt").write_text(("lorem ipsum dolor sit amet " * 7)[:180] + "#" * 19)
    small = TextTask(paths=str(tmp_path / "corpus.txt"), seq_len=16, heldout_fraction=0.1)
    sentinel = torch.tensor([*small.encode("#"), small.tokenizer.eos_id])
    assert small.split_at == 180 and set(small.stream[180:].tolist()) == set(sentinel.tolist())
    assert not torch.isin(torch.from_numpy(small.stream[:180]), sentinel).any()
    for step in range(100):
        inputs, labels = small.train_batch(step, 64)
        assert not torch.isin(inputs, sentinel).any() and not torch.isin(labels, sentinel).any(), step
    held_inputs = torch.cat([x for x, _, _ in small.heldout_batches(4)])
    assert torch.isin(held_inputs, sentinel).all()  # the held-out windows read the tail only


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
