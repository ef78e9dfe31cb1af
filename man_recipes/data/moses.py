"""Moses text processing, byte-identical to the Perl scripts fairseq's recipes run.

fairseq's ``prepare-iwslt14.sh`` / ``prepare-wmt14en2de.sh`` pipe text through mosesdecoder's
``tokenizer.perl -l LANG [-a]``, ``lowercase.perl``, ``normalize-punctuation.perl`` and
``clean-corpus-n.perl``. sacremoses re-implements them with a few differences that change the
data (sacremoses 0.1-0.2):

* it never applies tokenizer.perl's "the last word of a line always splits off its period"
  rule ("the U.S." stays "the U.S." instead of "the U.S ."),
* its character tables lack the Han / Kana / Hangul letters that Perl's ``\\p{IsAlnum}``
  contains, so it puts a space between every CJK character,
* its punctuation normaliser sees a line without its newline, so German / French / Spanish
  ``."`` at the end of a line is not turned into ``".`` (the Perl script reads the newline and
  does move it).

So the tokenizer rules are written here once, as in tokenizer.perl's ``tokenize`` sub, with
the ``regex`` module's Unicode properties standing in for Perl's (``\\p{IsAlnum}`` =
Alphabetic + Nd, ``\\p{IsAlpha}`` = Alphabetic, ``\\p{IsN}`` = N, ``\\p{IsLower}`` = Lowercase).
sacremoses still provides the non-breaking prefix lists (the same files as Moses') and the
punctuation normaliser. tests/test_tokenizer.py holds expectations produced by the Perl
scripts.
"""

from functools import lru_cache

import regex

_ALNUM = r"\p{Alphabetic}\p{Nd}"
_ALPHA = r"\p{Alphabetic}"

_SPACES = regex.compile(r"\s+")
_CONTROL = regex.compile(r"[\x00-\x1f]")
_PAD_SPECIAL = regex.compile(rf"([^{_ALNUM}\s\.'`,\-])")
# fi / sv: ":" inside words (USA:n) unless no lower-case letter follows; tdt: the same for "'"
_PAD_SPECIAL_FI_SV = [(regex.compile(rf"([^{_ALNUM}\s\.:'`,\-])"), r" \1 "), (regex.compile(r"(:)(?=$|[^\p{Ll}])"), r" \1 ")]
_PAD_SPECIAL_TDT = [(_PAD_SPECIAL, r" \1 "), (regex.compile(r"(')(?=$|[^\p{Ll}])"), r" \1 ")]
# ca: tokenizer.perl has no "use utf8", so its "·" is the two characters "Â·": both are kept
# inside words, and its second rule (split "·" unless a lower-case letter follows) never fires
_PAD_SPECIAL_CA = [(regex.compile(rf"([^{_ALNUM}\s\.\u00c2\u00b7'`,\-])"), r" \1 ")]
_AGGRESSIVE_HYPHEN = regex.compile(rf"([{_ALNUM}])\-(?=[{_ALNUM}])")
_DOTMULTI = regex.compile(r"\.([\.]+)")
_DOTMULTI_NEXT = regex.compile(r"DOTMULTI\.([^\.])")
_COMMA_AFTER_NONNUM = regex.compile(r"([^\p{N}]),")
_COMMA_BEFORE_NONNUM = regex.compile(r",([^\p{N}])")
_COMMA_FINAL_NUM = regex.compile(r"(\p{N}),$")
_APOS_EN = [
    (regex.compile(rf"([^{_ALPHA}])'([^{_ALPHA}])"), r"\1 ' \2"),
    (regex.compile(rf"([^{_ALPHA}\p{{N}}])'([{_ALPHA}])"), r"\1 ' \2"),
    (regex.compile(rf"([{_ALPHA}])'([^{_ALPHA}])"), r"\1 ' \2"),
    (regex.compile(rf"([{_ALPHA}])'([{_ALPHA}])"), r"\1 '\2"),
    (regex.compile(r"(\p{N})'(s)"), r"\1 '\2"),
]
_APOS_LEFT = [  # fr, it, ga, ca: split contractions left (l' homme)
    (regex.compile(rf"([^{_ALPHA}])'([^{_ALPHA}])"), r"\1 ' \2"),
    (regex.compile(rf"([^{_ALPHA}])'([{_ALPHA}])"), r"\1 ' \2"),
    (regex.compile(rf"([{_ALPHA}])'([^{_ALPHA}])"), r"\1 ' \2"),
    (regex.compile(rf"([{_ALPHA}])'([{_ALPHA}])"), r"\1' \2"),
]
_WORD_WITH_PERIOD = regex.compile(r"(\S+)\.")
_HAS_ALPHA = regex.compile(rf"[{_ALPHA}]")
_STARTS_LOWER = regex.compile(r"\p{Lowercase}")
_STARTS_DIGIT = regex.compile(r"[0-9]")
_FINAL_PERIOD_QUOTE = regex.compile(r"\.' ?$")
_WHITESPACE = regex.compile(r"\s")
# tokenizer.perl's escaping, in its order (& first so the entities are not escaped again)
_ESCAPES = [("&", "&amp;"), ("|", "&#124;"), ("<", "&lt;"), (">", "&gt;"), ("'", "&apos;"),
            ('"', "&quot;"), ("[", "&#91;"), ("]", "&#93;")]


@lru_cache(maxsize=None)
def nonbreaking_prefixes(lang):
    """{prefix: 1 (always non-breaking) or 2 (only before a number)} as tokenizer.perl loads them
    (falls back to English for a language without a list, as the Perl script does)."""
    from sacremoses.corpus import NonbreakingPrefixes

    out = {}
    for item in NonbreakingPrefixes().words(lang):  # comment lines skipped; English if no list
        m = regex.match(r"(.*)[\s]+(\#NUMERIC_ONLY\#)", item)
        if m:
            out[m.group(1)] = 2
        else:
            out[item] = 1
    return out


def tokenize(line, lang, aggressive=False, escape=True):
    """One line through ``tokenizer.perl -l LANG [-a] [-no-escape]`` (without its newline).

    A blank line is returned unchanged, as the Perl script prints it. Note that a line ending
    in ``.'`` keeps the trailing space the Perl script leaves there.
    """
    if not line.strip():
        return line
    text = _SPACES.sub(" ", f" {line} ")
    text = _CONTROL.sub("", text)
    text = regex.sub(" +", " ", text).strip(" ")
    padding = {"fi": _PAD_SPECIAL_FI_SV, "sv": _PAD_SPECIAL_FI_SV, "tdt": _PAD_SPECIAL_TDT, "ca": _PAD_SPECIAL_CA}
    for pattern, repl in padding.get(lang, [(_PAD_SPECIAL, r" \1 ")]):
        text = pattern.sub(repl, text)
    if aggressive:
        text = _AGGRESSIVE_HYPHEN.sub(r"\1 @-@ ", text)
    # multi-dots stay together
    text = _DOTMULTI.sub(r" DOTMULTI\1", text)
    while "DOTMULTI." in text:
        text = _DOTMULTI_NEXT.sub(r"DOTDOTMULTI \1", text)
        text = text.replace("DOTMULTI.", "DOTDOTMULTI")
    # "," is split off except between two digits (5,300)
    text = _COMMA_AFTER_NONNUM.sub(r"\1 , ", text)
    text = _COMMA_BEFORE_NONNUM.sub(r" , \1", text)
    text = _COMMA_FINAL_NUM.sub(r"\1 ,", text)
    if lang == "en":
        for pattern, repl in _APOS_EN:
            text = pattern.sub(repl, text)
    elif lang in ("fr", "it", "ga", "ca"):
        for pattern, repl in _APOS_LEFT:
            text = pattern.sub(repl, text)
    elif lang in ("so", "tdt"):  # glottal stops stay inside words
        for pattern, repl in _APOS_LEFT[:3]:
            text = pattern.sub(repl, text)
    else:
        text = text.replace("'", " ' ")
    text = _split_periods(text, nonbreaking_prefixes(lang))
    text = regex.sub(" +", " ", text).strip(" ")
    text = _FINAL_PERIOD_QUOTE.sub(" . ' ", text, count=1)
    while "DOTDOTMULTI" in text:
        text = text.replace("DOTDOTMULTI", "DOTMULTI.")
    text = text.replace("DOTMULTI", ".")
    if escape:
        for char, entity in _ESCAPES:
            text = text.replace(char, entity)
    return text


def _split_periods(text, prefixes):
    """tokenizer.perl's word loop: a word's final period is split off unless the word is a
    non-breaking prefix, contains another period and a letter, or precedes a lower-case word;
    the last word of the line always splits (Moses since 2017; sacremoses lacks this rule)."""
    words = _WHITESPACE.split(text)
    while words and words[-1] == "":  # Perl's split drops trailing empty fields only
        words.pop()
    last = len(words) - 1
    for i, word in enumerate(words):
        m = _WORD_WITH_PERIOD.fullmatch(word)
        if not m:
            continue
        pre = m.group(1)
        nxt = words[i + 1] if i < last else None
        if i == last:
            words[i] = pre + " ."
        elif (("." in pre and _HAS_ALPHA.search(pre)) or prefixes.get(pre) == 1
              or (nxt is not None and _STARTS_LOWER.match(nxt))):
            pass
        elif prefixes.get(pre) == 2 and nxt is not None and _STARTS_DIGIT.match(nxt):
            pass
        else:
            words[i] = pre + " ."
    return "".join(w + " " for w in words)


def lowercase(line):
    """``lowercase.perl`` (Perl's ``lc``): like str.lower() but without Python's word-final
    sigma rule (Perl maps every capital sigma to σ)."""
    return line.replace("\u03a3", "\u03c3").lower()


_NORMALIZERS = {}


def normalize_punctuation(line, lang):
    """``normalize-punctuation.perl -l LANG`` via sacremoses, fed the line *with* its newline as
    the Perl script reads it (so de/fr/es ``."`` at the end of a line becomes ``".`` too)."""
    from sacremoses import MosesPunctNormalizer

    norm = _NORMALIZERS.get(lang)
    if norm is None:
        norm = _NORMALIZERS[lang] = MosesPunctNormalizer(lang=lang)
    return norm.normalize(line + "\n").rstrip("\n")


_NONPRINT = regex.compile(r"\p{C}")


def remove_non_printing(line):
    """``remove-non-printing-char.perl``: every \\p{C} character becomes a space."""
    return _NONPRINT.sub(" ", line)
