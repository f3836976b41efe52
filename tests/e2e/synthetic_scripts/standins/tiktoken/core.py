class Encoding:
    """What the real Encoding does with byte-level ranks and special tokens (no merges)."""

    def __init__(self, name, *, pat_str, mergeable_ranks, special_tokens, explicit_n_vocab=None):
        self.name, self._ranks, self._special_tokens = name, dict(mergeable_ranks), dict(special_tokens)
        self.eot_token = self._special_tokens.get("<|endoftext|>")
        self.n_vocab = max([*self._ranks.values(), *self._special_tokens.values()]) + 1

    def encode(self, text, *, allowed_special=frozenset()):
        ids = []
        for part in text.split("<|endoftext|>") if "<|endoftext|>" in allowed_special else [text]:
            if ids or part is not text:
                ids.append(self.eot_token) if ids or text.startswith("<|endoftext|>") else None
            ids.extend(self._ranks[bytes([b])] for b in part.encode("utf-8"))
        return ids

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
