"""Unconditional generation: samples of a reasoner from its task's blank puzzle, and scores for digits.

:func:`sample_run` (``latentloop sample``) draws ``n`` answers to the all-unknown puzzle through
:func:`~latentloop.infer.scaling.solve` and judges them by the task's verifier (for Sudoku: valid complete
boards). Digits samples are also drawn as a PNG grid and scored with an Inception-Score-like figure and a
Fréchet distance. Both come from one small classifier (scikit-learn's ``MLPClassifier``, two hidden layers)
trained on the task's real binarised training digits and their labels, in the manner of the Inception Score
and FID of image models, which use an ImageNet network instead:

- ``inception_score``: ``exp(E_x KL(p(y|x) || p(y)))`` with ``p(y)`` the mean prediction over the set; from 1
  (every image looks alike or is unrecognisable) up to the number of classes (every image is a confident
  digit and the classes are used equally).
- ``frechet_distance``: ``|μ_s - μ_r|² + Tr(Σ_s + Σ_r - 2 (Σ_s Σ_r)^½)`` between Gaussian fits of the
  classifier's penultimate-layer features of the samples and of real held-out digits.

The held-out (test) split is cut in two fixed halves: the *statistics* half gives the real Gaussian of the
Fréchet distance, the *reference* half gives real digits scored exactly as samples are
(:func:`reference_scores`), so a model's figures can be read against those of real data of the same count
(both figures depend on the number of images). The classifier's accuracy is measured on the whole test split.
"""

from __future__ import annotations

import functools
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPClassifier

from latentloop.errors import UsageError
from latentloop.infer.runs import load_run
from latentloop.infer.scaling import draws_samples, solve
from latentloop.models.reasoners import Reasoner, num_parameters
from latentloop.plotting import pyplot, save_png
from latentloop.tasks.base import Task
from latentloop.tasks.digits import DigitsTask
from latentloop.train.run_config import load_reasoner_run_config

HIDDEN = (128, 32)  # the penultimate layer (32 features) stays small enough to fit from ~100 images
MAX_TRAIN = 10_000  # a seeded subset of larger sources (MNIST: 60,000) bounds the fit's time


@dataclass(frozen=True)
class DigitClassifier:
    """A trained classifier with the real-data statistics that samples are compared against."""

    model: Any  # sklearn.neural_network.MLPClassifier
    test_accuracy: float
    classes: int
    real_mean: np.ndarray  # Gaussian fit of the penultimate features of the statistics half of the test split
    real_cov: np.ndarray
    reference: np.ndarray  # the other half: real held-out images [N, H, W] in 0/1

    def features(self, images: np.ndarray) -> np.ndarray:
        """Penultimate-layer (last hidden, ReLU) activations ``[N, 32]`` of ``images`` ``[N, H, W]``."""
        return _penultimate(self.model, images)

    def probabilities(self, images: np.ndarray) -> np.ndarray:
        """Class probabilities ``p(y|x)`` ``[N, classes]``."""
        return self.model.predict_proba(as_inputs(images))


def as_inputs(images: np.ndarray) -> np.ndarray:
    """Flat float inputs: ink (1) is 1, everything else 0, so an unknown pixel (-1) left in a sample reads as
    background rather than as negative ink the classifier never saw."""
    images = np.asarray(images)
    return (images.reshape(len(images), -1) == 1).astype(np.float64)


def _penultimate(model: Any, images: np.ndarray) -> np.ndarray:
    # MLPClassifier has no transform(); its hidden layers are ReLU(x W + b), applied here by hand.
    hidden = as_inputs(images)
    for weight, bias in zip(model.coefs_[:-1], model.intercepts_[:-1], strict=True):
        hidden = np.maximum(hidden @ weight + bias, 0.0)
    return hidden


def _labelled(task: Task, split: str, split_seed: int) -> tuple[np.ndarray, np.ndarray]:
    images, labels = task.images(split, split_seed)
    if len(labels) == 0 or np.any(np.asarray(labels) < 0):
        raise UsageError("the digits source has no labels, so its samples cannot be scored by a classifier")
    return images, np.asarray(labels)


@functools.lru_cache(maxsize=4)
def _train_classifier(path: str | None, threshold: float, seed: int, split_seed: int) -> DigitClassifier:
    task = DigitsTask(path=path, threshold=threshold)
    train_x, train_y = _labelled(task, "train", split_seed)
    test_x, test_y = _labelled(task, "test", split_seed)
    rng = np.random.default_rng(seed)
    if len(train_x) > MAX_TRAIN:
        keep = np.sort(rng.choice(len(train_x), MAX_TRAIN, replace=False))
        train_x, train_y = train_x[keep], train_y[keep]
    model = MLPClassifier(HIDDEN, alpha=1e-3, max_iter=500, random_state=seed)
    with warnings.catch_warnings():  # a figure for comparison, not a model to tune: a cap on epochs is fine
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(as_inputs(train_x), train_y)
    accuracy = float(np.mean(model.predict(as_inputs(test_x)) == test_y))
    order = rng.permutation(len(test_x))
    half = len(test_x) // 2
    stats, reference = test_x[order[:half]], test_x[order[half:]]
    mean, cov = gaussian_fit(_penultimate(model, stats))
    return DigitClassifier(model, accuracy, len(model.classes_), mean, cov, reference)


def digit_classifier(task: Task, seed: int = 0, split_seed: int = 0) -> DigitClassifier:
    """The classifier of ``task`` (a :class:`~latentloop.tasks.digits.DigitsTask`), trained once per process
    and per seed (deterministic: the same seed gives the same weights and halves). ``split_seed`` is the
    seed of the task's train/test split, the ``train.seed`` of the run whose samples are scored, so that
    the held-out digits are ones its model never saw."""
    if not task.image_answers:
        raise UsageError(f"generation scores are defined for the digits task, not {task.name!r}")
    return _train_classifier(task.path, float(task.threshold), int(seed), int(split_seed))


# The figures ---------------------------------------------------------------------------------------------------
def inception_score(probs: np.ndarray) -> float:
    """``exp(mean_x KL(p(y|x) || p(y)))`` for predictions ``probs`` ``[N, classes]``, ``p(y)`` their mean."""
    probs = np.clip(np.asarray(probs, dtype=np.float64), 1e-12, 1.0)
    marginal = probs.mean(axis=0, keepdims=True)
    kl = (probs * (np.log(probs) - np.log(marginal))).sum(axis=1)
    return float(np.exp(max(kl.mean(), 0.0)))  # the mean KL is >= 0; rounding must not give IS < 1


def gaussian_fit(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean ``[D]`` and covariance ``[D, D]`` (unbiased) of ``features`` ``[N, D]``, ``N >= 2``."""
    features = np.asarray(features, dtype=np.float64)
    if len(features) < 2:
        raise ValueError("a covariance needs at least 2 feature vectors")
    return features.mean(axis=0), np.cov(features, rowvar=False)


def _psd_sqrt(matrix: np.ndarray) -> np.ndarray:
    values, vectors = np.linalg.eigh((matrix + matrix.T) / 2)
    return (vectors * np.sqrt(np.clip(values, 0.0, None))) @ vectors.T


def frechet_distance(mean_a: np.ndarray, cov_a: np.ndarray, mean_b: np.ndarray, cov_b: np.ndarray) -> float:
    """Fréchet distance between ``N(mean_a, cov_a)`` and ``N(mean_b, cov_b)``.

    ``Tr((Σ_a Σ_b)^½)`` is computed as ``Σ sqrt(eig(Σ_a^½ Σ_b Σ_a^½))``, a symmetric PSD matrix with the same
    eigenvalues as ``Σ_a Σ_b``: covariances fitted from fewer images than feature dimensions are singular,
    and ``scipy.linalg.sqrtm`` of the non-symmetric product then returns complex or inaccurate roots.
    """
    root_a = _psd_sqrt(np.asarray(cov_a, dtype=np.float64))
    middle = root_a @ np.asarray(cov_b, dtype=np.float64) @ root_a
    trace_root = np.sqrt(np.clip(np.linalg.eigvalsh((middle + middle.T) / 2), 0.0, None)).sum()
    diff = np.asarray(mean_a, dtype=np.float64) - np.asarray(mean_b, dtype=np.float64)
    distance = diff @ diff + np.trace(cov_a) + np.trace(cov_b) - 2.0 * trace_root
    return float(max(distance, 0.0))  # rounding can leave -1e-12 for identical Gaussians


def score_digits(task: Any, images: np.ndarray, seed: int = 0, split_seed: int = 0) -> dict[str, Any]:
    """``{"inception_score", "frechet_distance", "classifier_test_accuracy", "images"}`` of ``images``
    ``[N, H, W]`` (1 ink; 0 or -1 background) against the real held-out digits of ``task``. ``seed`` seeds
    the classifier, ``split_seed`` is the task's split (see :func:`digit_classifier`). The Fréchet
    distance is ``None`` for fewer than 2 images (no covariance)."""
    images = np.asarray(images)
    if images.ndim != 3 or images.shape[1:] != tuple(task.shape):
        raise UsageError(f"expected images [N, {task.shape[0]}, {task.shape[1]}], got {list(images.shape)}")
    if len(images) == 0:
        raise UsageError("no images to score")
    classifier = digit_classifier(task, seed, split_seed)
    distance = None
    if len(images) >= 2:
        mean, cov = gaussian_fit(classifier.features(images))
        distance = frechet_distance(mean, cov, classifier.real_mean, classifier.real_cov)
    return {
        "images": len(images),
        "inception_score": inception_score(classifier.probabilities(images)),
        "frechet_distance": distance,
        "classifier_test_accuracy": classifier.test_accuracy,
    }


def reference_scores(task: Any, n: int | None = None, seed: int = 0, split_seed: int = 0) -> dict[str, Any]:
    """:func:`score_digits` of the first ``n`` real held-out digits of the reference half (all when ``n`` is
    None or larger): the figures a perfect generator would get with that many samples."""
    reference = digit_classifier(task, seed, split_seed).reference
    return score_digits(task, reference[: n if n is not None else len(reference)], seed, split_seed)


# Sampling ------------------------------------------------------------------------------------------------------
@torch.no_grad()
def sample_blanks(
    model: Reasoner,
    task: Task,
    n: int,
    steps: int | None = None,
    temperature: float = 1.0,
    batch_size: int = 256,
) -> tuple[np.ndarray, int, float]:
    """``n`` answers to the task's blank puzzle: ``(tokens [n, L], steps run, seconds spent sampling)``.

    Every sample goes through :func:`~latentloop.infer.scaling.solve` as one of its K parallel samples of the
    blank puzzle (at most ``batch_size`` per call), so GRAM draws fresh prior noise per sample (its scale
    times ``temperature``), AR and MDLM sample at ``temperature``, and ``steps`` means what it means for
    ``solve`` (supervision steps, MDLM's unmasking steps). Randomness comes from torch's global RNG: seed it
    for repeatable samples.
    """
    if n < 1:
        raise UsageError(f"--n must be at least 1, got {n}")
    if batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {batch_size}")
    if not task.has_blank:
        raise UsageError(f"task {task.name!r} has no blank puzzle to sample from (try digits or sudoku)")
    device = next(model.parameters()).device
    blank = torch.from_numpy(np.asarray(task.encode(task.blank()), dtype=np.int64))[None].to(device)
    chunks, steps_run = [], 0
    start = time.perf_counter()
    for done in range(0, n, batch_size):
        result = solve(model, blank, steps=steps, samples=min(batch_size, n - done), temperature=temperature)
        chunks.append(result.predictions[-1, :, 0].cpu().numpy())  # [K, L]: every sample's final answer
        steps_run = result.predictions.shape[0]
    elapsed = time.perf_counter() - start
    return np.concatenate(chunks), steps_run, elapsed


def _split_seed(folder: Path | None) -> int:
    """The ``train.seed`` that split the run's data (0 outside a run folder, the trainer's default)."""
    if folder is None:
        return 0
    return int(load_reasoner_run_config(folder / "config.yaml").train.seed)


def check_png_path(path: str | Path) -> Path:
    """``path`` if a PNG can be written there (its nearest existing ancestor is a writable folder)."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise UsageError(f"--out must name a .png file, got {str(path)!r}")
    if path.is_dir():
        raise UsageError(f"--out {str(path)!r} is a folder; name a .png file")
    existing = path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {str(path)!r}: {str(existing)!r} is not a writable folder")
    return path


def sample_run(
    run: str | Path,
    n: int = 64,
    steps: int | None = None,
    seed: int = 0,
    temperature: float = 1.0,
    batch_size: int = 256,
    out: str | Path | None = None,
    task: str | None = None,
) -> dict[str, Any]:
    """``latentloop sample``: ``n`` unconditional samples of a run's newest checkpoint, judged by the task's
    verifier (the fraction of valid answers: for Sudoku, valid complete boards), and for digits scored
    (:func:`score_digits`, beside :func:`reference_scores` of as many real held-out digits) and drawn as a
    PNG grid at ``out`` (default ``samples.png`` in the run folder). The scores' classifier always has seed
    0, so figures of different sampling ``seed`` values compare."""
    if n < 1:
        raise UsageError(f"--n must be at least 1, got {n}")
    if steps is not None and steps < 1:
        raise UsageError(f"--steps must be at least 1, got {steps}")
    out_path = check_png_path(out) if out is not None else None
    model, the_task, checkpoint, folder = load_run(run, task)
    if not the_task.has_blank:
        raise UsageError(
            f"task {the_task.name!r} has no blank puzzle, so it has no unconditional samples (try digits or sudoku)"
        )
    image = the_task.image_answers
    if out_path is not None and not image:
        raise UsageError(f"--out draws image samples; task {the_task.name!r} has none")
    if image and out_path is None:
        out_path = check_png_path((folder if folder is not None else checkpoint) / "samples.png")
    torch.manual_seed(seed)
    tokens, steps_run, elapsed = sample_blanks(model, the_task, n, steps, temperature, batch_size)
    blank = the_task.blank()
    answers = [the_task.decode_answer(row) for row in tokens]
    valid = sum(int(the_task.violations(blank, answer)) == 0 for answer in answers)
    report: dict[str, Any] = {
        "run": str(run),
        "checkpoint": str(checkpoint),
        "model": model.arch,
        "task": the_task.name,
        "parameters": num_parameters(model),
        "samples": n,
        "steps": steps_run,
        "seed": seed,
        "elapsed_s": round(elapsed, 4),
        "samples_per_s": round(n / max(elapsed, 1e-9), 2),
        "valid": valid,
        "valid_fraction": valid / n,
        "distinct": len({np.asarray(row).tobytes() for row in tokens}),
    }
    if draws_samples(model):  # at a temperature; the deterministic reasoners decode argmax
        report["temperature"] = temperature
    if image:
        images = np.stack(answers)
        split_seed = _split_seed(folder)
        try:
            report["scores"] = score_digits(the_task, images, 0, split_seed)
            report["reference"] = reference_scores(the_task, n, 0, split_seed)
        except UsageError as error:  # an unlabelled MNIST file: the samples are still drawn
            report["scores_skipped"] = str(error)
        title = f"{model.arch}: {n} samples, {steps_run} steps, seed {seed}"
        assert out_path is not None  # an image task always has one (the run folder's by default)
        try:
            plot_samples(images, out_path, title)
        except OSError as error:
            raise UsageError(f"cannot write {str(out_path)!r}: {error.strerror or error}") from None
        report["image"] = str(out_path)
    else:
        report["examples"] = [the_task.format(answer) for answer in answers[:3]]
    return report


# Pictures ------------------------------------------------------------------------------------------------------
def plot_samples(images: np.ndarray, path: str | Path, title: str | None = None) -> None:
    """A PNG grid of ``images`` ``[N, H, W]`` (1 ink black, 0 white, -1 unknown grey), written atomically."""
    plt = pyplot()

    images = np.asarray(images)
    count, height, width = images.shape
    cols = int(np.ceil(np.sqrt(count)))
    rows = int(np.ceil(count / cols))
    # One mosaic in a single imshow (with a 1-pixel grey gutter) draws fast even for thousands of samples.
    mosaic = np.full((rows * (height + 1) + 1, cols * (width + 1) + 1), 0.25)
    shades = np.where(images == 1, 1.0, np.where(images == 0, 0.0, 0.5))
    for i in range(count):
        r, c = divmod(i, cols)
        top, left = 1 + r * (height + 1), 1 + c * (width + 1)
        mosaic[top : top + height, left : left + width] = shades[i]
    # About 4 screen pixels per image pixel, within 2 to 16 inches a side.
    inches = np.clip(np.array(mosaic.shape[::-1]) * 4 / 100, 2.0, 16.0)
    fig, axis = plt.subplots(figsize=(float(inches[0]), float(inches[1]) + (0.3 if title else 0.0)))
    axis.imshow(mosaic, cmap="gray_r", vmin=0.0, vmax=1.0, interpolation="nearest")
    axis.set_axis_off()
    if title:
        axis.set_title(title, fontsize=9)
    fig.tight_layout()
    save_png(fig, path, dpi=100)
