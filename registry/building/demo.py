"""Two versions of a real digits classifier, for demos and canary walkthroughs.

Trained offline on scikit-learn's bundled 8x8 digits (no download), exported through
``mlp_from_weights``. v1 is deliberately weaker than v2 so a canary visibly improves
accuracy. The bytes are deterministic (fixed split, seeds, single-threaded BLAS), so
registering the demo twice is idempotent.

Imports no Django.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import onnx
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier
from threadpoolctl import threadpool_limits

from registry.building.onnx_build import mlp_from_weights, to_bytes

demo_model_name = "digits"
demo_model_description = (
    "Handwritten digit classifier on scikit-learn's 8x8 digits. Input 'input' FP32 [batch, 64]: "
    "raw pixel intensities 0..16, row-major; the /16 scaling used in training is folded into the "
    "first layer, so send raw pixels. Output 'probabilities' FP32 [batch, 10]: softmax over digits 0-9."
)

DATASET_NAME = "sklearn digits 8x8"
PIXEL_MAX = 16.0  # digits pixels are integers 0..16; training sees pixels / 16
INPUT_SCALING = "raw pixels 0..16 in; the /16 training scaling is folded into the first layer's weights"
SPLIT_SEED = 0
TEST_FRACTION = 0.25
V1_TRAIN_SAMPLES = 100  # a small stratified subset: clearly weaker than v2


@dataclass
class DemoVersion:
    artifact: bytes
    description: str
    metrics: dict


@dataclass
class _Split:
    train_pixels: np.ndarray
    train_labels: np.ndarray
    test_pixels: np.ndarray
    test_labels: np.ndarray


def build_demo_versions() -> list[DemoVersion]:
    """v1 (logistic regression, 100 samples) and v2 (MLP, full training split)."""
    split = _digits_split()
    # One BLAS thread: a different thread count may sum in another order and change
    # the last bits of the weights, and with them the sha256.
    with threadpool_limits(limits=1), warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        versions = [_logistic_regression_version(split), _mlp_version(split)]
    return versions


def _digits_split() -> _Split:
    pixels, labels = load_digits(return_X_y=True)
    train_pixels, test_pixels, train_labels, test_labels = train_test_split(
        pixels, labels, test_size=TEST_FRACTION, random_state=SPLIT_SEED, stratify=labels
    )
    return _Split(train_pixels, train_labels, test_pixels, test_labels)


def _logistic_regression_version(split: _Split) -> DemoVersion:
    pixels, _, labels, _ = train_test_split(
        split.train_pixels, split.train_labels, train_size=V1_TRAIN_SAMPLES, random_state=SPLIT_SEED, stratify=split.train_labels
    )
    classifier = LogisticRegression(max_iter=1000).fit(pixels / PIXEL_MAX, labels)
    # Multinomial logistic regression is a one-layer MLP with a softmax.
    model = _export([classifier.coef_.T], [classifier.intercept_], name="digits_logistic_regression")
    family = "multinomial logistic regression"
    return _demo_version(model, split, family, train_samples=len(labels))


def _mlp_version(split: _Split) -> DemoVersion:
    classifier = MLPClassifier(hidden_layer_sizes=(64,), solver="lbfgs", alpha=1e-3, max_iter=200, random_state=SPLIT_SEED)
    classifier.fit(split.train_pixels / PIXEL_MAX, split.train_labels)
    model = _export(classifier.coefs_, classifier.intercepts_, name="digits_mlp")
    family = "MLP 64-64-10 (ReLU, softmax)"
    return _demo_version(model, split, family, train_samples=len(split.train_labels))


def _export(weights: list[np.ndarray], biases: list[np.ndarray], *, name: str) -> onnx.ModelProto:
    """Fold the /16 pixel scaling into the first layer, so clients send raw pixels."""
    scaled = [weights[0] / PIXEL_MAX, *weights[1:]]
    return mlp_from_weights(_float32(scaled), _float32(biases), softmax=True, name=name)


def _float32(arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(array, np.float32) for array in arrays]


def _demo_version(model: onnx.ModelProto, split: _Split, family: str, *, train_samples: int) -> DemoVersion:
    artifact = to_bytes(model)
    metrics = {
        "accuracy": onnx_accuracy(artifact, split.test_pixels, split.test_labels),
        "dataset": DATASET_NAME,
        "test_samples": len(split.test_labels),
        "train_samples": train_samples,
        "family": family,
        "input_scaling": INPUT_SCALING,
    }
    description = f"{family}, trained on {train_samples} digits. {demo_model_description}"
    return DemoVersion(artifact=artifact, description=description, metrics=metrics)


def onnx_accuracy(artifact: bytes, pixels: np.ndarray, labels: np.ndarray) -> float:
    """Accuracy of the exported model as ONNX Runtime serves it, on raw pixels."""
    import onnxruntime  # only needed here; keeps importing this module cheap

    session = onnxruntime.InferenceSession(artifact, providers=["CPUExecutionProvider"])
    (probabilities,) = session.run(None, {"input": pixels.astype(np.float32)})
    return round(float(np.mean(probabilities.argmax(axis=1) == labels)), 4)


def demo_test_split() -> tuple[np.ndarray, np.ndarray]:
    """The fixed test split (raw pixels, labels) the metrics were measured on."""
    split = _digits_split()
    return split.test_pixels, split.test_labels
