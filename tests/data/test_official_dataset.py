"""Official TinyRecursiveModels/HRM dataset folders: read as they are, trained on and evaluated, and refused
with one line naming the problem when malformed.

The folders are written here with numpy in the layout of the official ``dataset/build_sudoku_dataset.py`` and
``build_arc_dataset.py`` (``DIR/{train,test}/dataset.json`` and ``all__*.npy``, ``DIR/identifiers.json``),
from a few hand-made puzzles, so that what the reader gives back can be compared with the source puzzles.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from latentloop.cli import main
from latentloop.data.dataset import build_dataset, load_dataset
from latentloop.data.official import OFFICIAL_DIHEDRAL, open_official
from latentloop.errors import UsageError
from latentloop.tasks.arc import ArcTransform, decode_grid, official_puzzle_info
from latentloop.tasks.base import get_task
from latentloop.train.puzzle_batches import task_data
from latentloop.train.run_config import build_reasoner_config
from tests.tiny import TINY_REASONER, tiny_run

# -- writing folders the way the official builders do -------------------------------------------------------


def write_split(folder: Path, inputs, labels, identifiers, puzzle_indices, group_indices, **meta) -> None:
    """``folder/dataset.json`` and ``folder/all__*.npy`` with the official names, dtypes and fields."""
    folder.mkdir(parents=True)
    arrays = {
        "inputs": np.stack(inputs).astype(np.uint8),
        "labels": np.stack(labels).astype(np.uint8),
        "puzzle_identifiers": np.asarray(identifiers, dtype=np.int32),
        "puzzle_indices": np.asarray(puzzle_indices, dtype=np.int32),
        "group_indices": np.asarray(group_indices, dtype=np.int32),
    }
    for name, array in arrays.items():
        np.save(folder / f"all__{name}.npy", array)
    fields = {
        "pad_id": 0,
        "ignore_label_id": 0,
        "blank_identifier_id": 0,
        "total_groups": len(group_indices) - 1,
    }
    (folder / "dataset.json").write_text(json.dumps({**fields, **meta, "sets": ["all"]}))


def sudoku_solution(rng: np.random.Generator) -> np.ndarray:
    """A valid 9x9 solution: the shifted-rows pattern under a random relabelling of the digits."""
    pattern = np.array([[(3 * (r % 3) + r // 3 + c) % 9 + 1 for c in range(9)] for r in range(9)])
    digits = np.concatenate([[0], rng.permutation(9) + 1])
    return digits[pattern].astype(np.uint8)


def sudoku_sources(count: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` (puzzle, solution) pairs, 0 for a blank."""
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(count):
        solution = sudoku_solution(rng)
        pairs.append((np.where(rng.random((9, 9)) < 0.4, 0, solution).astype(np.uint8), solution))
    return pairs


def write_official_sudoku(root: Path, train, test, num_aug: int = 1, seed: int = 0) -> None:
    """build_sudoku_dataset.py's layout: one example per puzzle, a group per source puzzle holding it and its
    ``num_aug`` relabelled copies (training only), digits + 1 as tokens, every identifier the blank 0."""
    rng = np.random.default_rng(seed)
    for name, pairs in (("train", train), ("test", test)):
        inputs, labels, puzzle_indices, group_indices = [], [], [0], [0]
        for puzzle, solution in pairs:
            for copy in range(1 + (num_aug if name == "train" else 0)):
                digits = np.arange(10) if copy == 0 else np.concatenate([[0], rng.permutation(9) + 1])
                inputs.append(digits[puzzle].reshape(-1) + 1)
                labels.append(digits[solution].reshape(-1) + 1)
                puzzle_indices.append(len(inputs))
            group_indices.append(len(puzzle_indices) - 1)
        write_split(
            root / name,
            inputs,
            labels,
            [0] * len(inputs),
            puzzle_indices,
            group_indices,
            seq_len=81,
            vocab_size=11,
            num_puzzle_identifiers=1,
            mean_puzzle_examples=1,
            total_puzzles=len(pairs),
        )
    (root / "identifiers.json").write_text(json.dumps(["<blank>"]))


def official_dihedral(grid: np.ndarray, tid: int) -> np.ndarray:
    """The official dataset/common.py transform ids, spelled out with numpy."""
    return [
        lambda a: a,
        lambda a: np.rot90(a, 1),
        lambda a: np.rot90(a, 2),
        lambda a: np.rot90(a, 3),
        np.fliplr,
        np.flipud,
        lambda a: a.T,
        lambda a: np.fliplr(np.rot90(a, 1)),
    ][tid](grid)


def official_arc_tokens(grid: np.ndarray, pad_r: int, pad_c: int) -> np.ndarray:
    """An ARC grid as the official builder writes it: colours + 2 at (pad_r, pad_c) in a 30x30 frame of 0, the
    end marker 1 below and right of it (not at the corner)."""
    rows, cols = grid.shape
    frame = np.zeros((30, 30), dtype=np.uint8)
    frame[pad_r : pad_r + rows, pad_c : pad_c + cols] = grid + 2
    if pad_r + rows < 30:
        frame[pad_r + rows, pad_c : pad_c + cols] = 1
    if pad_c + cols < 30:
        frame[pad_r : pad_r + rows, pad_c + cols] = 1
    return frame.reshape(-1)


def arc_sources(seed: int) -> dict[str, dict[str, list[tuple[np.ndarray, np.ndarray]]]]:
    """Three small ARC tasks (the answer swaps colours 1 and 2): two training tasks, one evaluation task."""
    rng = np.random.default_rng(seed)

    def pair() -> tuple[np.ndarray, np.ndarray]:
        grid = rng.integers(0, 4, size=(int(rng.integers(2, 5)), int(rng.integers(2, 5)))).astype(np.uint8)
        return grid, np.array([0, 2, 1, 3], dtype=np.uint8)[grid]

    return {
        name: {"train": [pair(), pair()], "test": [pair()]} for name in ("aa000001", "bb000002", "cc000003")
    }


EVALUATION_TASK = "cc000003"
ARC_AUGMENTS = ((6, 1), (4, 2))  # (official dihedral id, seed of the colour permutation) per augmented copy


def arc_name(task: str, tid: int, colors: np.ndarray, style: str) -> str:
    digits = "".join(str(int(c)) for c in colors)
    return f"{task}|||t{tid}|||{digits}" if style == "trm" else f"{task}_t{tid}_{digits}"


def write_official_arc(root: Path, style: str = "trm") -> dict[str, list[str]]:
    """build_arc_dataset.py's layout: a group per task holding its identity copy and the augmented copies of
    ARC_AUGMENTS; a training task's pairs all go to train, the evaluation task's demonstrations to train and
    its test pairs to test (each copy one puzzle in each split, under one identifier shared by both). Training
    examples are translated except one per puzzle; test examples sit at the top-left corner. Returns the
    puzzle names of each task, identity first."""
    rng = np.random.default_rng(3)
    sources = arc_sources(0)
    names, copies = ["<blank>"], {}
    for task in sources:
        copies[task] = [(task, 0, np.arange(10))]
        for tid, colour_seed in ARC_AUGMENTS:
            colors = np.concatenate([[0], np.random.default_rng(colour_seed).permutation(9) + 1]).astype(
                np.uint8
            )
            copies[task].append((arc_name(task, tid, colors, style), tid, colors))
        names += [name for name, _, _ in copies[task]]
    identifier = {name: i for i, name in enumerate(names)}
    for split in ("train", "test"):
        inputs, labels, ids, puzzle_indices, group_indices = [], [], [], [0], [0]
        for task, pairs in sources.items():
            if split == "train":
                examples = pairs["train"] + ([] if task == EVALUATION_TASK else pairs["test"])
            elif task == EVALUATION_TASK:
                examples = pairs["test"]
            else:
                continue
            for name, tid, colors in copies[task]:
                kept = int(rng.integers(len(examples)))
                for index, (question, answer) in enumerate(examples):
                    question = official_dihedral(colors[question], tid)
                    answer = official_dihedral(colors[answer], tid)
                    pad_r = pad_c = 0
                    if split == "train" and index != kept:
                        pad_r = int(rng.integers(0, 30 - max(question.shape[0], answer.shape[0]) + 1))
                        pad_c = int(rng.integers(0, 30 - max(question.shape[1], answer.shape[1]) + 1))
                    inputs.append(official_arc_tokens(question, pad_r, pad_c))
                    labels.append(official_arc_tokens(answer, pad_r, pad_c))
                puzzle_indices.append(len(inputs))
                ids.append(identifier[name])
            group_indices.append(len(ids))
        write_split(
            root / split,
            inputs,
            labels,
            ids,
            puzzle_indices,
            group_indices,
            seq_len=900,
            vocab_size=12,
            num_puzzle_identifiers=len(names),
            mean_puzzle_examples=len(inputs) / len(ids),
            total_puzzles=len(ids),
        )
    (root / "identifiers.json").write_text(json.dumps(names))
    return {task: [name for name, _, _ in members] for task, members in copies.items()}


# Hand-made 7x7 mazes as the official CSV holds them (question, answer): corridors with one shortest path,
# and one with two (the label marks the upper).
MAZE_TRAIN = [
    (
        ["#######", "#S    #", "##### #", "#     #", "# #####", "#    G#", "#######"],
        ["#######", "#Soooo#", "#####o#", "#ooooo#", "#o#####", "#ooooG#", "#######"],
    ),
    (
        ["#######", "#G#   #", "# # # #", "# # # #", "# # # #", "#   #S#", "#######"],
        ["#######", "#G#ooo#", "#o#o#o#", "#o#o#o#", "#o#o#o#", "#ooo#S#", "#######"],
    ),
]
MAZE_TEST = [
    (
        ["#######", "#     #", "# ### #", "#S###G#", "# ### #", "#     #", "#######"],
        ["#######", "#ooooo#", "#o###o#", "#S###G#", "# ### #", "#     #", "#######"],
    ),
    (
        ["#######", "#S   G#", "# ### #", "#     #", "#######", "#######", "#######"],
        ["#######", "#SoooG#", "# ### #", "#     #", "#######", "#######", "#######"],
    ),
]


def write_official_maze(root: Path) -> None:
    """build_maze_dataset.py's layout with aug: the 8 dihedral copies of each training maze in its group (one
    example per puzzle), characters of "# SGo" as their index + 1, every identifier the blank 0."""
    char2id = np.zeros(256, np.uint8)
    char2id[[ord(c) for c in "# SGo"]] = np.arange(1, 6)
    for split, pairs in (("train", MAZE_TRAIN), ("test", MAZE_TEST)):
        inputs, labels, puzzle_indices, group_indices = [], [], [0], [0]
        for question, answer in pairs:
            q = np.frombuffer("".join(question).encode(), np.uint8).reshape(7, 7)
            a = np.frombuffer("".join(answer).encode(), np.uint8).reshape(7, 7)
            for tid in range(8 if split == "train" else 1):
                inputs.append(char2id[official_dihedral(q, tid).reshape(-1)])
                labels.append(char2id[official_dihedral(a, tid).reshape(-1)])
                puzzle_indices.append(len(inputs))
            group_indices.append(len(puzzle_indices) - 1)
        write_split(
            root / split,
            inputs,
            labels,
            [0] * len(inputs),
            puzzle_indices,
            group_indices,
            seq_len=49,
            vocab_size=6,
            num_puzzle_identifiers=1,
            mean_puzzle_examples=1,
            total_puzzles=len(pairs),
        )
    (root / "identifiers.json").write_text(json.dumps(["<blank>"]))


# -- fixtures ------------------------------------------------------------------------------------------------

SUDOKU_TRAIN, SUDOKU_TEST = sudoku_sources(4, seed=1), sudoku_sources(3, seed=2)


@pytest.fixture
def sudoku_folder(tmp_path) -> Path:
    root = tmp_path / "sudoku-official"
    write_official_sudoku(root, SUDOKU_TRAIN, SUDOKU_TEST)
    return root


@pytest.fixture
def arc_folder(tmp_path) -> Path:
    root = tmp_path / "arc-official"
    write_official_arc(root)
    return root


def config_file(tmp_path: Path, **sections) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tiny_run(TINY_REASONER, **sections)))
    return path


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


# -- reading -------------------------------------------------------------------------------------------------


def test_tasks_without_an_official_folder_build_their_own_data(tmp_path) -> None:
    csv = tmp_path / "csv"
    csv.mkdir()
    (csv / "train.csv").write_text("source,question,answer,rating\n")
    for task in (
        get_task("sudoku"),
        get_task("sudoku", data=str(csv)),
        get_task("arc-agi-1"),
        get_task("maze"),
    ):
        assert task.official_dataset() is None
    assert get_task("nqueens", n=5).official_dataset() is None  # the default of Task


def test_sudoku_rows_decode_to_the_source_puzzles_with_their_groups(sudoku_folder) -> None:
    task = get_task("sudoku", data=str(sudoku_folder))
    official = task.official_dataset()
    rows = list(official.splits["train"].rows())
    assert len(rows) == 8  # 4 puzzles, each with one augmented copy
    assert [r.group for r in rows] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [r.puzzle for r in rows] == list(range(8)) and {r.identifier for r in rows} == {0}
    for (puzzle, solution), original, copy in zip(SUDOKU_TRAIN, rows[::2], rows[1::2], strict=True):
        assert np.array_equal(task.decode(original.inputs), puzzle)
        assert np.array_equal(task.decode(original.labels), solution)
        assert task.verify(task.decode(copy.inputs), task.decode(copy.labels))
    # examples() gives the original of each group, which the verifier accepts with its label.
    for (puzzle, solution), (source_puzzle, source_solution) in zip(
        task.examples("test"), SUDOKU_TEST, strict=True
    ):
        assert (puzzle == source_puzzle).all() and (solution == source_solution).all()
        assert task.verify(puzzle, solution)


def test_training_arrays_are_memory_maps_of_the_official_files(sudoku_folder, tmp_path) -> None:
    config = build_reasoner_config(
        tiny_run(TINY_REASONER, arch="trm", task="sudoku"), [f"task.data={sudoku_folder}"]
    )
    task = get_task(config.task.name, **config.task.options)
    data = task_data(config, task, tmp_path / "run")
    assert set(data) == {"train", "test"} and not (tmp_path / "run" / "data").exists()  # nothing is built
    for split, rows in (("train", 8), ("test", 3)):
        for name in ("inputs", "labels"):
            array = data[split][name]
            assert isinstance(array, np.memmap) and array.shape == (rows, 81)
            assert Path(array.filename) == sudoku_folder / split / f"all__{name}.npy"
    # Without puzzle embeddings every puzzle keeps its own id, so the 3 test puzzles are evaluated as 3.
    assert data["test"]["puzzle_ids"].tolist() == [0, 1, 2]
    assert data["train"]["groups"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_size_caps_and_the_validation_split_take_whole_groups(sudoku_folder, tmp_path) -> None:
    overrides = [
        f"task.data={sudoku_folder}",
        "train.train_size=3",
        "train.test_size=2",
        "train.validation=1",
    ]
    config = build_reasoner_config(tiny_run(TINY_REASONER, arch="trm", task="sudoku"), overrides)
    data = task_data(config, get_task("sudoku", data=str(sudoku_folder)), tmp_path / "run")
    assert data["train"]["groups"].tolist() == [0, 0, 1, 1]
    assert data["validation"]["groups"].tolist() == [2, 2]  # the third group, apart from the first two
    assert isinstance(data["validation"]["inputs"], np.memmap)
    assert len(data["test"]["inputs"]) == 2
    with pytest.raises(UsageError, match="holds out every training group"):
        get_task("sudoku", data=str(sudoku_folder)).official_dataset().puzzle_dataset(size=1, validation=1)


def test_an_official_folder_converts_to_a_latentloop_dataset(sudoku_folder, tmp_path) -> None:
    task = get_task("sudoku", data=str(sudoku_folder))
    build_dataset(task, tmp_path / "converted")
    train = load_dataset(tmp_path / "converted").split("train")
    official = task.official_dataset().splits["train"]
    assert (train["inputs"] == official.inputs).all() and (train["labels"] == official.labels).all()
    assert train["groups"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_official_dihedral_ids_are_the_same_transforms() -> None:
    grid = np.arange(8, dtype=np.int8).reshape(2, 4)  # distinct colours: the 8 transforms all differ
    for tid in range(8):
        assert (ArcTransform(OFFICIAL_DIHEDRAL[tid]).apply(grid) == official_dihedral(grid, tid)).all(), tid


@pytest.mark.parametrize("style", ["trm", "hrm"])
def test_arc_rows_decode_to_the_source_grids_through_their_identifiers(tmp_path, style) -> None:
    names = write_official_arc(tmp_path / "arc", style)
    task = get_task("arc-agi-1", data=str(tmp_path / "arc"))
    official = task.official_dataset()
    dataset = official.puzzle_dataset()
    info = dataset.metadata["puzzles"]
    sources = arc_sources(0)
    assert {entry["task"] for entry in info.values()} == set(sources)
    for split in ("train", "test"):
        arrays = dataset.split(split)
        seen: dict[int, int] = {}
        for row in official.splits[split].rows():
            name = official.identifiers[row.identifier]
            task_id = info[str(row.identifier)]["task"]
            assert name in names[task_id]
            pairs = sources[task_id]
            if split == "train":
                examples = pairs["train"] + ([] if task_id == EVALUATION_TASK else pairs["test"])
            else:
                examples = pairs["test"]
            index = seen.get(row.identifier, 0)
            seen[row.identifier] = index + 1
            transform = ArcTransform.from_json(info[str(row.identifier)]["transform"])
            question, answer = examples[index]
            assert np.array_equal(transform.invert(decode_grid(row.inputs)), question)
            assert np.array_equal(transform.invert(decode_grid(row.labels)), answer)
        # With puzzle embeddings the rows' ids are the official identifiers, shared across the splits.
        assert set(np.unique(arrays["puzzle_ids"])) == set(seen)
    test_ids = set(dataset.split("test")["puzzle_ids"].tolist())
    assert test_ids <= set(dataset.split("train")["puzzle_ids"].tolist())  # the demonstrations train them


def test_official_arc_names() -> None:
    assert official_puzzle_info("<blank>") is None
    assert official_puzzle_info("007bbfb7") == {"task": "007bbfb7", "transform": ArcTransform().to_json()}
    colors = (0, 3, 1, 2, 4, 5, 6, 7, 8, 9)
    for name in ("007bbfb7|||t7|||0312456789", "007bbfb7_t7_0312456789"):
        assert official_puzzle_info(name) == {
            "task": "007bbfb7",
            "transform": ArcTransform(6, colors).to_json(),
        }
    with pytest.raises(UsageError, match="not a permutation keeping 0"):
        official_puzzle_info("007bbfb7|||t1|||1032456789")


def test_maze_rows_are_the_source_mazes_and_their_shortest_paths(tmp_path) -> None:
    write_official_maze(tmp_path / "maze")
    task = get_task("maze", size=7, data=str(tmp_path / "maze"))
    rows = list(task.official_dataset().splits["train"].rows())
    assert [r.group for r in rows] == [0] * 8 + [1] * 8
    for (question, answer), original in zip(MAZE_TRAIN, rows[::8], strict=True):
        assert (task.decode(original.inputs) == task.parse("\n".join(question))).all()
        assert (task.decode(original.labels) == task.parse_answer("\n".join(answer))).all()
    for row in rows:  # every dihedral copy's label is a shortest path of its maze
        assert task.verify(task.decode(row.inputs), task.decode(row.labels))
    assert len(list(task.examples("test"))) == 2


def test_an_official_arc_folder_converts_with_its_copies_and_augmentations(arc_folder, tmp_path) -> None:
    task = get_task("arc-agi-1", data=str(arc_folder))
    metadata = build_dataset(task, tmp_path / "converted")
    converted = load_dataset(tmp_path / "converted")
    official = task.official_dataset().puzzle_dataset()
    for split in ("train", "test"):
        mine, theirs = converted.split(split), official.split(split)
        assert (mine["inputs"] == theirs["inputs"]).all() and (mine["labels"] == theirs["labels"]).all()
    # The same augmentation per puzzle, under latentloop's own puzzle ids.
    by_official = {
        (info["task"], json.dumps(info["transform"])): pid
        for pid, info in official.metadata["puzzles"].items()
    }
    assert len(metadata["puzzles"]) == len(by_official) == 9
    for info in metadata["puzzles"].values():
        assert (info["task"], json.dumps(info["transform"])) in by_official


# -- training and evaluating through the command line ------------------------------------------------------


def train_args(config: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--config", str(config), f"task.data={data}", *extra, "--out", str(out), "--json", "-q"]


def test_train_and_eval_sudoku_on_an_official_folder(sudoku_folder, tmp_path, capsys) -> None:
    config = config_file(tmp_path, arch="trm", task="sudoku", train={"steps": 2})
    out = tmp_path / "run"
    assert main(train_args(config, sudoku_folder, out)) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["step"] == 2 and result["examples_seen"] == 2 * 8
    assert result["last_eval"]["step"] == 2  # evaluated on the official test split at the end
    assert main(["eval", str(out), "--samples", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["task"] == "sudoku" and report["puzzles"] == 3  # the official test split's puzzles
    test_inputs = np.load(sudoku_folder / "test" / "all__inputs.npy")
    assert [e["puzzle"] for e in sorted(report["examples"], key=lambda e: e["index"])] == test_inputs.tolist()


def test_train_and_eval_arc_on_an_official_folder(arc_folder, tmp_path, capsys) -> None:
    config = config_file(tmp_path, arch="trm", task="arc-agi-1", train={"steps": 2, "eval_size": 2})
    out = tmp_path / "run"
    assert main(train_args(config, arc_folder, out)) == 0
    assert json.loads(capsys.readouterr().out)["step"] == 2
    saved = json.loads((out / "checkpoints" / "step_00000002" / "config.json").read_text())
    assert saved["puzzles"] == 10  # an embedding per official identifier: the blank and 3 tasks x 3 copies
    assert main(["eval", str(out), "--samples", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    # One test input of the evaluation task, solved in each of its 3 copies and voted on after inverting them.
    assert report["metric"] == "pass@2" and report["puzzles"] == 1 and report["copies"] == 3


def test_train_and_eval_maze_on_an_official_folder(tmp_path, capsys) -> None:
    write_official_maze(tmp_path / "maze")
    config = config_file(tmp_path, arch="trm", task="maze", train={"steps": 2})
    out = tmp_path / "run"
    assert main(train_args(config, tmp_path / "maze", out, "task.size=7")) == 0
    assert json.loads(capsys.readouterr().out)["step"] == 2
    assert main(["eval", str(out), "--samples", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["task"] == "maze" and report["puzzles"] == 2


# -- malformed folders ---------------------------------------------------------------------------------------


def _edit_json(file: Path, **changes) -> None:
    data = json.loads(file.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    file.write_text(json.dumps(data))


def _save(file: Path, array) -> None:
    np.save(file, np.asarray(array))


MALFORMED = {
    "missing dataset.json": (
        lambda r: (r / "test" / "dataset.json").unlink(),
        "test/dataset.json is missing",
    ),
    "missing array": (
        lambda r: (r / "train" / "all__labels.npy").unlink(),
        "train/all__labels.npy is missing",
    ),
    "missing field": (
        lambda r: _edit_json(r / "train" / "dataset.json", vocab_size=None),
        "train/dataset.json has no field 'vocab_size'",
    ),
    "labels shorter than inputs": (
        lambda r: _save(r / "train" / "all__labels.npy", np.load(r / "train" / "all__labels.npy")[:-1]),
        "train/all__labels.npy has shape (7, 81), all__inputs.npy has (8, 81)",
    ),
    "seq_len disagrees with the arrays": (
        lambda r: _edit_json(r / "test" / "dataset.json", seq_len=80),
        "test/all__inputs.npy rows hold 81 tokens",
    ),
    "puzzle indices not monotone": (
        lambda r: _save(
            r / "train" / "all__puzzle_indices.npy", np.array([0, 2, 1, 3, 4, 5, 6, 7, 8], np.int32)
        ),
        "train/all__puzzle_indices.npy is not monotone",
    ),
    "puzzle indices short of the examples": (
        lambda r: _save(r / "test" / "all__puzzle_indices.npy", np.array([0, 1, 2, 2], np.int32)),
        "test/all__puzzle_indices.npy ends at 2, but the split has 3 examples",
    ),
    "an identifier per puzzle": (
        lambda r: _save(r / "test" / "all__puzzle_identifiers.npy", np.zeros(2, np.int32)),
        "test/all__puzzle_indices.npy has 4 entries, all__puzzle_identifiers.npy names 2 puzzles",
    ),
    "group indices past the puzzles": (
        lambda r: _save(r / "train" / "all__group_indices.npy", np.array([0, 2, 4, 9], np.int32)),
        "train/all__group_indices.npy ends at 9, but the split has 8 puzzles",
    ),
    "total_groups disagrees": (
        lambda r: _edit_json(r / "train" / "dataset.json", total_groups=5),
        "train/dataset.json says total_groups 5, all__group_indices.npy holds 4 groups",
    ),
    "identifier out of range": (
        lambda r: _save(r / "test" / "all__puzzle_identifiers.npy", np.array([0, 1, 0], np.int32)),
        "holds identifiers 0..1",
    ),
    "tokens that are not integers": (
        lambda r: _save(
            r / "test" / "all__inputs.npy", np.load(r / "test" / "all__inputs.npy").astype(np.float32)
        ),
        "test/all__inputs.npy holds float32 values, not integers",
    ),
    "another task's folder": (
        lambda r: [_edit_json(r / s / "dataset.json", vocab_size=6) for s in ("train", "test")],
        "task 'sudoku' has 81 tokens over 11",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_folder_gets_one_line_and_exit_2(case, sudoku_folder, tmp_path, capsys) -> None:
    damage, message = MALFORMED[case]
    damage(sudoku_folder)
    config = config_file(tmp_path, arch="trm", task="sudoku")
    assert main(train_args(config, sudoku_folder, tmp_path / "run")) == 2
    assert message in error_line(capsys)


def test_an_arc_folder_without_identifiers_gets_one_line(arc_folder, tmp_path, capsys) -> None:
    (arc_folder / "identifiers.json").unlink()
    config = config_file(tmp_path, arch="trm", task="arc-agi-1")
    assert main(train_args(config, arc_folder, tmp_path / "run")) == 2
    assert "identifiers.json is missing" in error_line(capsys)


def test_options_that_do_not_apply_to_an_official_folder(sudoku_folder, arc_folder) -> None:
    for options in ({"tier": "easy"}, {"min_rating": 0}, {"augment": 2}, {"unconditional": True}):
        with pytest.raises(UsageError, match="does not apply to an official dataset folder"):
            get_task("sudoku", data=str(sudoku_folder), **options)
    with pytest.raises(UsageError, match="does not apply to an official dataset folder"):
        get_task("arc-agi-1", data=str(arc_folder), augment=3)
    with pytest.raises(UsageError, match=r"train\.data cannot be given too"):
        config = build_reasoner_config(
            tiny_run(TINY_REASONER, arch="trm", task="sudoku"),
            [f"task.data={sudoku_folder}", f"train.data={sudoku_folder}"],
        )
        task_data(config, get_task("sudoku", data=str(sudoku_folder)), sudoku_folder)
    with pytest.raises(UsageError, match="latentloop dataset folder, not an official one"):
        (arc_folder / "metadata.json").write_text("{}")
        open_official(arc_folder, task="arc-agi-1", seq_len=900, vocab_size=12)
