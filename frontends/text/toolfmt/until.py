"""GBNF rules for "any text up to a delimiter", as llama.cpp's PEG parser
writes them (common/peg-parser.cpp gbnf_excluding_grammar /
gbnf_including_grammar): an Aho-Corasick automaton over the delimiters,
one rule per state.

``excluding(prefix, words)``: text that contains none of ``words`` (every
state accepts; a character that would complete a word has no
alternative). ``including(prefix, words)``: text up to and including the
first of ``words``. Both return (the start rule's name, the rules). The
states are numbered as llama.cpp's trie numbers them (insertion order), so
the rules read as llama-server's grammar does."""
from __future__ import annotations


class _Automaton:
    """common_aho_corasick: trie goto, failure links, the longest match per state."""

    def __init__(self, words: list[str]):
        self.goto: list[dict[str, int]] = [{}]
        self.match: list[int] = [-1]
        for w_i, w in enumerate(words):
            s = 0
            for ch in w:
                if ch not in self.goto[s]:
                    self.goto.append({})
                    self.match.append(-1)
                    self.goto[s][ch] = len(self.goto) - 1
                s = self.goto[s][ch]
            self.match[s] = w_i
        self.alphabet = sorted({ch for w in words for ch in w})
        self.fail = [0] * len(self.goto)
        queue = list(self.goto[0].values())
        while queue:  # BFS: a state's failure link is settled before its children's
            s = queue.pop(0)
            if self.match[s] < 0:
                self.match[s] = self.match[self.fail[s]]
            for ch, d in self.goto[s].items():
                f = self.fail[s]
                while f and ch not in self.goto[f]:
                    f = self.fail[f]
                self.fail[d] = self.goto[f][ch] if ch in self.goto[f] and self.goto[f][ch] != d else 0
                queue.append(d)

    def next(self, s: int, ch: str) -> int:
        while s and ch not in self.goto[s]:
            s = self.fail[s]
        return self.goto[s].get(ch, 0)


def _esc(ch: str) -> str:
    c = ord(ch)
    if ch in "-][\\":
        return "\\" + ch
    if ch in "\n\t\r":
        return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}[ch]
    if 0x20 <= c <= 0x7E:
        return ch
    if c <= 0xFF:
        return f"\\x{c:02X}"
    return f"\\u{c:04X}" if c <= 0xFFFF else f"\\U{c:08X}"


def _cls(chars: list[str], negate: bool) -> str:
    return ("[^" if negate else "[") + "".join(_esc(c) for c in chars) + "]"


def _rules(prefix: str, words: list[str], including: bool) -> tuple[str, list[str]]:
    ac = _Automaton(words)

    def name(s: int) -> str:
        return prefix if s == 0 else f"{prefix}-{s:02d}"

    rules = []
    for q in range(len(ac.goto)):
        if ac.match[q] >= 0:
            continue  # a match state: the text ends there (including) or never gets there (excluding)
        buckets: dict[int, list[str]] = {}
        completing, specific = [], []
        for ch in ac.alphabet:
            d = ac.next(q, ch)
            if ac.match[d] >= 0:
                completing.append(ch)
                specific.append(ch)
            elif d != 0:
                buckets.setdefault(d, []).append(ch)
                specific.append(ch)
        moves = [f"{_cls(cs, False)} {name(d)}" for d, cs in sorted(buckets.items())]
        rest = f"{_cls(specific, True)} {name(0)}"
        if including:
            rhs = " | ".join(([_cls(completing, False)] if completing else []) + moves + [rest])
        else:
            rhs = "|" + "".join(f" {m} |" for m in moves) + " " + rest
        rules.append(f"{name(q)} ::= {rhs}")
    return name(0), rules


def excluding(prefix: str, words: list[str]) -> tuple[str, list[str]]:
    return _rules(prefix, words, False)


def including(prefix: str, words: list[str]) -> tuple[str, list[str]]:
    return _rules(prefix, words, True)
