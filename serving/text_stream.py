"""Generated token ids to text as they come, for streaming. A piece is released once it decodes
cleanly (a UTF-8 character split over several byte-level tokens waits for its last byte), and
text that may still turn into a stop string is held back until it cannot; the text ends before
the first stop string. Needs a `tokenizers.Tokenizer` (or anything with its `decode`)."""

from __future__ import annotations

REPLACEMENT = "\ufffd"  # what a decoder makes of an incomplete UTF-8 sequence


class TextStream:
    def __init__(self, tokenizer, stop=()):
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.ids: list = []
        self.text = ""  # clean text so far (cut before a stop string once one is found)
        self.stopped = False  # a stop string was found: push no more
        # ids[prefix:read] were decoded already; decoding the next piece together with them
        # keeps what a tokenizer does at word starts (a leading space) the same as in one go
        self._prefix = self._read = 0
        self._sent = 0  # characters of text released

    def _decode(self, ids: list) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _new_text(self) -> str:
        before = self._decode(self.ids[self._prefix : self._read])
        return self._decode(self.ids[self._prefix :])[len(before) :]

    def push(self, token: int) -> str:
        """The text that can be released once `token` is appended ("" while a character is
        incomplete or a stop string may be starting)."""
        self.ids.append(token)
        new = self._new_text()
        if new and not new.endswith(REPLACEMENT):
            self.text += new
            self._prefix, self._read = self._read, len(self.ids)
        return self._release(final=False)

    def flush(self) -> str:
        """The rest at the end of generation (an incomplete character as U+FFFD)."""
        if not self.stopped and self._read < len(self.ids):
            self.text += self._new_text()
            self._prefix = self._read = len(self.ids)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        if self.stopped:
            return ""
        # a stop string cannot begin in released text: its start would have been held back
        found = [(i, s) for s in self.stop if (i := self.text.find(s, self._sent)) >= 0]
        if found:
            self.stopped = True
            self.text = self.text[: min(found)[0]]
            end = len(self.text)
        else:
            end = len(self.text) - (0 if final else self._held())
        out, self._sent = self.text[self._sent : end], max(self._sent, end)
        return out

    def _held(self) -> int:
        """Length of the longest unreleased end of the text that a stop string starts with."""
        longest = min(max(map(len, self.stop), default=1) - 1, len(self.text) - self._sent)
        for n in range(longest, 0, -1):
            if any(s.startswith(self.text[-n:]) for s in self.stop):
                return n
        return 0
