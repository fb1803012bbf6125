"""JobSpec: what one training step processes, and how long the run is."""

from __future__ import annotations

from dataclasses import dataclass

from simpar.errors import one_of, positive_int, require
from simpar.specs.precision import PRECISIONS, precision_name

# Tokens per sequence at most: a typo beyond this would allocate terabytes
MAX_SEQ_LEN = 100_000_000


@dataclass(frozen=True)
class JobSpec:
    seq_len: int
    global_batch: int  # sequences per optimizer step
    dtype: str = "bf16"  # compute precision of the GEMMs
    tokens: float = 0.0  # tokens to train (0 = not given)

    def __post_init__(self):
        positive_int("seq_len", self.seq_len)
        require(self.seq_len <= MAX_SEQ_LEN, "seq_len", self.seq_len,
                f"is beyond {MAX_SEQ_LEN:,} tokens (the longest trained contexts are a few "
                "million); check it")
        positive_int("global_batch", self.global_batch)
        # a file's or caller's name for the precision, as the catalog names it
        object.__setattr__(self, "dtype", precision_name(self.dtype))
        one_of("dtype", self.dtype, PRECISIONS)
        require(self.tokens >= 0, "tokens", self.tokens, "must be >= 0")

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch
