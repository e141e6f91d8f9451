"""Example: a small transformer language model on generated sequences (no download).

Every sequence follows its own rule ``x[t+1] = (a * x[t] + b) mod vocab`` with ``a``, ``b`` drawn
per sequence, so the next token is predictable only by reading the context: a causal transformer
learns it in a few hundred steps, a bigram model cannot. The training loop is the same as in
:mod:`malleparsl.apps.examples_digits`; only the data, the model and the loss change. No dropout,
so the result does not depend on how the global batch is split.

Under Parsl::

    lm = malleable_app(min_nodes=1, max_nodes=4)(train_lm)
    print(lm(total_steps=300).result()["token_loss"])
"""

from __future__ import annotations

from typing import Any

from malleparsl.extras import needs_extra

with needs_extra("malleparsl.apps.examples_lm"):
    import torch
    import torch.nn.functional as F
    from torch import nn


def affine_sequences(
    *, n: int = 2048, length: int = 32, vocab: int = 32, seed: int = 0
) -> torch.Tensor:
    """``n`` sequences of ``length`` tokens, each ``x[t+1] = (a * x[t] + b) mod vocab``."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randint(1, vocab, (n, 1), generator=gen)
    b = torch.randint(0, vocab, (n, 1), generator=gen)
    x = torch.empty(n, length, dtype=torch.long)
    x[:, :1] = torch.randint(0, vocab, (n, 1), generator=gen)
    for t in range(1, length):
        x[:, t : t + 1] = (a * x[:, t - 1 : t] + b) % vocab
    return x


class TinyLM(nn.Module):
    """Token + position embeddings, a causal transformer encoder, a linear head."""

    def __init__(self, *, vocab: int = 32, length: int = 32, dim: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(length, dim))
        layer = nn.TransformerEncoderLayer(
            dim, nhead=4, dim_feedforward=2 * dim, dropout=0.0, batch_first=True
        )
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(length))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        h = self.tok(x) + self.pos[:n]
        return self.head(self.body(h, mask=self.mask[:n, :n], is_causal=True))


def train_lm(
    ctx: Any,
    *,
    total_steps: int | None = 300,
    global_batch: int = 32,
    lr: float = 3e-3,
    vocab: int = 32,
    length: int = 32,
) -> dict[str, Any]:
    """Train :class:`TinyLM` with Adam; return the final per-token loss and the history."""
    data = affine_sequences(vocab=vocab, length=length).to(ctx.device)
    model = TinyLM(vocab=vocab, length=length).to(ctx.device)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    ctx.register(model=model, optimizer=opt)
    tokens = length - 1  # predictions per sequence
    token_loss = float("nan")
    for step in ctx.steps(total_steps, global_batch=global_batch, dataset_size=len(data)):
        opt.zero_grad()
        for idx in step.micro_batches():
            seq = data[idx]
            logits = model(seq[:, :-1])
            step.backward(F.cross_entropy(logits.reshape(-1, vocab), seq[:, 1:].reshape(-1),
                                          reduction="sum"))
        token_loss = step.sync(model) / tokens
        opt.step()
        ctx.report(loss=token_loss)
    return {"token_loss": token_loss, "steps": ctx.step, "history": ctx.history}
