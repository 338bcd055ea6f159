"""The models and data that ``ina-agent train`` trains: scikit-learn's digits, a numpy MLP, a PyTorch CNN.

Both models keep their parameters in one flat float32 vector, so the training loop all-reduces one array
whatever the model: ``loss_and_grad(params, X, y)`` gives the batch's mean loss and gradient,
``evaluate(params, X, y)`` the held-out mean loss and accuracy.

The data set is scikit-learn's digits (1797 8x8 images of handwritten digits, 10 classes), which ships
inside the scikit-learn wheel: no download. ``digits_split`` cuts it once, with a fixed seed, into a
training set and a held-out set of 360 images (20 %) that every worker and every run share.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["Dataset", "Mlp", "Model", "ModelKind", "TorchCnn", "digits_split", "make_dataset", "make_model"]

HELD_OUT = 360  # images of the digits set kept out of training (20 %)
SPLIT_SEED = 12345  # the held-out images are the same in every run, whatever the training seed


class ModelKind(str, enum.Enum):
    """Which model a run trains: the numpy MLP (emulated accelerator) or the PyTorch CNN (real compute)."""

    MLP = "mlp"
    CNN = "cnn"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Dataset:
    """Training and held-out images (float32, [n, 64] in [0, 1]) and labels (int64)."""

    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray

    @property
    def classes(self) -> int:
        return int(max(self.y_train.max(), self.y_test.max())) + 1


def digits_split() -> Dataset:
    """scikit-learn's digits, pixels scaled to [0, 1], split once into training and held-out sets."""
    from sklearn.datasets import load_digits  # reads the copy inside the package

    digits = load_digits()
    X = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(y))
    test, train = order[:HELD_OUT], order[HELD_OUT:]
    return Dataset(X[train], y[train], X[test], y[test])


def make_dataset(samples: int = 1797, features: int = 64, classes: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(X float32 [samples, features], y int64): Gaussian clusters around random class centres.

    A synthetic stand-in of the digits' shape, for callers that want data from a seed alone
    (``examples/``); ``ina-agent train`` uses the real digits (``digits_split``).
    """
    if samples < classes or features < 1 or classes < 2:
        raise ValueError(f"need samples >= classes >= 2 and features >= 1, got {samples}, {features}, {classes}")
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 1.0, size=(classes, features))
    y = np.arange(samples) % classes
    rng.shuffle(y)
    X = centres[y] + rng.normal(0.0, 4.0, size=(samples, features))
    return X.astype(np.float32), y.astype(np.int64)


class Model(Protocol):
    """What the training loop needs of a model; parameters are one flat float32 vector."""

    size: int

    def init(self, seed: int) -> np.ndarray: ...

    def loss_and_grad(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]: ...

    def evaluate(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[float, float]: ...


def _cross_entropy(z: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy of logits ``z`` and the softmax probabilities."""
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    return float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean()), p


class Mlp:
    """One hidden tanh layer and a softmax output, in numpy (the emulated accelerator's model)."""

    def __init__(self, features: int = 64, hidden: int = 32, classes: int = 10) -> None:
        self.shapes = [(features, hidden), (hidden,), (hidden, classes), (classes,)]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.size = sum(self.sizes)

    def init(self, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        parts = []
        for shape in self.shapes:
            parts.append((rng.normal(0, 1 / math.sqrt(shape[0]), size=shape) if len(shape) == 2 else np.zeros(shape)).ravel())
        return np.concatenate(parts).astype(np.float32)

    def _unpack(self, params: np.ndarray) -> list[np.ndarray]:
        out, off = [], 0
        for shape, size in zip(self.shapes, self.sizes):
            out.append(params[off: off + size].reshape(shape))
            off += size
        return out

    def logits(self, params: np.ndarray, X: np.ndarray) -> np.ndarray:
        W1, b1, W2, b2 = self._unpack(params)
        return np.tanh(X @ W1 + b1) @ W2 + b2

    def loss_and_grad(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        """Mean cross-entropy over the batch and its gradient (float32, flat)."""
        W1, b1, W2, b2 = self._unpack(params)
        h = np.tanh(X @ W1 + b1)
        loss, p = _cross_entropy(h @ W2 + b2, y)
        n = X.shape[0]
        dz = p
        dz[np.arange(n), y] -= 1.0
        dz /= n
        dh = (dz @ W2.T) * (1.0 - h * h)
        grads = [X.T @ dh, dh.sum(axis=0), h.T @ dz, dz.sum(axis=0)]
        return loss, np.concatenate([g.ravel() for g in grads]).astype(np.float32)

    def evaluate(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """(mean loss, accuracy) on ``X``, ``y``."""
        z = self.logits(params, X)
        loss, _ = _cross_entropy(z, y)
        return loss, float((z.argmax(axis=1) == y).mean())

    def accuracy(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
        return self.evaluate(params, X, y)[1]


class TorchCnn:
    """A small CNN on the 8x8 digits, in PyTorch on one CPU thread (the real-compute model).

    conv 3x3 (16) -> ReLU -> max-pool 2 -> conv 3x3 (32) -> ReLU -> max-pool 2 -> linear 128 -> 10 (6,090 parameters).
    ``torch.set_num_threads(1)``: the testbed's workers share 2 cores, and a worker that spreads its
    compute over every core slows the others and distorts the speeds under test.
    """

    def __init__(self, classes: int = 10) -> None:
        import torch

        torch.set_num_threads(1)
        self.torch = torch
        nn = torch.nn
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 2 * 2, classes))
        self.size = sum(p.numel() for p in self.net.parameters())

    def init(self, seed: int) -> np.ndarray:
        self.torch.manual_seed(seed)
        for m in self.net:
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()
        return self.torch.nn.utils.parameters_to_vector(self.net.parameters()).detach().numpy().astype(np.float32).copy()

    def _load(self, params: np.ndarray) -> None:
        self.torch.nn.utils.vector_to_parameters(self.torch.from_numpy(np.ascontiguousarray(params, dtype=np.float32)),
                                                 self.net.parameters())

    def _images(self, X: np.ndarray):
        return self.torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32)).reshape(-1, 1, 8, 8)

    def loss_and_grad(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        torch = self.torch
        self._load(params)
        self.net.zero_grad(set_to_none=False)
        loss = torch.nn.functional.cross_entropy(self.net(self._images(X)), torch.from_numpy(y))
        loss.backward()
        grad = torch.cat([p.grad.reshape(-1) for p in self.net.parameters()])
        return float(loss.detach()), grad.numpy().astype(np.float32)

    def evaluate(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        torch = self.torch
        self._load(params)
        with torch.no_grad():
            z = self.net(self._images(X))
            loss = torch.nn.functional.cross_entropy(z, torch.from_numpy(y))
            return float(loss), float((z.argmax(dim=1).numpy() == y).mean())


def make_model(kind: ModelKind | str, classes: int = 10, hidden: int = 32) -> Model:
    """The model of a run: ``mlp`` (numpy) or ``cnn`` (PyTorch, imported only then)."""
    kind = ModelKind(kind)
    return Mlp(64, hidden, classes) if kind is ModelKind.MLP else TorchCnn(classes)
