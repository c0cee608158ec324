"""A small GPT-style language model in plain torch, not written as edgepipe blocks.

Token and position embeddings, a ``ModuleList`` of pre-norm transformer layers (each
with its two residual connections inside), a final layer norm and a language-model
head. edgepipe splits it into a chain of blocks at module boundaries
(``edgepipe profile --model examples.gpt:factory --input examples.gpt:example_input
--split auto``, run from the repository root). Sizes are tiny so that tests are fast.

* :func:`factory` -- the model (``edgepipe profile --model``),
* :func:`example_input` -- a batch of token ids (``--input``),
* :func:`dataset` -- a learnable synthetic task (``edgepipe run --dataset``): each
  sequence counts up from a random token modulo the vocabulary, the targets are the
  inputs shifted by one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

VOCAB = 64
SEQ_LEN = 16
HIDDEN = 32
HEADS = 4
LAYERS = 4


class Attention(nn.Module):
    """Causal multi-head self-attention: one fused q/k/v projection, then out."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.size(0), x.size(1), x.size(2)
        q, k, v = self.qkv(x).split(hidden, dim=2)
        shape = (batch, seq, self.heads, hidden // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, seq, hidden))


class Layer(nn.Module):
    """Pre-norm transformer layer: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(
            nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token ids (batch, seq) -> next-token logits (batch, seq, vocab)."""

    def __init__(
        self, vocab: int = VOCAB, seq_len: int = SEQ_LEN, hidden: int = HIDDEN,
        heads: int = HEADS, layers: int = LAYERS,
    ) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, hidden)
        self.pos_emb = nn.Embedding(seq_len, hidden)
        self.layers = nn.ModuleList(Layer(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.size(1), device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(positions)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln_f(x))


def factory() -> GPT:
    """The example model at its default (tiny) sizes."""
    return GPT()


def example_input(batch: int) -> torch.Tensor:
    """``batch`` random sequences of ``SEQ_LEN`` token ids (fixed seed)."""
    gen = torch.Generator().manual_seed(0)
    return torch.randint(VOCAB, (batch, SEQ_LEN), generator=gen)


def dataset(size: int = 256) -> TensorDataset:
    """``size`` counting sequences (module docstring) as (input, target) pairs."""
    gen = torch.Generator().manual_seed(1)
    start = torch.randint(VOCAB, (size, 1), generator=gen)
    seq = (start + torch.arange(SEQ_LEN + 1)) % VOCAB
    return TensorDataset(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())
