"""What one request may ask of a runtime, checked before anything changes.

Three limits: the new tokens one request adds (``--max-request-tokens``), the positions a
session reaches (the model's context) and the cache blocks one session holds (the pool's
size; other sessions are evicted for it, never counted against it). Each check raises the
error the client gets.
"""

from __future__ import annotations

from leyline_sdk.errors import CapacityExceeded, RequestTooLarge


class Admission:
    def __init__(self, max_positions: int, max_request_tokens: int, block_size: int, num_blocks: int):
        self.max_positions = max_positions
        self.max_request_tokens = max_request_tokens
        self.block_size = block_size
        self.num_blocks = num_blocks

    def check_request_tokens(self, num_tokens: int) -> None:
        if num_tokens > self.max_request_tokens:
            raise RequestTooLarge(f"this request adds {num_tokens} tokens; this server takes at most "
                                  f"{self.max_request_tokens} per request (--max-request-tokens)")

    def check_positions(self, num_tokens: int) -> None:
        if num_tokens > self.max_positions:
            raise CapacityExceeded(f"{num_tokens} tokens exceed the model's context of {self.max_positions}")

    def check_blocks(self, blocks: int) -> None:
        """One session may hold ``blocks`` (its history, the new tokens and room for the reply)."""
        if blocks > self.num_blocks:
            bs = self.block_size
            raise CapacityExceeded(f"this request needs {blocks * bs} cache tokens for its session in all (its "
                                   f"history, the new tokens and room for the reply); the cache holds "
                                   f"{self.num_blocks * bs}")

    def check_generation(self, prompt_tokens: int, max_tokens: int, new_tokens: int = 0) -> None:
        """A prompt of ``prompt_tokens`` (``new_tokens`` of them new) and its reply budget fit."""
        self.check_request_tokens(new_tokens)
        self.check_positions(prompt_tokens + 1)  # + the assistant header
        reply_end = min(prompt_tokens + 1 + max_tokens + 1, self.max_positions)
        self.check_blocks(-(-reply_end // self.block_size))
