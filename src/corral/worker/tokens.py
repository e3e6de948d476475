"""Tokenizing prompts and turning tokens back into bytes, with a per-token piece cache."""

from __future__ import annotations

import ctypes

import llama_cpp as ll

from corral.worker.model import LoadedModel

__all__ = ["Tokenizer"]


class Tokenizer:
    def __init__(self, m: LoadedModel) -> None:
        self.vocab = m.vocab
        self.n_vocab = m.n_vocab
        self._pieces: dict[int, bytes] = {}  # sampling threads share it (a dict set is atomic)
        self.eog_tokens = [t for t in range(self.n_vocab) if ll.llama_vocab_is_eog(self.vocab, t)]
        self._eog = frozenset(self.eog_tokens)
        bos = ll.llama_vocab_bos(self.vocab)
        self._bos_text = self.special_text(bos) if bos >= 0 else ""

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        while True:
            arr = (ll.llama_token * cap)()
            n = ll.llama_tokenize(self.vocab, data, len(data), arr, cap, add_special, parse_special)
            if n >= 0:
                return arr[:n]
            cap = -n

    def piece(self, token: int) -> bytes:
        """The bytes a generated token stands for (control tokens render as nothing)."""
        p = self._pieces.get(token)
        if p is None:
            p = self._to_piece(token, special=False)
            self._pieces[token] = p
        return p

    def prompt_piece(self, token: int) -> bytes:
        """A prompt token's bytes for echo; control tokens (BOS) by their text."""
        return self.piece(token) or self.special_text(token).encode("utf-8")

    def special_text(self, token: int) -> str:
        if token < 0:
            return ""
        return self._to_piece(token, special=True).decode("utf-8", "replace")

    def _to_piece(self, token: int, *, special: bool) -> bytes:
        # a buffer per call, not per tokenizer: sampling threads (logprobs) and the reader
        # thread may convert tokens at the same time; the cache makes this rare
        buf = ctypes.create_string_buffer(256)
        n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = ll.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
        return buf.raw[:n]

    def is_eog(self, token: int) -> bool:
        return token in self._eog

    def starts_with_bos(self, text: str) -> bool:
        return bool(self._bos_text) and text.startswith(self._bos_text)

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")
