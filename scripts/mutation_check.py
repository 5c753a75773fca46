"""Mutation check: plant known faults in a copy of the source and make sure the tests that cover them fail.

Each fault is an exact edit of one file under ``src/latentloop``: an old text that must occur exactly once,
its replacement, and the test files or node ids expected to catch it. For every fault, in turn, ``src/`` is
copied to a temporary folder, the edit is applied there (never in the repository), and the covering tests
run with ``PYTHONPATH`` pointing at the copy. A fault is caught when pytest fails; it survived when the tests
still pass, which means the suite no longer checks what the fault breaks.

Before any fault, the unmodified copy runs the union of the covering tests: a fault "caught" by tests that
already fail proves nothing, so a red baseline stops the check.

Exit status: 0 every fault caught, 1 some fault survived, 2 the list or the baseline is broken (an old text
not found exactly once, an edit that does not compile, the copy not being what gets imported, a failing
baseline).

    python scripts/mutation_check.py                 # every fault
    python scripts/mutation_check.py --list          # names, files and covering tests
    python scripts/mutation_check.py --only seed-ignored --only heldout-leak --jobs 2
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "src"
PACKAGE = "latentloop"
PYTEST_FLAGS = ("-x", "-q", "-p", "no:cacheprovider")

VERIFIERS = "tests/tasks/test_verifiers.py"
BY_VALUE = "tests/eval/test_metrics_by_value.py"
EXIT = "tests/models/test_exit_criteria.py"
PAIRWISE_EXIT = f"{EXIT}::test_pairwise_check_compares_the_hand_value_with_the_threshold"


@dataclass(frozen=True)
class Fault:
    """A planted fault: ``old`` (found exactly once in ``path``) becomes ``new``; ``tests`` must catch it."""

    name: str
    path: str  # relative to src/latentloop
    old: str
    new: str
    tests: tuple[str, ...]  # test files or node ids, relative to the repository root
    description: str


FAULTS: tuple[Fault, ...] = (
    Fault(
        "nqueens-diagonals-off",
        "tasks/nqueens.py",
        "for key in (rows, cols, rows - cols, rows + cols):",
        "for key in (rows, cols):",
        (f"{VERIFIERS}::test_nqueens_refuses_a_diagonal_attack_between_distinct_rows_and_columns",),
        "attacking_pairs counts rows and columns only, no diagonals",
    ),
    Fault(
        "sudoku-boxes-off",
        "tasks/sudoku/solver.py",
        "for cells in geo.units:",
        "for cells in geo.units[: 2 * geo.n]:",
        (f"{VERIFIERS}::test_sudoku_refuses_a_latin_square_whose_boxes_repeat_digits",),
        "count_violations checks rows and columns, not boxes",
    ),
    Fault(
        "coloring-conflicts-off",
        "tasks/graph_coloring.py",
        "return conflicts(puzzle, answer) + invalid",
        "return invalid",
        (f"{VERIFIERS}::test_coloring_counts_each_conflicting_edge",),
        "graph colouring's violations leave out the edges whose ends share a colour",
    ),
    Fault(
        "coverage-any-valid",
        "eval/metrics.py",
        "curve.append(float(np.mean(np.array(found) / totals)))",
        "curve.append(float(np.mean(np.array(found) > 0)))",
        (f"{BY_VALUE}::test_coverage_counts_distinct_valid_answers_over_all_completions",),
        "coverage becomes the share of puzzles with any valid answer",
    ),
    Fault(
        "coverage-samples-ignored",
        "eval/metrics.py",
        "found = [len({key_ids[j, b] for j in range(k) if valid[j, b]}) for b in range(count)]",
        "found = [len({key_ids[j, b] for j in range(samples) if valid[j, b]}) for b in range(count)]",
        (f"{BY_VALUE}::test_coverage_counts_distinct_valid_answers_over_all_completions",),
        "the coverage curve counts every sample at every point",
    ),
    Fault(
        "selection-ignored",
        "eval/metrics.py",
        "select_sample(key_ids[:, b].tolist(), values[:, b].tolist(), mode)",
        "0",
        (f"{BY_VALUE}::test_each_selection_rule_gives_its_own_accuracy",),
        "evaluation's accuracy always judges the first sample, whatever the selection rule",
    ),
    Fault(
        "select-sample-first",
        "infer/scaling.py",
        'if mode == "first":',
        "if True:",
        ("tests/infer/test_scaling.py::test_vote_selects_the_most_frequent_answer",),
        "select_sample always picks sample 0",
    ),
    Fault(
        "samples-ignored",
        "eval/reasoners.py",
        "chosen = chosen_samples(key_ids[s, :k], scores[s, :k], mode)",
        "chosen = chosen_samples(key_ids[s], scores[s], mode)",
        (f"{BY_VALUE}::test_accuracy_by_number_of_samples",),
        "accuracy by number of samples always selects among all samples",
    ),
    Fault(
        "exit-kl-off",
        "models/exit_criteria.py",
        "return (current.exp() * (current - previous)).sum(-1)",
        'return (current.exp() * (current - previous)).sum(-1) + float("inf")',
        (f"{PAIRWISE_EXIT}[kl]",),
        "the kl exit criterion never fires",
    ),
    Fault(
        "exit-entropy-off",
        "models/exit_criteria.py",
        "(previous.exp() * previous).sum(-1)).abs()",
        '(previous.exp() * previous).sum(-1)).abs() + float("inf")',
        (f"{PAIRWISE_EXIT}[entropy-diff]",),
        "the entropy-diff exit criterion never fires",
    ),
    Fault(
        "exit-cosine-off",
        "models/exit_criteria.py",
        "return 1 - F.cosine_similarity(current, previous, dim=-1)",
        'return 1 - F.cosine_similarity(current, previous, dim=-1) + float("inf")',
        (f"{PAIRWISE_EXIT}[cosine]",),
        "the cosine exit criterion never fires",
    ),
    Fault(
        "exit-latent-diff-off",
        "models/exit_criteria.py",
        "return (current - previous).norm(dim=-1) / current.norm(dim=-1).clamp_min(1e-12)",
        'return (current - previous).norm(dim=-1) / current.norm(dim=-1).clamp_min(1e-12) + float("inf")',
        (f"{PAIRWISE_EXIT}[latent-diff]",),
        "the latent-diff exit criterion never fires",
    ),
    Fault(
        "exit-argmax-off",
        "models/exit_criteria.py",
        "return self.stable >= self.threshold",
        "return self.stable < 0",
        (f"{EXIT}::test_argmax_stability_counts_unchanged_argmaxes_in_a_row",),
        "the argmax-stability exit criterion never fires",
    ),
    Fault(
        "halting-freeze-off",
        "infer/scaling.py",
        "tokens = torch.where(done[:, None], preds[-1], tokens)",
        "tokens = tokens",
        ("tests/train/test_halting.py::test_solve_halts_by_the_models_rule",),
        "a halted sample's answer keeps changing with later steps",
    ),
    Fault(
        "halting-values-unfrozen",
        "infer/scaling.py",
        "value = torch.where(done, values[-1], value)",
        "value = value",
        ("tests/train/test_halting.py::test_solve_halts_by_the_models_rule",),
        "a halted sample's value keeps changing with later steps",
    ),
    Fault(
        "seed-ignored",
        "eval/reasoners.py",
        "dataset = run_dataset(run, folder)\n        torch.manual_seed(seed)",
        "dataset = run_dataset(run, folder)\n        torch.manual_seed(0)",
        (
            "tests/eval/test_reasoners.py"
            "::test_evaluation_is_reproducible_from_its_seed_and_keeps_the_callers_rng",
        ),
        "evaluate_reasoner seeds its sampling noise with 0, whatever its seed",
    ),
    Fault(
        "solve-unseeded",
        "infer/solve.py",
        "torch.manual_seed(seed)  # after building the model",
        "pass  # after building the model",
        ("tests/test_pretrained.py::test_solving_with_a_model_is_seeded",),
        "solving with a model draws its sampling noise from whatever the RNG held",
    ),
    Fault(
        "kl-balance-swapped",
        "models/reasoners/gram.py",
        "kl = (alpha * to_prior + (1 - alpha) * to_posterior).sum(-1)",
        "kl = ((1 - alpha) * to_prior + alpha * to_posterior).sum(-1)",
        (
            "tests/models/reasoners/test_gram_kl.py"
            "::test_kl_balance_splits_the_gradient_between_prior_and_posterior",
        ),
        "balanced_kl weighs the prior's pull with 1 - alpha and the posterior's with alpha",
    ),
    Fault(
        "kl-balance-not-from-config",
        "models/reasoners/gram.py",
        "kl = balanced_kl(mu, std, mu_p, std_p, self.config.kl_balance, self.config.kl_reduce)",
        "kl = balanced_kl(mu, std, mu_p, std_p, 0.8, self.config.kl_reduce)",
        ("tests/models/reasoners/test_gram_kl.py::test_the_model_balances_its_kl_by_its_config",),
        "GRAM balances its KL with the default 0.8 instead of its config's kl_balance",
    ),
    Fault(
        "heldout-leak",
        "tasks/text.py",
        "starts = rng.integers(0, self.split_at - self.seq_len, size=batch_size)",
        "starts = rng.integers(0, len(self.stream) - self.seq_len, size=batch_size)",
        ("tests/tasks/test_text.py::test_heldout_is_the_last_five_percent_and_training_never_reads_it",),
        "training windows start anywhere in the stream, held-out tail included",
    ),
    Fault(
        "heldout-leak-by-one",
        "tasks/text.py",
        "starts = rng.integers(0, self.split_at - self.seq_len, size=batch_size)",
        "starts = rng.integers(0, self.split_at - self.seq_len + 1, size=batch_size)",
        ("tests/tasks/test_text.py::test_heldout_is_the_last_five_percent_and_training_never_reads_it",),
        "the last training window may read the first held-out token",
    ),
    Fault(
        "unscored-labels-scored",
        "train/deep_supervision.py",
        "mask = labels != IGNORE_LABEL",
        "mask = torch.ones_like(labels, dtype=torch.bool)",
        ("tests/data/test_labels.py::test_the_loss_is_the_mean_over_scored_positions_only",),
        "the supervision loss averages over unscored positions too",
    ),
    Fault(
        "compile-threads-ignored",
        "train/precision.py",
        "config.cpp.threads = kernel_threads or -1",
        "config.cpp.threads = -1",
        ("tests/train/test_precision.py",),
        "train.compile_threads=1 leaves each compiled kernel on every thread, so a run rounds by its thread count",
    ),
    Fault(
        "products-round-by-thread-count",
        "__init__.py",
        'os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")',
        "pass",
        ("tests/train/test_precision.py",),
        "MKL's strict reproducibility is not set, so a matrix product rounds by the thread count",
    ),
)


@dataclass(frozen=True)
class Outcome:
    """The result of one test run: pytest's exit code, its wall time and its output."""

    returncode: int
    seconds: float
    output: str

    @property
    def failed_test(self) -> str:
        """The first test pytest reported as failed or in error ('' when none is named)."""
        for line in self.output.splitlines():
            if line.startswith(("FAILED ", "ERROR ")):
                return line.split(" ", 1)[1].split(" - ", 1)[0]
        return ""


class ListError(Exception):
    """The fault list does not fit the current source, or the check cannot trust its copy."""


def source_file(fault: Fault, source: Path = SOURCE) -> Path:
    """The file that ``fault`` edits, under ``source`` (a ``src`` folder)."""
    return source / PACKAGE / fault.path


def mutated_text(fault: Fault, source: Path = SOURCE) -> str:
    """The text of ``fault``'s file with the fault applied; :class:`ListError` when the old text does not
    occur exactly once, the edit changes nothing, or the result is not valid Python."""
    path = source_file(fault, source)
    if not path.is_file():
        raise ListError(f"{fault.name}: {path} does not exist")
    text = path.read_text(encoding="utf-8")
    count = text.count(fault.old)
    if count != 1:
        raise ListError(
            f"{fault.name}: the old text occurs {count} times in {path} (expected once): {fault.old!r}"
        )
    if fault.old == fault.new:
        raise ListError(f"{fault.name}: the replacement equals the old text")
    mutated = text.replace(fault.old, fault.new)
    try:
        compile(mutated, str(path), "exec")
    except SyntaxError as error:
        raise ListError(f"{fault.name}: the edited {fault.path} does not compile: {error}") from None
    return mutated


def validate(faults: Sequence[Fault], source: Path = SOURCE) -> None:
    """Raise :class:`ListError` unless names are unique, every fault names covering tests that exist and
    every edit applies (see :func:`mutated_text`)."""
    names = [f.name for f in faults]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ListError(f"fault names used twice: {', '.join(duplicates)}")
    for fault in faults:
        if not fault.tests:
            raise ListError(f"{fault.name}: no covering tests")
        for test in fault.tests:
            if not (ROOT / test.split("::", 1)[0]).is_file():
                raise ListError(f"{fault.name}: test file of {test!r} does not exist")
        mutated_text(fault, source)


def copy_source(dest: Path) -> Path:
    """Copy ``src/`` to ``dest/src`` (numba caches included, bytecode left out) and return the copy."""
    target = dest / "src"
    shutil.copytree(SOURCE, target, ignore=shutil.ignore_patterns("*.pyc", "*.egg-info"))
    return target


def apply(fault: Fault, copy: Path) -> None:
    """Write ``fault`` into the copied source folder ``copy`` (the edit is checked against the copy)."""
    source_file(fault, copy).write_text(mutated_text(fault, copy), encoding="utf-8")


def environment(copy: Path, scratch: Path) -> dict[str, str]:
    """The environment of a test run against ``copy``: it comes first on ``PYTHONPATH`` (ahead of the
    editable install), and Hypothesis keeps its example database in ``scratch``, not in the repository."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(copy), *filter(None, [env.get("PYTHONPATH")])])
    env["HYPOTHESIS_STORAGE_DIRECTORY"] = str(scratch / "hypothesis")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def imported_from(copy: Path, scratch: Path) -> Path:
    """Where ``import latentloop`` finds the package in a test run's environment."""
    done = subprocess.run(
        [sys.executable, "-c", f"import {PACKAGE}; print({PACKAGE}.__file__)"],
        cwd=ROOT,
        env=environment(copy, scratch),
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise ListError(f"importing {PACKAGE} from the copy failed:\n{done.stderr}")
    return Path(done.stdout.strip()).resolve()


def run_tests(copy: Path, scratch: Path, tests: Iterable[str]) -> Outcome:
    """Run pytest on ``tests`` against the source folder ``copy``."""
    command = [
        sys.executable,
        "-m",
        "pytest",
        *PYTEST_FLAGS,
        f"--basetemp={scratch / 'pytest'}",
        *tests,
    ]
    start = time.perf_counter()
    done = subprocess.run(
        command, cwd=ROOT, env=environment(copy, scratch), capture_output=True, text=True, check=False
    )
    return Outcome(done.returncode, time.perf_counter() - start, done.stdout + done.stderr)


def covering_tests(faults: Sequence[Fault]) -> list[str]:
    """The union of the faults' covering tests, in first-seen order."""
    return list(dict.fromkeys(test for fault in faults for test in fault.tests))


def baseline(faults: Sequence[Fault]) -> Outcome:
    """Run the union of the covering tests on an unmodified copy, after checking the copy is what gets
    imported; :class:`ListError` when it is not."""
    with tempfile.TemporaryDirectory(prefix="mutation-baseline-") as tmp:
        scratch = Path(tmp)
        copy = copy_source(scratch)
        found = imported_from(copy, scratch)
        if not found.is_relative_to(copy.resolve()):
            raise ListError(f"the test runs import {PACKAGE} from {found}, not from the copy in {copy}")
        return run_tests(copy, scratch, covering_tests(faults))


def try_fault(fault: Fault) -> Outcome:
    """Run ``fault``'s covering tests against a copy of the source with the fault applied."""
    with tempfile.TemporaryDirectory(prefix=f"mutation-{fault.name}-") as tmp:
        scratch = Path(tmp)
        copy = copy_source(scratch)
        apply(fault, copy)
        return run_tests(copy, scratch, fault.tests)


def select(names: Sequence[str] | None) -> list[Fault]:
    """The faults named in ``names`` (every fault when None), in list order; :class:`ListError` for an
    unknown name."""
    if not names:
        return list(FAULTS)
    known = {f.name for f in FAULTS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ListError(f"unknown fault {', '.join(unknown)} (see --list)")
    return [f for f in FAULTS if f.name in set(names)]


def tail(text: str, lines: int = 40) -> str:
    """The last ``lines`` lines of ``text``."""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line's options (``--only``, ``--list``, ``--jobs``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", metavar="NAME", help="check this fault only (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the faults and exit")
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="faults checked at once (default 1)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the check; the exit status is described in the module docstring."""
    args = parse_args(argv)
    try:
        faults = select(args.only)
        validate(FAULTS)
    except ListError as error:
        print(f"mutation check: {error}", file=sys.stderr)
        return 2
    if args.list:
        for fault in faults:
            print(f"{fault.name}  src/{PACKAGE}/{fault.path}: {fault.description}")
            for test in fault.tests:
                print(f"    {test}")
        return 0
    started = time.perf_counter()
    try:
        base = baseline(faults)
    except ListError as error:
        print(f"mutation check: {error}", file=sys.stderr)
        return 2
    if base.returncode != 0:
        print(
            f"mutation check: the unmodified source fails its covering tests (pytest exit {base.returncode})"
        )
        print(tail(base.output))
        return 2
    print(f"baseline  passed  {base.seconds:.1f}s")
    width = max(len(f.name) for f in faults)
    survived = []
    try:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for fault, outcome in zip(faults, pool.map(try_fault, faults), strict=True):
                caught = outcome.returncode != 0
                if not caught:
                    survived.append(fault.name)
                by = f"  by {outcome.failed_test}" if caught and outcome.failed_test else ""
                verdict = "caught" if caught else "SURVIVED"
                print(f"{fault.name:<{width}}  {verdict}  {outcome.seconds:.1f}s{by}", flush=True)
    except ListError as error:  # the source changed while the check ran
        print(f"mutation check: {error}", file=sys.stderr)
        return 2
    total = time.perf_counter() - started
    print(f"{len(faults) - len(survived)}/{len(faults)} faults caught in {total:.0f}s")
    if survived:
        print(f"survived: {', '.join(survived)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
