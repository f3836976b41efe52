"""The text pre-filter: which files are worth a parse at all.

Most Python files that mention torch contain no training script (a model library, torch's own
sources). Parsing them would cost far more than reading them, so the engine first asks, on the raw
text, whether any rule could act on the file, and leaves it untouched, unparsed, when none can.

The test must be SOUND: it may let through files that need nothing (they are parsed and left
unchanged), but it must never reject a file on which the engine would change or report something.
It follows from what the engine needs before any rule acts or reports (see `migrate/roles/`):

- an optimizer constructor: a call whose qualified name is `torch.optim.<Name>` or
  `transformers[.optimization].AdamW|Adafactor`. Qualified names are made of identifiers written in
  the file (an import's dotted name and the call's attribute chain), so the text holds the word
  `optim` (or the words `transformers` and `AdamW`/`Adafactor`). Every rewrite and every
  diagnostic except the two below needs it;
- or a call `<expr>.backward(...)` (reported when no optimizer is built here): the word `backward`
  after a `.` and before a `(`, with only whitespace, line continuations or comments between;
- or `torch.multiprocessing.spawn`/`start_processes` (the whole file is reported and left alone):
  the words `multiprocessing` and `spawn`/`start_processes`.

On top of that, only files that mention `torch` are considered at all (the tool migrates PyTorch
scripts). Words are identifiers: no identifier character right before or after them. A notebook's
raw JSON (first character `{`) is checked with the looser word test for `backward`, since JSON
escapes (`\\n`, quotes between lines) may sit around the dot; its extracted script is then checked
again exactly. A file that is not parsed is not checked for syntax errors either.
"""

from __future__ import annotations

_SPACE = " \t\f\r\n\\"  # what may separate `.`, `backward` and `(` besides comments
_NEWLINES = "\r\n"


def worth_parsing(text: str) -> bool:
    """True unless no rule could change or report anything in `text` (see the module docstring)."""
    if "torch" not in text:
        return False
    if _has_word(text, "optim"):
        return True
    if _looks_like_json(text):
        if _has_word(text, "backward"):
            return True
    elif _has_method_call(text, "backward"):
        return True
    if _has_word(text, "transformers") and (_has_word(text, "AdamW") or _has_word(text, "Adafactor")):
        return True
    return _has_word(text, "multiprocessing") and (_has_word(text, "spawn") or _has_word(text, "start_processes"))


def _is_identifier_char(char: str) -> bool:
    return ("_" + char).isidentifier()


def _word_at(text: str, start: int, end: int) -> bool:
    """`text[start:end]` is a whole identifier: no identifier character touches it. A JSON escape
    (`\\n`, `\\t`...) right before it counts as a separator."""
    escaped = start > 1 and text[start - 2] == "\\" and text[start - 1] in "nrtbf"
    if start > 0 and _is_identifier_char(text[start - 1]) and not escaped:
        return False
    return end == len(text) or not _is_identifier_char(text[end])


def _has_word(text: str, word: str) -> bool:
    start = text.find(word)
    while start >= 0:
        if _word_at(text, start, start + len(word)):
            return True
        start = text.find(word, start + 1)
    return False


def _has_method_call(text: str, name: str) -> bool:
    """`<expr>.name(` somewhere, allowing whitespace, line continuations and comments around the name."""
    start = text.find(name)
    while start >= 0:
        end = start + len(name)
        if _word_at(text, start, end) and _dot_before(text, start) and _paren_after(text, end):
            return True
        start = text.find(name, start + 1)
    return False


def _dot_before(text: str, index: int) -> bool:
    index -= 1
    crossed_line = False
    while index >= 0 and text[index] in _SPACE:
        crossed_line = crossed_line or text[index] in _NEWLINES
        index -= 1
    if index < 0:
        return False
    if text[index] == ".":
        return True
    if not crossed_line:
        return False
    # A previous line that may end in a comment (`x.  # note` / `backward()` on the next line).
    line_start = max(text.rfind("\n", 0, index), text.rfind("\r", 0, index)) + 1
    return "#" in text[line_start : index + 1]


def _paren_after(text: str, index: int) -> bool:
    while index < len(text) and text[index] in _SPACE:
        index += 1
    return index < len(text) and text[index] in "(#"  # `#`: a comment may come before the `(`


def _looks_like_json(text: str) -> bool:
    """A notebook's raw text: its first character other than whitespace or a BOM is `{`."""
    for char in text:
        if char == "{":
            return True
        if not (char.isspace() or char == "\ufeff"):
            return False
    return False
