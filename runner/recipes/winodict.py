"""WinoDict construction (Eisenschlos et al., EACL 2023, §2 and appendix B): Winograd twins whose key concept is
replaced by a synthetic word, with that word's definition, built from the key concepts prepared once by
``scripts/winodict_concepts.py`` (``data/winodict/concepts.jsonl``) and the authors' word list.

One item per twin and log-probability bucket, in the chosen prompt form (``strategy``); and, for the ``unchanged``
bucket, one more without any definition (strategy ``none``, id ``<schema>-<twin>-unchanged-none``): the paper's
Table 2 "Original" column is the original task as it was (its Table 3's "Original / Empty"), while the original
words with their definition as a suffix are Table 3's "Original / Def Suffix", a setting of its own. The synthetic
word is drawn, as the authors' generator does, from the words of ``original_words.tsv`` whose log-probability falls
in the bucket (five equal-width buckets over (-30, -10]: ``prob1_of_5`` is the least likely, ``prob5_of_5`` the
most; ``unchanged`` keeps the original word, i.e. the original task), leaving out the words WordNet already knows
(``wordnet_known.txt``). The draw is ``random.Random(f"{seed}:{schema}").choice(bucket)``: both twins of a schema
get the same root, and an item's word does not depend on row order or on the other rows. The root is inflected with
the word list's column for the key word's tag (VB, VBD, VBG, VBN, VBZ, NN, NNS, JJ; RB takes the JJ column, as in
the generator; JJR and RBR take the JJ form made comparative: "more X" when it is longer than six letters, else the
suffix "-er" by the usual spelling rules).

Scoring follows the paper (§2.3, Trinh and Le's partial scoring): the Winograd pronoun is the blank; the text up to
it with each option substituted gives the two ``contexts``, and the rest of the sentence (with the definition
sentence after it in the ``*_last`` strategies, the headline setting being ``definition_last``) is the shared
``continuation`` whose log-likelihood is compared; ``contexts[label] + continuation`` is the solved text. In the
``*_first`` strategies the definition (or synonym) sentence comes before each context. ``examples`` holds five
solved texts of the same bucket and strategy (the Original items without a definition get examples without one),
drawn with ``random.Random(f"{seed}:{schema}:shots")`` from other
schemas whose synthetic root differs (the generator's compatibility rule), taking the same twin of each, as the
generator does; a k-shot prompt is the first k joined by a blank line ("\\n\\n") before the item's context.

Where this differs from the paper's generator:

- Winograd comes from the WSC collection (285 schemas, 92 twin pairs kept), not TFDS's wsc273, and tags come from
  a documented rule instead of spaCy (see the script).
- An option put in place of a possessive pronoun ("his", "its", "their", and "her" before a word) gets "'s"
  ("toward Jim's empty glass"); one that is not a name is lower-cased inside a sentence ("the demonstrators") and
  capitalised at its start. The generator substitutes the option as it is.
- The options keep the collection's order (the generator shuffles the pair's order once); ``label`` flips between
  twins either way.
- The comparative's "more X" is chosen by length alone (the generator also picks it at random in a quarter of
  the short words).
- The synonym sentence names the original lemma, as the generator does ("The meaning of plest is similar to
  fear."); ``args.synonym: wordnet`` names the WordNet synonym of ``concepts.jsonl`` instead (the lemma when
  WordNet has none).
- With ``--limit``, the shots come from the rows of the slice.
- A definition ending in "etc." ends the definition sentence with one full stop, not two.

The word list is read from ``args.words`` / ``args.exclude`` (default ``data/winodict/``). Those files are not
part of the stage's content address: after editing them, re-run with ``runner submit --replan``.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from runner.bundled import ROOT as BUNDLED
from runner.errors import RunnerError
from runner.recipes import Context, Outcome, step

#: the authors' word lists, bundled with the package (runner/bundled/data/winodict)
DATA = BUNDLED / "data" / "winodict"
MIN_LOGPROB, MAX_LOGPROB, PROB_BUCKETS = -30.0, -10.0, 5
BUCKETS = tuple(f"prob{i + 1}_of_{PROB_BUCKETS}" for i in range(PROB_BUCKETS)) + ("unchanged",)
STRATEGIES = ("none", "definition_first", "definition_last", "synonym_first", "synonym_last",
              "definition_synonym_first", "definition_synonym_last")
SHOTS = 5

#: the paper's templates (appendix B, table 6), by the key word's coarse part of speech
DEFINITION_TEMPLATES = {
    "VERB": "The verb to {lemma} means to {definition}.",
    "NOUN": "The word {lemma} refers to {definition}.",
    "ADJ": "The meaning of {lemma} is {definition}.",
    "ADV": "The word {lemma} means {definition}.",
}
SYNONYM_TEMPLATE = "The meaning of {lemma} is similar to {synonym}."

FORM_COLUMNS = ("VB", "VBD", "VBG", "VBN", "VBZ", "JJ", "NN", "NNS")
TAGS = (*FORM_COLUMNS, "RB", "JJR", "RBR")
FIELDS = ("schema", "twin", "sentence", "pronoun", "pronoun_at", "options", "label", "word", "word_at", "lemma",
          "tag", "pos", "definition")
_POSSESSIVE = {"his", "its", "their"}
_LOWER_FIRST = {"the", "a", "an", "my", "his", "her", "its", "our", "their", "your", "this", "that", "these",
                "those", "some"}


@dataclass(frozen=True)
class Word:
    """One synthetic word of the authors' list: its root, log-probability and a form per tag."""

    root: str
    logprob: float
    forms: dict[str, str]


def bucket_of(logprob: float) -> str | None:
    """The bucket a log-probability falls in, as the generator computes it: ``i < (lp + 30) / 4 <= i + 1``."""
    scaled = (logprob - MIN_LOGPROB) * PROB_BUCKETS / (MAX_LOGPROB - MIN_LOGPROB)
    for i in range(PROB_BUCKETS):
        if i < scaled <= i + 1:
            return BUCKETS[i]
    return None


def _data_file(value: Any, default: str) -> Path:
    path = Path(str(value)) if value else DATA / default
    if not path.is_absolute() and not path.exists():
        path = BUNDLED / path  # a bundled file (data/winodict/...), wherever the job runs from
    if not path.exists():
        raise RunnerError(f"winodict.items: no file {path}")
    return path


@lru_cache(maxsize=4)
def load_words(words: Path, exclude: Path) -> dict[str, tuple[Word, ...]]:
    """The candidate words of each probability bucket, in file order, without those in ``exclude``."""
    known = set(exclude.read_text(encoding="utf-8").split())
    buckets: dict[str, list[Word]] = {name: [] for name in BUCKETS[:PROB_BUCKETS]}
    with open(words, encoding="utf-8") as lines:
        for line in lines:
            root, logprob, morph = line.rstrip("\n").split("\t")
            bucket = bucket_of(float(logprob))
            if bucket is None or root in known:
                continue
            forms = dict(part.split(":", 1) for part in morph.split(","))
            buckets[bucket].append(Word(root, float(logprob), forms))
    return {name: tuple(found) for name, found in buckets.items()}


def comparative(adjective: str) -> str:
    """A comparative of a synthetic adjective: "more X" for a long one, else X + "er" ("plesty" -> "plestier",
    "sparne" -> "sparner", "blat" -> "blatter")."""
    if len(adjective) > 6:
        return f"more {adjective}"
    if re.search(r"[^aeiou]y$", adjective):
        return adjective[:-1] + "ier"
    if adjective.endswith("e"):
        return adjective + "r"
    if re.search(r"(?:^|[^aeiou])[aeiou][^aeiouwxy]$", adjective):
        return adjective + adjective[-1] + "er"
    return adjective + "er"


def inflect(word: Word, tag: str) -> tuple[str, str]:
    """(the form to put in the sentence, the lemma to define) for a key word tagged ``tag``."""
    if tag.startswith("VB"):
        return word.forms[tag], word.forms["VB"]
    if tag.startswith("NN"):
        return word.forms[tag], word.forms["NN"]
    adjective = word.forms["JJ"]
    if tag in ("JJ", "RB"):
        return adjective, adjective
    return comparative(adjective), adjective  # JJR, RBR


def definition_sentence(pos: str, lemma: str, definition: str) -> str:
    """The paper's sentence for ``pos``; a definition ending in "etc." does not get a second full stop."""
    return DEFINITION_TEMPLATES[pos].format(lemma=lemma, definition=definition.removesuffix("."))


def synonym_sentence(lemma: str, synonym: str) -> str:
    return SYNONYM_TEMPLATE.format(lemma=lemma, synonym=synonym)


def fill(option: str, pronoun: str, after: str) -> str:
    """``option`` as it reads in the pronoun's place: possessive for a possessive pronoun, capitalised at a
    sentence's start (the pronoun is capitalised there), a leading determiner lower-cased elsewhere."""
    lowered = pronoun.lower()
    common = option.split(" ", 1)[0].lower() in _LOWER_FIRST or option[:1].islower()  # not a name
    if lowered in _POSSESSIVE or (lowered == "her" and re.match(r"\s+\w", after)):
        option += "'" if common and option.endswith("s") else "'s"
    if pronoun[:1].isupper():
        return option[:1].upper() + option[1:]
    return option[:1].lower() + option[1:] if common else option


def _around(strategy: str, definition: str, synonym: str) -> tuple[str, str]:
    """(text before the sentence, text after it) in a strategy."""
    if strategy == "none":
        return "", ""
    kind, place = strategy.rsplit("_", 1)
    info = {"definition": definition, "synonym": synonym, "definition_synonym": f"{definition} {synonym}"}[kind]
    return (info, "") if place == "first" else ("", info)


def build_item(row: dict[str, Any], bucket: str, words: dict[str, tuple[Word, ...]], seed: Any, strategy: str,
               synonym_source: str) -> dict[str, Any] | str:
    """One WinoDict item for a concept row and bucket (without its examples), or why there is none."""
    if any(row.get(name) is None for name in FIELDS):
        return "row lacks a concept field"
    tag, word, sentence = row["tag"], row["word"], row["sentence"]
    if tag not in TAGS:
        return f"no inflection for tag {tag}"
    at, p, pronoun = int(row["word_at"]), int(row["pronoun_at"]), row["pronoun"]
    if sentence[at:at + len(word)] != word or sentence[p:p + len(pronoun)] != pronoun:
        return "key word or pronoun not where the row says"
    if bucket == "unchanged":
        fake_word, fake_lemma, root, logprob = word, row["lemma"], row["lemma"], None
    else:
        chosen = random.Random(f"{seed}:{row['schema']}").choice(words[bucket])
        fake_word, fake_lemma = inflect(chosen, tag)
        root, logprob = chosen.root, chosen.logprob
        if word[:1].isupper():
            fake_word = fake_word[:1].upper() + fake_word[1:]
    text = sentence[:at] + fake_word + sentence[at + len(word):]
    if at < p:
        p += len(fake_word) - len(word)
    before, after = text[:p], text[p + len(pronoun):]
    options = [str(option) for option in row["options"]]
    filled = [fill(option, pronoun, after) for option in options]
    defined = definition_sentence(row["pos"], fake_lemma, row["definition"])
    synonym = row["lemma"] if synonym_source == "lemma" else (row.get("synonym") or row["lemma"])
    synonymous = synonym_sentence(fake_lemma, synonym)
    prefix, suffix = _around(strategy, defined, synonymous)
    contexts = [f"{prefix} {before}{form}" if prefix else before + form for form in filled]
    continuation = f"{after} {suffix}" if suffix else after
    item_id = f"{row['schema']}-{row['twin']}-{bucket}"
    return {
        "_id": item_id, "id": item_id, "schema": row["schema"], "twin": row["twin"], "bucket": bucket,
        "strategy": strategy, "sentence": f"{before}_{after}", "option1": options[0], "option2": options[1],
        "label": int(row["label"]), "options": options, "word": fake_word, "original_word": word, "root": root,
        "logprob": logprob, "lemma": row["lemma"], "fake_lemma": fake_lemma, "pos": row["pos"], "tag": tag,
        "definition": row["definition"], "synonym": synonym, "definition_sentence": defined,
        "synonym_sentence": synonymous, "contexts": contexts, "continuation": continuation,
        "solved": contexts[int(row["label"])] + continuation, "examples": [],
    }


def add_examples(items: list[dict[str, Any]], seed: Any, shots: int) -> None:
    """Give each item ``shots`` solved texts of other schemas (same bucket and strategy, same twin, another
    root)."""
    by_key: dict[tuple[str, str, int], dict[Any, dict[str, Any]]] = {}
    for item in items:
        by_key.setdefault((item["bucket"], item["strategy"], item["twin"]), {})[item["schema"]] = item
    for item in items:
        same = by_key[(item["bucket"], item["strategy"], item["twin"])]
        pool = [same[schema] for schema in sorted(same, key=str)
                if schema != item["schema"] and same[schema]["root"] != item["root"]]
        chosen = random.Random(f"{seed}:{item['schema']}:shots").sample(pool, min(shots, len(pool)))
        item["examples"] = [other["solved"] for other in chosen]


@step("winodict.items")
def items(rows: list[dict[str, Any]], args: dict[str, Any], ctx: Context) -> Outcome:
    """WinoDict items from concept rows: one per twin and bucket (``args.buckets``, default all six), in the
    ``args.strategy`` prompt form (default ``definition_last``), each with ``args.shots`` (5) solved examples; with
    ``args.original_without_definition`` (default true) the ``unchanged`` bucket also in strategy ``none``, the
    paper's Table 2 "Original" (the strategy's own unchanged items are its Table 3 "Original / <strategy>")."""
    buckets = list(args.get("buckets") or BUCKETS)
    strategy = str(args.get("strategy", "definition_last"))
    synonym_source = str(args.get("synonym", "lemma"))
    shots = int(args.get("shots", SHOTS))
    plain_original = args.get("original_without_definition", True)
    if not isinstance(plain_original, bool):
        raise RunnerError(f"winodict.items: original_without_definition must be true or false, not "
                          f"{plain_original!r}")
    seed = args.get("seed", ctx.seed)
    unknown = [name for name in buckets if name not in BUCKETS]
    if unknown:
        raise RunnerError(f"winodict.items: unknown bucket {unknown[0]!r} (known: {', '.join(BUCKETS)})")
    if strategy not in STRATEGIES:
        raise RunnerError(f"winodict.items: unknown strategy {strategy!r} (known: {', '.join(STRATEGIES)})")
    if synonym_source not in ("lemma", "wordnet"):
        raise RunnerError(f"winodict.items: synonym must be lemma or wordnet, not {synonym_source!r}")
    words = load_words(_data_file(args.get("words"), "original_words.tsv"),
                       _data_file(args.get("exclude"), "wordnet_known.txt"))
    out = Outcome(rows=[])
    forms = [(bucket, strategy) for bucket in buckets]
    if plain_original and strategy != "none" and "unchanged" in buckets:
        forms.insert(forms.index(("unchanged", strategy)) + 1, ("unchanged", "none"))
    for row in rows:  # a twin's buckets together, so the first N items (`--limit`) span every bucket
        for bucket, form in forms:
            built = build_item(row, bucket, words, seed, form, synonym_source)
            if isinstance(built, str):
                out.dropped[built] += 1
                continue
            if form != strategy:  # the extra Original item: its own id
                built["_id"] = built["id"] = f"{built['id']}-{form}"
            out.rows.append(built)
    add_examples(out.rows, seed, shots)
    for item in out.rows:
        del item["solved"]
    return out
