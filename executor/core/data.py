"""Training data: the deterministic sampler and the built-in datasets.

**Sampler** (DETERMINISTIC.md): for step ``t``, global batch ``B``, ``N`` samples and seed
``s``: ``steps_per_epoch = N // B``, epoch ``e = t // steps_per_epoch``, ``k = t %
steps_per_epoch``, ``order_e = default_rng(SeedSequence((s, e))).permutation(N)``, and
step ``t`` takes ``order_e[k*B:(k+1)*B]``; a sample's index in that slice is its global
position. The ``N % B`` samples at the end of each epoch's order are not used. Every
sample is used exactly once per epoch otherwise. O(N) per epoch change.

**Datasets** (all map-style: ``dataset[i] -> (input, target)``):

* ``synthetic``: a learnable task for the model's family, ``SYNTHETIC_SIZE`` samples
  drawn from the data seed. Images: one fixed random prototype image per class (10
  classes, or fewer if the model has fewer) plus Gaussian noise of half its scale, label
  = the class. BERT: random tokens, label = ``first token * classes // vocab`` (readable
  from the first position). GPT-2: arithmetic sequences ``start, start+1, ...`` mod
  vocab, targets = inputs shifted by one.
* ``digits``: scikit-learn's 1,797 handwritten digits (8 x 8, 10 classes), normalised to
  zero mean and unit variance, resized bilinearly to the model's resolution and repeated
  over 3 channels (image zoo models; a callable model gets them at 8 x 8).
* ``package.module:callable``: ``callable()`` returns any torch ``Dataset`` whose items
  are ``(input tensor, target tensor)``.

The first stage reads only inputs, the last only targets (:meth:`Rows.inputs`,
:meth:`Rows.targets`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from edgepipe.executor.profiling import zoo
from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.profile import BuildSpec
from torch.utils.data import Dataset

SYNTHETIC_SIZE = 512
BUILT_IN = ("synthetic", "digits")


def step_indices(step: int, global_batch: int, num_samples: int, seed: int) -> np.ndarray:
    """Dataset indices of step ``step``'s global batch, in global position order."""
    if num_samples < global_batch:
        raise InputError(
            "dataset", "", f"has {num_samples} samples, fewer than the global batch "
            f"{global_batch}; use a larger dataset or a smaller batch"
        )
    per_epoch = num_samples // global_batch
    epoch, k = divmod(step, per_epoch)
    order = np.random.default_rng(np.random.SeedSequence((seed, epoch))).permutation(num_samples)
    return order[k * global_batch : (k + 1) * global_batch]


class TensorPairs(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Inputs ``x`` and targets ``y`` held as two tensors (first dimension = sample)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if len(x) != len(y):
            raise ValueError(f"{len(x)} inputs but {len(y)} targets")
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class Rows:
    """Batched access to a dataset's inputs and targets by index list."""

    def __init__(self, dataset: Dataset[Any]) -> None:
        self.dataset = dataset
        # torch's Dataset declares no __len__; a map-style one has it (load_dataset checks)
        self.size = len(dataset)  # type: ignore[arg-type]
        if self.size < 1:
            raise InputError("dataset", "", "is empty")

    def _stack(self, indices: np.ndarray, part: int) -> torch.Tensor:
        if isinstance(self.dataset, TensorPairs):
            t = self.dataset.x if part == 0 else self.dataset.y
            return t[torch.as_tensor(indices, dtype=torch.long)]
        return torch.stack([torch.as_tensor(self.dataset[int(i)][part]) for i in indices])

    def inputs(self, indices: np.ndarray) -> torch.Tensor:
        return self._stack(indices, 0)

    def targets(self, indices: np.ndarray) -> torch.Tensor:
        return self._stack(indices, 1)

    def sample_input(self) -> torch.Tensor:
        """One sample's input with a batch dimension of 1 (for shape discovery)."""
        return self.inputs(np.array([0]))


def _generator(seed: int, salt: int) -> torch.Generator:
    state = np.random.SeedSequence((seed, salt)).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


def synthetic(build: BuildSpec, seed: int, size: int = SYNTHETIC_SIZE) -> TensorPairs:
    """The learnable synthetic task of the zoo model's family (module docstring)."""
    if build.zoo is None:
        raise InputError(
            "--dataset", "", f"the synthetic task needs a zoo model, but the plan's model is "
            f"{build.callable}; give --dataset MODULE:CALLABLE returning a torch Dataset"
        )
    entry = zoo.ZOO[build.zoo]
    sizes = zoo.resolve_sizes(build.zoo, **build.sizes)
    gen = _generator(seed, 1)
    if entry.is_image:
        r, classes = sizes["resolution"], min(10, sizes["num_classes"])
        prototypes = torch.randn(classes, 3, r, r, generator=gen)
        y = torch.randint(classes, (size,), generator=gen)
        x = prototypes[y] + 0.5 * torch.randn(size, 3, r, r, generator=gen)
        return TensorPairs(x, y)
    vocab, n = sizes["vocab"], sizes["seq_len"]
    if entry.task == zoo.LANGUAGE_MODELLING:
        start = torch.randint(vocab, (size, 1), generator=gen)
        seq = (start + torch.arange(n + 1)) % vocab
        return TensorPairs(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())
    tokens = torch.randint(vocab, (size, n), generator=gen)
    return TensorPairs(tokens, tokens[:, 0] * sizes["num_classes"] // vocab)


def digits(build: BuildSpec) -> TensorPairs:
    """scikit-learn's handwritten digits for an image model (module docstring)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise InputError(
            "--dataset digits", "", "needs scikit-learn: pip install 'edgepipe[executor]'"
        ) from None
    resolution = 8
    if build.zoo is not None:
        if not zoo.ZOO[build.zoo].is_image:
            raise InputError(
                "--dataset digits", "", f"is an image dataset; {build.zoo} takes tokens "
                "(use --dataset synthetic)"
            )
        resolution = zoo.resolve_sizes(build.zoo, **build.sizes)["resolution"]
    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32).view(-1, 1, 8, 8)
    x = (x - x.mean()) / x.std()
    if resolution != 8:
        x = F.interpolate(x, size=(resolution, resolution), mode="bilinear", align_corners=False)
    return TensorPairs(x.expand(-1, 3, -1, -1).contiguous(), torch.tensor(data.target))


def load_dataset(name: str, build: BuildSpec, seed: int) -> Dataset[Any]:
    """Dataset ``name`` (``synthetic``, ``digits`` or ``package.module:callable``) for
    the model of ``build``; ``seed`` is the data seed (synthetic only)."""
    if name == "synthetic":
        return synthetic(build, seed)
    if name == "digits":
        return digits(build)
    if ":" in name:
        dataset = zoo.load_callable(name)()
        ok = hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__") and len(dataset) > 0
        first = dataset[0] if ok else None
        if not (isinstance(first, tuple | list) and len(first) == 2):
            raise InputError(
                name, "", "must return a map-style torch Dataset (len and [i]) whose items "
                "are (input, target) pairs"
            )
        return dataset
    raise InputError(
        "--dataset", "", f"unknown dataset {name!r}; use one of {list(BUILT_IN)} or "
        "MODULE:CALLABLE returning a torch Dataset"
    )


def default_dataset(build: BuildSpec) -> str | None:
    """``synthetic`` for zoo models; None (must be given) for callables."""
    return "synthetic" if build.zoo is not None else None
