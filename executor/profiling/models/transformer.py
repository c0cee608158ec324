"""Transformers as chains of blocks: a BERT-style encoder and a GPT-2-style decoder.

Blocks: ``embed`` (token + position embeddings), one block per transformer layer, and
``head``. BERT layers are post-norm with erf GELU; GPT-2 layers are pre-norm, causal,
with tanh GELU. At full size the parameter counts match the published models: BERT-base
109,482,240 without the classifier (the classifier adds hidden x classes + classes);
GPT-2 small 124,439,808 plus 38,597,376 for the LM head, which is *not* tied to the
token embedding here, because the two sit in different blocks (and possibly different
pipeline stages). Dropout is left out, and there is no padding mask (every token is
real), so a forward pass is a deterministic function of weights and tokens.

Attention uses ``F.scaled_dot_product_attention`` with query, key and value from one
fused projection (the same parameter count as three separate ones).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Literal

import torch
import torch.nn.functional as F
from edgepipe.executor.profiling.models.blocks import BlockSpec
from torch import nn

#: ``torch.nn.GELU``'s ``approximate``: exact (BERT) or the tanh form (GPT-2)
GeluApproximation = Literal["none", "tanh"]


class SelfAttention(nn.Module):
    """Multi-head self-attention over (batch, sequence, hidden) inputs."""

    def __init__(self, hidden: int, heads: int, causal: bool) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not a multiple of {heads} heads")
        self.heads = heads
        self.causal = causal
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=self.causal)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class TransformerLayer(nn.Module):
    """One transformer layer: self-attention and a two-layer GELU MLP, each with a residual.

    ``pre_norm`` (GPT-2): ``x + attn(ln1(x))`` then ``x + mlp(ln2(x))``;
    post-norm (BERT): ``ln1(x + attn(x))`` then ``ln2(x + mlp(x))``.
    """

    def __init__(
        self,
        hidden: int,
        heads: int,
        ffn: int,
        *,
        pre_norm: bool,
        causal: bool,
        gelu: GeluApproximation,
        eps: float,
    ) -> None:
        super().__init__()
        self.pre_norm = pre_norm
        self.attn = SelfAttention(hidden, heads, causal)
        self.ln1 = nn.LayerNorm(hidden, eps=eps)
        self.mlp = nn.Sequential(
            nn.Linear(hidden, ffn), nn.GELU(approximate=gelu), nn.Linear(ffn, hidden)
        )
        self.ln2 = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.mlp(x))


class Embeddings(nn.Module):
    """Token + learned position embeddings of (batch, sequence) token ids; BERT adds the
    segment-0 embedding and a layer norm (``bert=True``)."""

    def __init__(self, vocab: int, hidden: int, max_positions: int, *, bert: bool) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(max_positions, hidden)
        self.segments = nn.Embedding(2, hidden) if bert else None
        self.ln = nn.LayerNorm(hidden, eps=1e-12) if bert else None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.tokens(ids) + self.positions(pos)
        if self.segments is not None and self.ln is not None:
            x = self.ln(x + self.segments.weight[0])
        return x


class ClassifierHead(nn.Module):
    """BERT pooler (tanh dense layer on the first token) followed by a linear classifier."""

    def __init__(self, hidden: int, num_classes: int) -> None:
        super().__init__()
        self.pooler = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.tanh(self.pooler(x[:, 0])))


class LMHead(nn.Module):
    """GPT-2 final layer norm and the (untied) projection to vocabulary logits."""

    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(hidden, eps=1e-5)
        self.proj = nn.Linear(hidden, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.ln(x))


def _stack(
    embed: Callable[[], nn.Module],
    head: Callable[[], nn.Module],
    layers: int,
    hidden: int,
    heads: int,
    ffn: int | None,
    *,
    pre_norm: bool,
    causal: bool,
    gelu: GeluApproximation,
    eps: float,
) -> list[BlockSpec]:
    """A transformer's blocks: ``embed``, then ``layers`` :class:`TransformerLayer` blocks
    of ``hidden`` width, ``heads`` heads and ``ffn`` (default 4 x hidden) feed-forward
    width in the style the keywords give (:class:`TransformerLayer`'s), named layer0 ..
    layer<layers-1>, then ``head``; each a builder of its module."""
    layer = partial(
        TransformerLayer, hidden, heads, ffn or 4 * hidden,
        pre_norm=pre_norm, causal=causal, gelu=gelu, eps=eps,
    )
    return [
        ("embed", embed),
        *((f"layer{i}", layer) for i in range(layers)),
        ("head", head),
    ]


def bert(
    *,
    layers: int,
    hidden: int,
    heads: int,
    ffn: int | None,
    vocab: int,
    max_positions: int,
    num_classes: int,
) -> list[BlockSpec]:
    """BERT-style encoder for sequence classification (blocks: :func:`_stack`)."""
    embed = partial(Embeddings, vocab, hidden, max_positions, bert=True)
    head = partial(ClassifierHead, hidden, num_classes)
    return _stack(embed, head, layers, hidden, heads, ffn,
                  pre_norm=False, causal=False, gelu="none", eps=1e-12)


def gpt2(
    *, layers: int, hidden: int, heads: int, ffn: int | None, vocab: int, max_positions: int
) -> list[BlockSpec]:
    """GPT-2-style decoder for next-token prediction (blocks: :func:`_stack`)."""
    embed = partial(Embeddings, vocab, hidden, max_positions, bert=False)
    head = partial(LMHead, hidden, vocab)
    return _stack(embed, head, layers, hidden, heads, ffn,
                  pre_norm=True, causal=True, gelu="tanh", eps=1e-5)
