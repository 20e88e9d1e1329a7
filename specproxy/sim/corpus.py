"""Built-in text the simulator answers with, the workload classifier and the prompt-length approximation.

Pure: no IO, no clock. Randomness comes from the `random.Random` the caller passes, so the same seed gives the
same answer. Tokens are small pieces of text (a word with its leading space, a punctuation run, or 1-3
Japanese characters), which is roughly what a BPE tokenizer would emit.
"""

from __future__ import annotations

import random
import re
import zlib

EOS_TOKEN_ID = 2

JA_SENTENCES: tuple[str, ...] = (
    "こんにちは！今日はいい天気ですね。",
    "最近、近所に新しいカフェができたんですよ。",
    "週末は友達と映画を見に行く予定です。",
    "そのアイデア、すごく面白いと思います！",
    "実は私も同じことを考えていました。",
    "朝ごはんは何を食べましたか？",
    "昨日は少し寝不足で、まだ眠いです。",
    "駅の近くのラーメン屋さんがおいしいですよ。",
    "無理しないで、ゆっくり休んでくださいね。",
    "それは大変でしたね。お疲れさまでした。",
    "来月、京都に旅行に行こうと思っています。",
    "紅葉の季節はどこも混んでいますよね。",
    "おすすめの本があったら教えてください。",
    "猫を飼い始めてから毎日が楽しいです。",
    "雨の日は家でのんびりするのが好きです。",
    "もしよければ、一緒に行きませんか？",
    "なるほど、そういう考え方もありますね。",
    "ちょっと待ってください、確認してみます。",
    "新しい趣味を始めたいと思っているんです。",
    "最近はよく料理をするようになりました。",
    "カレーを作るときは玉ねぎをじっくり炒めます。",
    "ありがとうございます、とても助かりました！",
    "次の休みには温泉に行きたいですね。",
    "夏は暑いので、冷たいそばがいちばんです。",
    "子どものころはよく公園で遊んでいました。",
    "仕事のあとにジムに行くのが習慣です。",
    "その映画、私も見ました！最後が感動的でしたね。",
    "コーヒーと紅茶なら、どちらが好きですか？",
    "春になったら桜を見に行きましょう。",
    "たしかに、それはいい質問ですね。",
    "少しずつ慣れていけば大丈夫だと思いますよ。",
    "また何かあったら気軽に聞いてくださいね。",
    "日本語の勉強は順調ですか？",
    "今夜は家族と鍋を食べる予定です。",
)

CODE_LINES: tuple[str, ...] = (
    "def filter_even_desc(numbers):\n",
    "    result = [n for n in numbers if n % 2 == 0]\n",
    "    return sorted(result, reverse=True)\n",
    "\n",
    "class LRUCache:\n",
    "    def __init__(self, capacity: int) -> None:\n",
    "        self.capacity = capacity\n",
    "        self.items: dict[str, int] = {}\n",
    "    def get(self, key: str) -> int | None:\n",
    "        if key not in self.items:\n",
    "            return None\n",
    "        value = self.items.pop(key)\n",
    "        self.items[key] = value\n",
    "        return value\n",
    "    def put(self, key: str, value: int) -> None:\n",
    "        if len(self.items) >= self.capacity:\n",
    "            oldest = next(iter(self.items))\n",
    "            del self.items[oldest]\n",
    "        self.items[key] = value\n",
    "\n",
    "def fibonacci(n: int) -> int:\n",
    "    a, b = 0, 1\n",
    "    for _ in range(n):\n",
    "        a, b = b, a + b\n",
    "    return a\n",
    "\n",
    "async def fetch_all(session, urls):\n",
    "    tasks = [session.get(url) for url in urls]\n",
    "    return await asyncio.gather(*tasks)\n",
    "\n",
    "import json\n",
    "from pathlib import Path\n",
    "def load_config(path: Path) -> dict:\n",
    "    with path.open() as f:\n",
    "        return json.load(f)\n",
    "for i, item in enumerate(items):\n",
    '    print(f"{i}: {item}")\n',
    'if __name__ == "__main__":\n',
    "    main()\n",
    "    total = sum(x * x for x in values)\n",
    '    raise ValueError(f"bad value: {value!r}")\n',
)

EN_SENTENCES: tuple[str, ...] = (
    "Octopuses have three hearts and blue blood.",
    "That is a great question, and the short answer is that it depends on the context.",
    "Here are a few things to keep in mind before you start.",
    "The first step is to write down what you want to achieve.",
    "Many people find it helpful to break a large task into smaller pieces.",
    "In general, the simplest solution is also the easiest one to maintain.",
    "The weather in the mountains can change very quickly, so pack a warm layer.",
    "Bread rises because yeast produces carbon dioxide as it ferments the sugars.",
    "If you are unsure, it is always worth asking someone with more experience.",
    "The library opens at nine in the morning and closes at six in the evening.",
    "Regular exercise improves sleep, mood and concentration.",
    "A good summary tells the reader what matters and why.",
    "The river runs through the old town before it reaches the sea.",
    "You can think of a cache as a small, fast copy of data you use often.",
    "Most of the time, the bottleneck is not where you expect it to be.",
    "Let me know if you would like more details on any of these points.",
    "Honey never spoils if it is stored in a sealed container.",
    "The recipe calls for two cups of flour, one egg and a pinch of salt.",
    "Planning a trip is easier when you decide on a budget first.",
    "Some birds can sleep with one half of their brain at a time.",
    "It also helps to review your notes at the end of each week.",
    "The museum has a large collection of paintings from the last century.",
    "Clear communication saves a lot of time in any team.",
    "Tea and coffee both contain caffeine, but in different amounts.",
    "Learning a new language takes patience and daily practice.",
    "The city built a new bridge to reduce traffic in the center.",
    "There are many ways to solve this problem, and each has trade-offs.",
    "Start small, measure the result, and then decide what to change.",
    "The ocean covers more than seventy percent of the planet.",
    "I hope this helps, and good luck with your project!",
)

JSON_OBJECTS: tuple[str, ...] = (
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    '{"id": 42, "tags": ["fast", "cheap"], "ok": true}',
    '{"query": "open issues", "limit": 10, "sort": {"by": "created", "desc": false}}',
    '{"user": {"name": "Ada", "roles": ["admin", "dev"]}, "active": true}',
)

MATH_LINES: tuple[str, ...] = (
    "$$\\int_0^1 x^2 \\, dx = \\frac{1}{3}$$",
    "$$e^{i \\pi} + 1 = 0$$",
    "$$\\sum_{k=1}^{n} k = \\frac{n (n + 1)}{2}$$",
    "$$a^2 + b^2 = c^2$$",
)

# The mixed corpus: spans of these kinds in turn, each followed by a blank line (a span of its own, "whitespace"),
# so that every token has one span type that core/spans.py finds in the text (tests/test_sim_spans.py)
MIXED_SPANS: tuple[str, ...] = ("prose", "code", "cjk", "json", "math")

_CODE_TOKEN = re.compile(r" ?[A-Za-z_]+| ?\d+| ?[^\sA-Za-z_\d]{1,2}|\n| +")
_EN_TOKEN = re.compile(r" ?[A-Za-z']+| ?\d+| ?[^\sA-Za-z'\d]")
_JAPANESE = re.compile(r"[\u3040-\u309f\u30a0-\u30ff\u4e00-\u9fff]")
_CODE_KEYWORDS = re.compile(r"\b(implement|refactor|fix|debug|function|method|compile|python|javascript|rust)\b", re.I)


def classify(text: str) -> str:
    """Pick the built-in workload for a prompt: "code", "ja_chat" or "other"."""
    if "```" in text or re.search(r"(^|\n)\s*(def|class|fn|func|function|import|#include)\s", text):
        return "code"
    braces = text.count("{") + text.count("}") + text.count(";")
    if braces >= 4 and braces * 40 >= len(text):
        return "code"
    if _CODE_KEYWORDS.search(text) and re.search(r"[(){};=]|\w+\.\w+\(", text):
        return "code"
    if _JAPANESE.search(text):
        return "ja_chat"
    return "other"


def token_id(piece: str) -> int:
    """A stable fake vocabulary id for a piece of text (never the EOS id)."""
    return 1000 + zlib.crc32(piece.encode()) % 48000


_CORPUS_SPAN = {"code": "code", "ja": "cjk", "en": "prose"}


class TokenStream:
    """An endless, seeded stream of (text, id) tokens in one corpus; :attr:`span` is the span type (as
    :data:`specproxy.core.spans.SPAN_TYPES` names them) of the token last returned."""

    __slots__ = ("_buffer", "_corpus", "_next_span", "_rng", "_started", "_turn", "span")

    def __init__(self, corpus: str, rng: random.Random) -> None:
        self._corpus = corpus
        self._rng = rng
        self._buffer: list[str] = []
        self._started = False
        self._turn = -1  # the mixed corpus: which of MIXED_SPANS came last (-1: none yet); odd refills are blank lines
        self._next_span = _CORPUS_SPAN.get(corpus, "prose")
        self.span = self._next_span

    def next(self) -> tuple[str, int]:
        self.ahead()
        piece = self._buffer.pop()
        self.span = self._next_span
        return piece, token_id(piece)

    def ahead(self) -> tuple[str, int]:
        """The span type of the next token, and how many tokens of that span are left counting it."""
        while not self._buffer:
            self._buffer = self._refill()
            self._buffer.reverse()
        return self._next_span, len(self._buffer) if self._corpus == "mixed" else 1 << 30

    def _refill(self) -> list[str]:
        first = not self._started
        self._started = True
        rng = self._rng
        if self._corpus == "mixed":
            return self._mixed(rng)
        if self._corpus == "code":
            pieces = ["```", "python", "\n"] if first else []
            start = rng.randrange(len(CODE_LINES))
            for line in CODE_LINES[start : start + rng.randint(2, 6)]:
                pieces.extend(_CODE_TOKEN.findall(line))
            return pieces
        if self._corpus == "ja":
            return _ja_pieces(rng.choice(JA_SENTENCES), rng)
        sentence = rng.choice(EN_SENTENCES)
        return _EN_TOKEN.findall(sentence if first else " " + sentence)

    def _mixed(self, rng: random.Random) -> list[str]:
        """One span of the mixed corpus, or the blank line after one."""
        if self._next_span != "whitespace" and self._turn >= 0:
            self._next_span = "whitespace"
            return ["\n", "\n"]
        self._turn = (self._turn + 1) % len(MIXED_SPANS)
        kind = self._next_span = MIXED_SPANS[self._turn]
        if kind == "code":
            pieces = ["```", "python", "\n"]
            start = rng.randrange(len(CODE_LINES) - 3)
            for line in CODE_LINES[start : start + rng.randint(2, 4)]:
                pieces.extend(_CODE_TOKEN.findall(line))
            return [*pieces, "```"]
        if kind == "cjk":
            return [piece for sentence in rng.sample(JA_SENTENCES, 2) for piece in _ja_pieces(sentence, rng)]
        if kind == "json":
            return _CODE_TOKEN.findall(rng.choice(JSON_OBJECTS))
        if kind == "math":
            line = rng.choice(MATH_LINES)
            return ["$$", *_CODE_TOKEN.findall(line[2:-2]), "$$"]
        text = " ".join(rng.sample(_PLAIN_EN, 2))
        return _EN_TOKEN.findall(text)


_PLAIN_EN = tuple(s for s in EN_SENTENCES if "-" not in s)  # "-" alone reads as markup (whitespace)


def _ja_pieces(sentence: str, rng: random.Random) -> list[str]:
    """A Japanese sentence as tokens of 1-3 characters."""
    out: list[str] = []
    i = 0
    while i < len(sentence):
        n = rng.randint(1, 3)
        out.append(sentence[i : i + n])
        i += n
    return out
