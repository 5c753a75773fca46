"""Generation scores for digits: the Fréchet distance, the Inception-Score-like figure, the classifier."""

from __future__ import annotations

import numpy as np
import pytest

from latentloop.errors import UsageError
from latentloop.eval.generation import (
    digit_classifier,
    frechet_distance,
    gaussian_fit,
    inception_score,
    reference_scores,
    score_digits,
)
from latentloop.tasks import get_task


def test_frechet_distance_is_zero_for_the_same_set_and_grows_with_a_shift() -> None:
    rng = np.random.default_rng(0)
    features = rng.normal(size=(200, 8)) @ rng.normal(size=(8, 8))
    mean, cov = gaussian_fit(features)
    assert frechet_distance(mean, cov, mean, cov) == pytest.approx(0.0, abs=1e-6)
    distances = [frechet_distance(*gaussian_fit(features + shift), mean, cov) for shift in (0.5, 1.0, 2.0)]
    assert distances[0] > 0.1 and distances[0] < distances[1] < distances[2]
    # A pure shift by s in every one of 8 dimensions adds exactly 8 s² (the covariances are equal).
    assert distances[1] == pytest.approx(8.0, rel=1e-6)


def test_frechet_distance_with_singular_covariances() -> None:
    # Fewer vectors than dimensions (as with 16 samples of 32 features): still finite, zero for itself.
    features = np.random.default_rng(1).normal(size=(5, 32))
    mean, cov = gaussian_fit(features)
    assert frechet_distance(mean, cov, mean, cov) == pytest.approx(0.0, abs=1e-6)
    assert np.isfinite(frechet_distance(mean, cov, mean + 1, 2 * cov))


def test_inception_score_bounds() -> None:
    confident = np.eye(10)[np.arange(100) % 10] * 0.999 + 0.001 / 10
    assert inception_score(confident) == pytest.approx(10.0, rel=0.02)
    assert inception_score(np.full((50, 10), 0.1)) == pytest.approx(1.0)
    one_class = np.tile(np.eye(10)[3], (50, 1))  # confident but not diverse
    assert inception_score(one_class) == pytest.approx(1.0)


def test_classifier_and_scores_on_real_digits() -> None:
    task = get_task("digits")
    classifier = digit_classifier(task)
    assert classifier.test_accuracy > 0.85
    assert digit_classifier(task) is classifier  # trained once per process
    real = reference_scores(task, 64)
    assert real["images"] == 64 and real["inception_score"] > 6
    blank = score_digits(task, np.zeros((64, 8, 8), dtype=np.int8))
    assert blank["inception_score"] == pytest.approx(1.0)
    assert blank["frechet_distance"] > 10 * real["frechet_distance"]
    assert set(blank) == {"images", "inception_score", "frechet_distance", "classifier_test_accuracy"}
    assert score_digits(task, np.ones((1, 8, 8), dtype=np.int8))["frechet_distance"] is None
    with pytest.raises(UsageError):
        score_digits(task, np.zeros((4, 5, 5), dtype=np.int8))
