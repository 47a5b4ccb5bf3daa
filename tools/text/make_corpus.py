#!/usr/bin/env python3
"""Builds the tokenizer parity/benchmark corpus: >= 5 MB of real and synthetic text, as JSON lines (one document per
line), deterministic for a given machine and seed.

Real text comes from what every machine of this project has offline: the Python standard library (source code),
Markdown/reStructuredText/plain-text documentation shipped with Python packages and Debian, gettext translation
catalogs (/usr/share/locale, dozens of languages) and Python's CJK test texts. Synthetic parts add multilingual
prose, emoji sequences, whitespace and digit stress, added-token look-alikes and random Unicode fuzz.
    python3 tools/text/make_corpus.py OUT.jsonl [--seed N] [--mb 6]
"""
import argparse
import glob
import gettext
import gzip
import json
import os
import random
import sys
import sysconfig

DOC_BYTES = 4096  # documents are cut at line boundaries near this size so a mismatch points at a small input


def chunk_lines(text, limit=DOC_BYTES):
    """Yields pieces of `text` of about `limit` bytes, cut after a newline (never inside a line unless it is huge)."""
    buf, size = [], 0
    for line in text.splitlines(keepends=True):
        b = len(line.encode("utf-8"))
        if size + b > limit and buf:
            yield "".join(buf)
            buf, size = [], 0
        buf.append(line)
        size += b
    if buf:
        yield "".join(buf)


def read_text(path):
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                data = f.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError):
        return None


def take(paths, budget, out):
    """Appends documents from `paths` (in the given order) until `budget` bytes are collected."""
    got = 0
    for p in paths:
        t = read_text(p)
        if not t:
            continue
        for doc in chunk_lines(t):
            out.append(doc)
            got += len(doc.encode("utf-8"))
            if got >= budget:
                return got
    return got


def stdlib_sources():
    lib = sysconfig.get_paths()["stdlib"]
    return sorted(p for p in glob.glob(os.path.join(lib, "**", "*.py"), recursive=True) if "site-packages" not in p)


def documentation_files():
    lib = sysconfig.get_paths()["stdlib"]
    pats = [os.path.join(lib, "site-packages", "**", "*.md"), os.path.join(lib, "site-packages", "**", "METADATA"),
            os.path.join(lib, "**", "*.rst"), "/usr/share/doc/**/*.md", "/usr/share/doc/**/README*",
            "/usr/share/doc/**/changelog*.gz", "/usr/share/common-licenses/*"]
    files = set()
    for pat in pats:
        files.update(glob.glob(pat, recursive=True))
    return sorted(f for f in files if os.path.isfile(f))


def translation_catalogs(budget, out):
    """Translated UI strings in many languages (real multilingual prose), one language at a time."""
    got = 0
    by_lang = {}
    for mo in sorted(glob.glob("/usr/share/locale/*/LC_MESSAGES/*.mo")):
        lang = mo.split("/")[4]
        by_lang.setdefault(lang, []).append(mo)
    per_lang = max(budget // max(len(by_lang), 1), 2000)
    for lang in sorted(by_lang):
        lang_got, texts = 0, []
        for mo in by_lang[lang]:
            try:
                with open(mo, "rb") as f:
                    cat = gettext.GNUTranslations(f)._catalog
            except Exception:
                continue
            for k, v in cat.items():
                if isinstance(v, str) and v:
                    texts.append(v)
                    lang_got += len(v.encode("utf-8"))
            if lang_got >= per_lang:
                break
        for doc in chunk_lines("\n".join(texts)):
            out.append(doc)
            got += len(doc.encode("utf-8"))
        if got >= budget:
            break
    return got


def cjk_test_texts(out):
    lib = sysconfig.get_paths()["stdlib"]
    return take(sorted(glob.glob(os.path.join(lib, "test", "cjkencodings", "*-utf8.txt"))), 1 << 30, out)


# --- synthetic text ------------------------------------------------------------------------------------------------

WORDS = {
    "en": "the quick brown fox jumps over lazy dog while engineers tokenize prompts carefully".split(),
    "de": "Straße Größe Übermäßig schön Bäume Häuser Füße heißt Mädchen Käse".split(),
    "fr": "où été déjà naïve château garçon façade cœur élève fenêtre".split(),
    "es": "niño año mañana corazón canción pingüino ¿qué ¡hola! señor".split(),
    "ru": "Привет мир язык программирование токенизатор быстрый текст слово".split(),
    "el": "Ελληνικά γλώσσα κείμενο λέξη αριθμός ψυχή".split(),
    "ar": "العربية مرحبا بالعالم لغة كتاب مدرسة".split(),
    "he": "עברית שלום עולם שפה ספר".split(),
    "hi": "हिन्दी नमस्ते दुनिया भाषा किताब".split(),
    "th": "ภาษาไทย สวัสดี ชาวโลก หนังสือ".split(),
    "zh": "你好 世界 今天 天气 很好 中文 分词 测试 模型 语言".split(),
    "ja": "日本語 の テキスト ひらがな カタカナ 東京 漢字 ｶﾀｶﾅ".split(),
    "ko": "한국어 문장 입니다 안녕하세요 세계 언어".split(),
    "vi": "Tiếng Việt xin chào thế giới ngôn ngữ".split(),
}
PUNCT = [".", ",", "!", "?", "，", "。", "！", "？", "、", "；", "：", "…", "—", "«", "»", "“", "”", "‘", "’", "(", ")"]
EMOJI = ["😀", "🙂", "🎉", "👍", "👍🏽", "👨‍👩‍👧‍👦", "❤️", "🇯🇵", "🇺🇸", "🏳️‍🌈", "🤖", "🔥", "✨", "🧑🏿‍💻", "☕", "🦀"]
SPECIALS = ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜", "<｜begin▁of▁sentence｜>",
            "<｜end▁of▁sentence｜>", "<|EOT|>", "<｜User", "<|User|>", "<dsml:", "<｜DSML｜tool_calls>",
            "<|place_holder_mm_span_0021|>", "<|place_holder_mm_span_0001|>", "<｜place▁holder▁no▁7｜>"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2003", "\u200b", "\u2028", "\u0085", "\ufeff"]


def multilingual_prose(rng, budget, out):
    got = 0
    langs = sorted(WORDS)
    while got < budget:
        parts = []
        for _ in range(rng.randint(20, 200)):
            lang = rng.choice(langs)
            parts.append(rng.choice(WORDS[lang]))
            r = rng.random()
            if r < 0.15:
                parts.append(rng.choice(PUNCT))
            if r < 0.05:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 12))))
            parts.append(rng.choice([" ", " ", " ", "", "\n", "  "]))
        doc = "".join(parts)
        out.append(doc)
        got += len(doc.encode("utf-8"))
    return got


def emoji_text(rng, budget, out):
    got = 0
    while got < budget:
        parts = []
        for _ in range(rng.randint(10, 100)):
            parts.append(rng.choice(EMOJI + [" ", "  ", "a", "ok", "\n", "x" + rng.choice(EMOJI)]))
        doc = "".join(parts)
        out.append(doc)
        got += len(doc.encode("utf-8"))
    return got


def whitespace_digits(rng, budget, out):
    got = 0
    while got < budget:
        parts = []
        for _ in range(rng.randint(10, 80)):
            k = rng.random()
            if k < 0.3:
                parts.append(rng.choice(SPACES) * rng.randint(1, 70))
            elif k < 0.6:
                parts.append("".join(rng.choice("0123456789") for _ in range(rng.randint(1, 40))))
            elif k < 0.7:
                parts.append(rng.choice(["١٢٣٤", "½", "²", "①", "Ⅻ", "〇", "１２３", "٣.١٤"]))
            elif k < 0.8:
                parts.append(rng.choice(SPECIALS))
            else:
                parts.append(rng.choice(["def", "x=1", "a.b", "~/", "'s", "--flag", "==", "->", "{}", "()", "word"]))
        doc = "".join(parts)
        out.append(doc)
        got += len(doc.encode("utf-8"))
    return got


def random_code_point(rng):
    r = rng.random()
    if r < 0.25:
        return chr(rng.randint(0x20, 0x7E))
    if r < 0.35:
        return rng.choice(SPACES)
    if r < 0.45:
        return chr(rng.randint(0x80, 0x24F))
    if r < 0.55:
        return chr(rng.choice([rng.randint(0x4E00, 0x9FFF), rng.randint(0x3040, 0x30FF), rng.randint(0xAC00, 0xD7A3)]))
    if r < 0.62:
        return chr(rng.randint(0x300, 0x36F))  # combining marks
    if r < 0.70:
        return chr(rng.randint(0x1F300, 0x1FAFF))
    if r < 0.75:
        return chr(rng.randint(0, 0x1F))
    if r < 0.80:
        return rng.choice(SPECIALS)
    while True:  # any scalar value, all planes
        c = rng.randint(0, 0x10FFFF)
        if not 0xD800 <= c <= 0xDFFF:
            return chr(c)


def unicode_fuzz(rng, budget, out):
    got = 0
    while got < budget:
        doc = "".join(random_code_point(rng) for _ in range(rng.randint(1, 400)))
        out.append(doc)
        got += len(doc.encode("utf-8"))
    return got


def build(seed=1234, mb=6.0):
    rng = random.Random(seed)
    total = int(mb * 1_000_000)
    docs, parts = [], {}
    parts["python_source"] = take(stdlib_sources(), int(total * 0.34), docs)
    parts["markdown_docs"] = take(documentation_files(), int(total * 0.16), docs)
    parts["translations"] = translation_catalogs(int(total * 0.14), docs)
    parts["cjk_texts"] = cjk_test_texts(docs)
    parts["multilingual_synthetic"] = multilingual_prose(rng, int(total * 0.08), docs)
    parts["emoji"] = emoji_text(rng, int(total * 0.04), docs)
    parts["whitespace_digits_specials"] = whitespace_digits(rng, int(total * 0.06), docs)
    used = sum(parts.values())
    parts["unicode_fuzz"] = unicode_fuzz(rng, max(total - used, int(total * 0.1)), docs)
    return docs, parts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--mb", type=float, default=6.0)
    a = ap.parse_args()
    docs, parts = build(a.seed, a.mb)
    with open(a.out, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    total = sum(len(d.encode("utf-8")) for d in docs)
    print(json.dumps({"documents": len(docs), "bytes": total, "parts": parts}), file=sys.stderr)


if __name__ == "__main__":
    main()
