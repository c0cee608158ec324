"""The shape of a model of the zoo: a chain of named blocks, each built on demand."""

from collections.abc import Callable

from torch import nn

#: one block of a chain: its name (no dots) and a zero-argument factory that builds it
BlockSpec = tuple[str, Callable[[], nn.Module]]
