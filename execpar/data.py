"""Training data: seeded synthetic tokens (identical for every strategy) or a file of
uint16 token ids."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from simpar.errors import SpecError


class Batches:
    """The global batch of step `step` as (inputs, labels), each (global_batch, seq_len)."""

    def __init__(self, vocab: int, seq_len: int, global_batch: int, seed: int,
                 path: str | None = None):
        self.vocab, self.seq_len, self.batch, self.seed = vocab, seq_len, global_batch, seed
        self.tokens = None
        if path is not None:
            p = Path(path)
            if not p.is_file():
                raise SpecError("--data", path, "no such file; give a file of uint16 token ids")
            size = p.stat().st_size
            if size % 2:
                raise SpecError(
                    "--data", path,
                    f"holds {size} bytes, an odd number: not a file of uint16 token ids")
            if size < 2 * (seq_len + 1):
                raise SpecError(
                    "--data", path,
                    f"holds {size // 2} tokens, fewer than one sequence of {seq_len + 1}")
            self.tokens = np.memmap(p, dtype=np.uint16, mode="r")

    def check_ids(self) -> None:
        """Every token id of the file within the model's vocabulary (once, before a run:
        a chunked scan)."""
        if self.tokens is None:
            return
        chunk = 1 << 26
        for start in range(0, len(self.tokens), chunk):
            part = self.tokens[start:start + chunk]
            top = int(part.max())
            if top >= self.vocab:
                at = start + int(np.argmax(part >= self.vocab))
                raise SpecError(
                    "--data", str(self.tokens.filename),
                    f"holds token id {top} (first out of range at position {at}), beyond the "
                    f"model's vocabulary of {self.vocab}; tokenize for this model or plan with its "
                    "vocabulary")

    def global_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.seq_len + 1
        if self.tokens is None:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
            seqs = torch.randint(0, self.vocab, (self.batch, n), generator=g)
        else:
            count = len(self.tokens) // n
            # the data position is the step
            idx = [(step * self.batch + i) % count for i in range(self.batch)]
            seqs = torch.from_numpy(
                np.stack([np.asarray(self.tokens[i * n:(i + 1) * n], dtype=np.int64) for i in idx]))
        return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()

    def local(self, step: int, dp_rank: int, dp: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This data-parallel rank's contiguous slice of the global batch (a distributed
        sampler)."""
        x, y = self.global_batch(step)
        per = self.batch // dp
        return x[dp_rank * per:(dp_rank + 1) * per], y[dp_rank * per:(dp_rank + 1) * per]
