"""Prepare WinoDict's key concepts from the Winograd Schema Challenge collection, offline and deterministically.

WinoDict (Eisenschlos et al., EACL 2023, §2.1) rewrites Winograd twins: the one word that differs between the two
sentences of a schema (the key concept) is replaced by a synthetic word whose definition is given in the prompt.
The authors' generator tags the key word with spaCy and defines its lemma with the first WordNet synset's gloss.
Neither spaCy's models nor NLTK's WordNet download are reachable here, so this script reads WordNet 3.0's own files
(Debian ``wordnet-base``: /usr/share/wordnet) and tags with a small rule (``tag_word``); the output is committed,
and the job (``jobs/winodict-build.yaml``) only reads ``data/winodict/``.

(Over ~450 lines because it is one offline program run once by hand, whose steps below read and check one
collection in order; nothing in the runner imports it.)

Steps:

1. Read the 285 schemas of ``WSCollection.xml`` (checked against the ``.csv`` copy) and rebuild each sentence as
   txt1 + pronoun + txt2: whitespace collapsed, no space before punctuation, a final "." where it is missing (the
   generator adds one too), and the fixes in ``TEXT_FIXES``.
2. Pair the twins as the generator does for Winograd: schemas with the same two candidate answers, in collection
   order, two by two. Rows left over (a third variant, twins whose candidates differ) are counted and left out.
3. The key concept: the twins' tokens (the pronoun as one marker token) minus their common prefix and suffix must be
   exactly one token on each side; other pairs are dropped (several tokens, an insertion, the pronoun moved).
4. Tag each twin's key word (``tag_word``), take its lemma with WordNet's morphy (exception lists, then the
   detachment rules), and define it: the first synset of the lemma in that part of speech (adverbs: adjective
   synsets first, as the generator does), its gloss without the quoted examples and the tails the generator trims,
   and one synonym (another lemma of that synset) where WordNet has one. Pairs whose key word is a function word
   (preposition, particle, conjunction, wh-word, a form of "be", a modal, a quantifier, a number) or has no WordNet
   entry are dropped, as the generator drops what spaCy does not tag VERB/NOUN/ADJ/ADV and the lemmas "be", "more",
   "less", "few".
5. ``TAG_OVERRIDES`` and ``SENSE_OVERRIDES`` are the hand fixes made after reading every row.

Outputs in ``data/winodict/``: ``concepts.jsonl`` (one line per twin), ``wordnet_known.txt`` (the synthetic words
whose VB, JJ or NN form WordNet already knows: the generator never draws them), and byte-for-byte copies of
``original_words.tsv`` and ``morph_rules.txt``. The counts are printed.

    python scripts/winodict_concepts.py [--seed-data DIR] [--wordnet DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import shutil
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORDNET_POS = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}

# ---------------------------------------------------------------------------------------------------------------
# Hand fixes (each checked by eye; each says why)
# ---------------------------------------------------------------------------------------------------------------

#: text fixes applied to txt1/pron/txt2/answers before anything else: (wrong, right, why)
TEXT_FIXES = (
    ("recieved", "received", "typo in schema 4; the schema's own <quote2> has 'had received'"),
    ("\u00c3\u0082", "", "mojibake of a non-breaking space in schemas 283/284 (the .csv has a plain space)"),
)

#: WSC index of the twin -> (tag, lemma), where the rule in ``tag_word`` is wrong
TAG_OVERRIDES: dict[int, tuple[str, str]] = {
    10: ("RB", "fast"),  # "was going so fast": an adverb (the degree rule says JJ)
    11: ("RB", "slow"),  # "was going so slow"
    13: ("VBN", "crush"),  # "Frank felt crushed": the verb's participle (the rule finds the adjective "crushed")
    28: ("RBR", "good"),  # "did a lot better than": a comparative adverb, defined by "good" as the generator does
    29: ("RBR", "bad"),  # "did a lot worse than"
    83: ("RB", "here"),  # "he would be here by this time": an adverb (the rule says JJ after "be")
    102: ("VBN", "remove"),  # "I have to get it removed": a participle (the rule reads "it" as a subject)
    103: ("VBN", "repair"),  # "I have to get it repaired"
    150: ("RBR", "late"),  # "lived two centuries later"
    151: ("RBR", "early"),  # "lived two centuries earlier"
    247: ("JJ", "embarrassed"),  # "They were embarrassed about it": the adjective, as the generator defines it
}

#: WSC index of the twin -> WordNet synset (nltk's name: first lemma.pos.sense number), where the first synset is
#: the wrong sense in this sentence. Most are the generator's own choices for the same lemma and sense.
SENSE_OVERRIDES: dict[int, str] = {
    5: "give.v.03",  # transfer possession (not "cause to have, in the abstract sense")
    13: "crush.v.05",  # humiliate or depress completely (not "oppress")
    18: "short.a.03",  # "he is so short": low in stature (not the temporal sense)
    73: "high.a.02",  # the shelf is high: elevation (not "greater than normal in degree")
    78: "anguished.s.01",  # "He is very hurt": mental pain (not a physical injury)
    81: "lose.v.02",  # "he would have lost" (a game): fail to win
    82: "go.v.03",  # "he would be gone by this time": move away from a place
    83: "here.r.01",  # in or at this place
    93: "bark.v.04",  # make barking sounds (not "speak in an unfriendly tone")
    115: "doubting.s.01",  # marked by or given to doubt (not about religion)
    118: "intrigue.v.01",  # "They are gripped": cause to be interested or curious (not "hold fast")
    175: "stag.n.02",  # "hunted for deer": WordNet's only deer sense is a taxonomic note; the generator's choice
    177: "appear.v.05",  # "They appeared two years ago": come into being (not "give a certain impression")
    178: "dogged.s.01",  # "very persistent" journalists: stubbornly unyielding (not "never-ceasing")
    179: "cooperative.a.02",  # working with others for a common purpose (not "joint activity")
    180: "discontinue.v.01",  # "trying to stop the drug trade": put an end to (not "come to a halt")
    181: "operate.v.01",  # "trying to run the drug trade": direct or control (not "move fast on foot")
    186: "minority.n.02",  # "in the minority": the smaller in number of two parts (not an ethnic group)
    192: "leave.v.07",  # "it left a hole": have as a result or residue (not "go away")
    201: "bang-up.s.01",  # "looks great on her": very good (not "relatively large")
    213: "deliver.v.02",  # "delivered the final report": bring to a destination (not a speech)
    220: "move.v.02",  # "moved his bishop": cause to move into a new position (not "change location")
    221: "take.v.08",  # "took his bishop": take into one's possession (not "carry out")
    222: "airstrip.n.01",  # "the landing strip" (not "a long narrow piece")
    223: "gear.n.04",  # "the landing gear": equipment (not a toothed wheel)
    226: "full.s.04",  # "he was full" after eating: filled to satisfaction with food
    232: "stretch.v.02",  # "Stretching her back": extend one's limbs or muscles (not "occupy an elongated area")
    233: "stroke.v.01",  # "Patting her back": touch lightly and repeatedly (WordNet's pat.v.01 defines it by "pat")
    234: "accept.v.02",  # "wouldn't accept his toy": receive willingly (not "hold as true")
    235: "share.v.02",  # "wouldn't share his toy": use jointly (not "have in common")
    237: "concentration.n.05",  # "breaking her concentration": complete attention (not a solution's strength)
    238: "sympathetic.a.02",  # "a sympathetic look": feeling sympathy (not the nervous system)
    246: "angered.s.01",  # "They were furious": marked by extreme anger (not "violent energy")
    247: "embarrassed.s.02",  # made to feel uncomfortable because of shame
}

# ---------------------------------------------------------------------------------------------------------------
# Word classes for the tagging rule
# ---------------------------------------------------------------------------------------------------------------

_words = str.split
PREPOSITIONS = set(_words(
    "about above across after against along among around at before behind below beneath beside between beyond by "
    "down during except for from in inside into near of off on onto out outside over past since through throughout "
    "till to toward towards under until up upon via with within without back away together apart"))
CONJUNCTIONS = set(_words("and but or nor yet so because although though while if unless whereas whether than as"))
WH_WORDS = set(_words("who whom whose which what why where when how whoever whatever"))
DETERMINERS = set(_words(
    "the a an this that these those my your his her its our their such some any no every each another all both "
    "either neither"))
PRONOUNS = set(_words(
    "i me you he him she it we us they them myself yourself himself herself itself ourselves themselves one"))
SUBJECTS = set(_words("i you he she it we they who which that"))
BE = set(_words("be am is are was were been being 's 're 'm isn't aren't wasn't weren't"))
PERFECT = set(_words("have has had having 've 'd haven't hasn't hadn't"))
VERB_BEFORE_BASE = set(_words(
    "to do does did don't doesn't didn't can could will would shall should may might must can't cannot couldn't "
    "won't wouldn't shouldn't mustn't"))
LINKING = set(_words(
    "feel feels felt look looks looked seem seems seemed become becomes became get gets got gotten getting"))
DEGREE = set(_words("too so very more less most least quite rather really extremely pretty fairly"))
SKIPPABLE = set(_words("not n't never also still always already just even"))
QUANTIFIERS = set(_words("more less most least few fewer fewest many much several"))
NUMBERS = set(_words(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand million"))
FUNCTION_WORDS = (PREPOSITIONS | CONJUNCTIONS | WH_WORDS | DETERMINERS | PRONOUNS | BE | VERB_BEFORE_BASE
                  | QUANTIFIERS | NUMBERS | {"not", "n't", "there", "then", "too", "very"})
POSSESSIVE_PRONOUNS = {"his", "her", "its", "their"}

TOKEN = re.compile(r"\w+(?:['’-]\w+)*|[^\w\s]")
PRONOUN_MARK = "<pronoun>"


# ---------------------------------------------------------------------------------------------------------------
# WordNet 3.0 from its own files
# ---------------------------------------------------------------------------------------------------------------

#: WordNet's detachment rules (morphy(7WN)), tried after the exception lists
DETACHMENT = {
    "n": (("s", ""), ("ses", "s"), ("xes", "x"), ("zes", "z"), ("ches", "ch"), ("shes", "sh"), ("men", "man"),
          ("ies", "y")),
    "v": (("s", ""), ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""), ("ing", "e"), ("ing", "")),
    "a": (("er", ""), ("est", ""), ("er", "e"), ("est", "e")),
    "r": (),
}


@dataclass(frozen=True)
class Synset:
    name: str  # nltk's naming: the synset's first lemma, its pos letter, that lemma's sense number
    lemmas: tuple[str, ...]
    definition: str


class WordNet:
    """The index, exception lists and data files of WordNet 3.0 (``/usr/share/wordnet``)."""

    def __init__(self, folder: Path) -> None:
        self.index: dict[str, dict[str, list[int]]] = {pos: {} for pos in WORDNET_POS}
        self.exceptions: dict[str, dict[str, list[str]]] = {pos: {} for pos in WORDNET_POS}
        self._data: dict[str, bytes] = {}
        for pos, name in WORDNET_POS.items():
            with open(folder / f"index.{name}", encoding="utf-8") as lines:
                for line in lines:
                    if line.startswith(" "):
                        continue  # the licence header
                    fields = line.split()
                    count, pointers = int(fields[2]), int(fields[3])
                    offsets = [int(offset) for offset in fields[4 + pointers + 2:]]
                    assert len(offsets) == count, line
                    self.index[pos][fields[0]] = offsets
            with open(folder / f"{name}.exc", encoding="utf-8") as lines:
                for line in lines:
                    form, *bases = line.split()
                    self.exceptions[pos].setdefault(form, []).extend(bases)
            self._data[pos] = (folder / f"data.{name}").read_bytes()

    def morphy(self, form: str, pos: str) -> list[str]:
        """The lemmas ``form`` may be an inflection of (itself first when it is one), as nltk's ``_morphy``: the
        exception list when it has the form, else the detachment rules; kept when the index has them."""
        form = form.lower().replace(" ", "_")
        if form in self.exceptions[pos]:
            candidates = [form, *self.exceptions[pos][form]]
        else:
            candidates = [form] + [form[: -len(old)] + new for old, new in DETACHMENT[pos] if form.endswith(old)]
        out: list[str] = []
        for candidate in candidates:
            if candidate in self.index[pos] and candidate not in out:
                out.append(candidate)
        return out

    def known(self, form: str) -> bool:
        """Whether WordNet has a synset for ``form`` in any part of speech (nltk's ``wordnet.synsets(form)``)."""
        return any(self.morphy(form, pos) for pos in WORDNET_POS)

    def synsets(self, lemma: str, pos: str) -> list[Synset]:
        return [self._synset(offset, pos) for offset in self.index[pos].get(lemma.lower(), [])]

    def synset(self, name: str) -> Synset:
        """A synset by nltk's name, e.g. ``fear.v.01``: the n-th sense of that lemma (``s``: an adjective)."""
        lemma, pos, number = name.rsplit(".", 2)
        pos = "a" if pos == "s" else pos
        return self._synset(self.index[pos][lemma][int(number) - 1], pos)

    def _synset(self, offset: int, pos: str) -> Synset:
        data = self._data[pos]
        line = data[offset:data.index(b"\n", offset)].decode("utf-8")
        columns, gloss = line.split(" | ", 1)
        fields = columns.split()
        count = int(fields[3], 16)
        lemmas = tuple(re.sub(r"\(\w+\)$", "", fields[4 + 2 * i]) for i in range(count))
        first = lemmas[0].lower()
        number = self.index[pos][first].index(offset) + 1
        letter = "s" if fields[2] == "s" else pos
        return Synset(f"{first}.{letter}.{number:02d}", lemmas, nltk_definition(gloss))


def nltk_definition(gloss: str) -> str:
    """The gloss without its quoted examples, as nltk's ``Synset.definition()``."""
    return re.sub(r'"[^"]*"', "", gloss).strip().strip("; ").strip()


def clean_definition(definition: str) -> str:
    """The generator's trimming of a WordNet definition: tails after "; ;", "; --", "; e.g." and "(sometimes used
    in combinations", the "(literal meaning)" labels, and a leading "to". The "; --" cut is widened to "; -" so
    that an example's attribution ("- George Meredith") goes with it."""
    for tail in ("; ;", "; -", "; e.g.", " (sometimes used in combinations"):
        definition = definition.split(tail)[0]
    definition = definition.replace("(literal meaning) ", "").replace("literal meanings; ", "")
    return definition[3:] if definition.startswith("to ") else definition


# ---------------------------------------------------------------------------------------------------------------
# The Winograd schemas
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Twin:
    index: int  # position in the collection (0-284), the same in the .xml and the .csv
    sentence: str
    pronoun: str
    pronoun_at: int  # character offset of the pronoun in ``sentence``
    answers: tuple[str, str]
    label: int  # index of the correct answer
    source: str

    def tokens(self) -> list[tuple[str, int]]:
        """(token, character offset); the pronoun is one marker token."""
        out = []
        for match in TOKEN.finditer(self.sentence):
            if match.start() == self.pronoun_at:
                out.append((PRONOUN_MARK, match.start()))
            elif not self.pronoun_at < match.start() < self.pronoun_at + len(self.pronoun):
                out.append((match.group(0), match.start()))
        return out


def _norm(text: str | None) -> str:
    text = text or ""
    for wrong, right, _why in TEXT_FIXES:
        text = text.replace(wrong, right)
    return " ".join(text.split())


def read_wsc(xml_path: Path, csv_path: Path) -> list[Twin]:
    twins = []
    for index, schema in enumerate(ET.parse(xml_path).getroot().iter("schema")):
        text = schema.find("text")
        assert text is not None
        txt1, pronoun, txt2 = (_norm(text.findtext(part)) for part in ("txt1", "pron", "txt2"))
        answers = tuple(_norm(answer.text) for answer in schema.iter("answer"))
        correct = (schema.findtext("correctAnswer") or "").strip().rstrip(".").strip()
        assert len(answers) == 2 and correct in ("A", "B"), (index, answers, correct)
        head = f"{txt1} " if txt1 else ""
        tail = txt2 if not txt2 or re.match(r"[.,;:!?]", txt2) else f" {txt2}"
        sentence = head + pronoun + tail
        if not re.search(r"[.!?\"']$", sentence):
            sentence += "."
        twins.append(Twin(index, sentence, pronoun, len(head), (answers[0], answers[1]), "AB".index(correct),
                          _norm(schema.findtext("source"))))
    with open(csv_path, encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(twins), (len(rows), len(twins))
    for twin, row in zip(twins, rows, strict=True):  # the two copies agree on everything used here
        assert (_norm(row["answer_0"]), _norm(row["answer_1"])) == twin.answers, twin.index
        assert int(row["label"]) == twin.label and _norm(row["pron"]) == twin.pronoun, twin.index
        plain = re.sub(r" (?=[.,;:!?]$)", "", _norm(row["plain_text"]))
        assert plain.rstrip(".") == twin.sentence.rstrip("."), (twin.index, plain, twin.sentence)
    return twins


def pair_twins(twins: list[Twin]) -> tuple[list[tuple[Twin, Twin]], list[Twin]]:
    """Twins share their two candidate answers: group by them in collection order and pair two by two (the
    generator's rule for Winograd). Returns the pairs and the rows left over."""
    groups: dict[tuple[str, str], list[Twin]] = {}
    for twin in twins:
        groups.setdefault(twin.answers, []).append(twin)
    pairs, left = [], []
    for members in groups.values():
        for k in range(0, len(members) - 1, 2):
            first, second = members[k], members[k + 1]
            if first.label == second.label:
                left.extend((first, second))
            else:
                pairs.append((first, second))
        if len(members) % 2:
            left.append(members[-1])
    pairs.sort(key=lambda pair: pair[0].index)
    return pairs, left


def key_words(first: Twin, second: Twin) -> int | str:
    """The token position of the one token that differs between the twins, or why there is none."""
    a, b = [t for t, _ in first.tokens()], [t for t, _ in second.tokens()]
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    end = 0
    while end < min(len(a), len(b)) - start and a[-1 - end] == b[-1 - end]:
        end += 1
    diff_a, diff_b = a[start:len(a) - end], b[start:len(b) - end]
    if PRONOUN_MARK in diff_a + diff_b:
        return "the difference includes the pronoun"
    if len(diff_a) != 1 or len(diff_b) != 1:
        return "the key concept is several tokens (or none)"
    return start


# ---------------------------------------------------------------------------------------------------------------
# Tagging and definitions
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Concept:
    word: str
    word_at: int
    tag: str
    pos: str
    lemma: str
    synset: str
    definition: str
    synonym: str | None


def _context(tokens: list[tuple[str, int]], i: int, possessive: bool) -> tuple[str, str]:
    """The previous token (skipping "not" and the like) and the next one, lowercased; the pronoun marker reads
    as "<det>" when it is possessive ("his toy") and "<subj>" otherwise."""
    def word(k: int) -> str:
        if not 0 <= k < len(tokens):
            return ""
        text = tokens[k][0]
        if text == PRONOUN_MARK:
            return "<det>" if possessive else "<subj>"
        return text.lower()

    k = i - 1
    while word(k) in SKIPPABLE:
        k -= 1
    return word(k), word(i + 1)


def _is_participle(w: str, wn: WordNet) -> bool:
    lemmas = wn.morphy(w, "v")
    return bool(lemmas) and lemmas[0] != w and (w in wn.exceptions["v"] or w.endswith(("ed", "en")))


def _is_comparative(w: str, wn: WordNet) -> bool:
    if w in wn.exceptions["a"] and w.endswith(("er", "se")):
        return True
    return w.endswith("er") and any(lemma != w for lemma in wn.morphy(w, "a"))


def _noun_tag(w: str, wn: WordNet) -> str:
    return "NNS" if w.endswith("s") and any(lemma != w for lemma in wn.morphy(w, "n")) else "NN"


def _finite_verb_tag(w: str, wn: WordNet) -> str:
    if w.endswith("ed") or (w in wn.exceptions["v"] and not w.endswith("s")):
        return "VBD"
    if w.endswith("s") and any(lemma != w for lemma in wn.morphy(w, "v")):
        return "VBZ"
    return "VB"


def tag_word(tokens: list[tuple[str, int]], i: int, possessive: bool, wn: WordNet) -> str:
    """The Penn tag of token ``i`` from its neighbours, WordNet's POS index and its suffix. The first rule that
    applies wins:

    1. after "to", "do"/"did" or a modal (skipping "not", "never" ...): VB;
    2. after a form of "have": VBN;
    3. after a degree word (too, so, very, more ...): JJR for a comparative, else JJ, else RB;
    4. after a form of "be" or a linking verb (felt, looks, got): VBG for "-ing", VBN for a verb's participle
       (passives: "has to be cleaned"), JJR for a comparative, JJ for an adjective, else a noun;
    5. after a determiner or a possessive (the pronoun "his" counts): JJ/JJR when a word follows and WordNet has
       the adjective ("a sympathetic look"), else a noun (NNS when plural);
    6. after a preposition: a noun;
    7. after a subject (a personal pronoun, the Winograd pronoun) or a plural noun: a finite verb (VBD for past
       forms, VBZ for "-s", else VB);
    8. otherwise by suffix: "-ing" VBG, comparative JJR, "-ed" VBD, then the first of noun, adjective, verb, adverb
       that WordNet has.
    """
    w = tokens[i][0].lower()
    has = {pos: bool(wn.morphy(w, pos)) for pos in WORDNET_POS}
    prev, nxt = _context(tokens, i, possessive)
    if prev in VERB_BEFORE_BASE and has["v"]:
        return "VB"
    if prev in PERFECT and has["v"]:
        return "VBN"
    if prev in DEGREE:
        if _is_comparative(w, wn):
            return "JJR"
        return "JJ" if has["a"] else "RB" if has["r"] else _noun_tag(w, wn)
    if prev in BE or prev in LINKING:
        if w.endswith("ing") and has["v"]:
            return "VBG"
        if _is_participle(w, wn):
            return "VBN"
        if _is_comparative(w, wn):
            return "JJR"
        if has["a"]:
            return "JJ"
        if has["n"]:
            return _noun_tag(w, wn)
    if prev in DETERMINERS or prev == "<det>" or prev.endswith("'s"):
        if nxt[:1].isalpha() and nxt not in PREPOSITIONS and has["a"]:
            return "JJR" if _is_comparative(w, wn) else "JJ"
        if has["n"]:
            return _noun_tag(w, wn)
    if prev in PREPOSITIONS and has["n"]:
        return _noun_tag(w, wn)
    if (prev in SUBJECTS or prev == "<subj>" or (prev.endswith("s") and wn.morphy(prev, "n"))) and has["v"]:
        return _finite_verb_tag(w, wn)
    if w.endswith("ing") and has["v"]:
        return "VBG"
    if _is_comparative(w, wn):
        return "JJR"
    if w.endswith("ed") and has["v"]:
        return "VBD"
    if has["n"]:
        return _noun_tag(w, wn)
    if has["a"]:
        return "JJ"
    if has["v"]:
        return _finite_verb_tag(w, wn)
    if has["r"]:
        return "RB"
    raise LookupError(w)


def lemma_for(word: str, tag: str, wn: WordNet) -> str:
    """The WordNet lemma of ``word`` under ``tag``: an inflected tag prefers a lemma other than the form itself
    ("arms" is the noun "arm", not "arms" = weapons; "better" is "good"), a base tag the form itself."""
    w = word.lower()
    if tag in ("RB", "RBR"):
        candidates = wn.morphy(w, "a") or wn.morphy(w, "r")
    else:
        candidates = wn.morphy(w, {"V": "v", "N": "n", "J": "a"}[tag[0]])
    if not candidates:
        raise LookupError(f"{w}: no {tag} lemma")
    if tag in ("VBD", "VBN", "VBG", "VBZ", "NNS", "JJR", "RBR"):
        changed = [lemma for lemma in candidates if lemma != w]
        if changed:
            return changed[0]
    return candidates[0]


def define(lemma: str, tag: str, wn: WordNet, override: str | None) -> tuple[Synset, str, str | None]:
    """The first synset of ``lemma`` in the tag's part of speech (adverbs: adjective synsets first, as the
    generator does) or the override, its cleaned definition, and one synonym from that synset."""
    if override:
        synset = wn.synset(override)
    else:
        if tag.startswith("RB"):
            found = wn.synsets(lemma, "a") + wn.synsets(lemma, "r")
        else:
            found = wn.synsets(lemma, {"V": "v", "N": "n", "J": "a"}[tag[0]])
        if not found:
            raise LookupError(f"{lemma}: no synset for {tag}")
        synset = found[0]
    synonyms = [name.replace("_", " ") for name in synset.lemmas if name.lower() != lemma.lower()]
    return synset, clean_definition(synset.definition), (synonyms[0] if synonyms else None)


def _next_is_word(tokens: list[tuple[str, int]], at: int) -> bool:
    for k, (_, offset) in enumerate(tokens):
        if offset == at:
            return k + 1 < len(tokens) and tokens[k + 1][0][:1].isalpha()
    return False


def analyse(twin: Twin, position: int, wn: WordNet) -> Concept | str:
    """The key concept of one twin, or why the pair is dropped."""
    tokens = twin.tokens()
    word, word_at = tokens[position]
    w = word.lower()
    pronoun = twin.pronoun.lower()
    possessive = pronoun in POSSESSIVE_PRONOUNS and (pronoun != "her" or _next_is_word(tokens, twin.pronoun_at))
    prev, _ = _context(tokens, position, possessive)
    after_determiner = prev in DETERMINERS or prev == "<det>"
    if w.isdigit() or (w in FUNCTION_WORDS and not (after_determiner and wn.morphy(w, "n"))):
        return "the key word is a function word or a number"  # "her will" is a noun, "he will" is not
    if twin.index in TAG_OVERRIDES:
        tag, lemma = TAG_OVERRIDES[twin.index]
    else:
        try:
            tag = tag_word(tokens, position, possessive, wn)
        except LookupError:
            return "the key word has no WordNet entry"
        lemma = lemma_for(word, tag, wn)
    synset, definition, synonym = define(lemma, tag, wn, SENSE_OVERRIDES.get(twin.index))
    pos = {"V": "VERB", "N": "NOUN", "J": "ADJ", "R": "ADV"}[tag[0]]
    return Concept(word, word_at, tag, pos, lemma, synset.name, definition, synonym)


# ---------------------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------------------


def build(seed_data: Path, wordnet: Path, out: Path) -> Counter[str]:
    wn = WordNet(wordnet)
    twins = read_wsc(seed_data / "WSC" / "WSCollection.xml", seed_data / "WSC" / "WSCollection.csv")
    pairs, left = pair_twins(twins)
    counts: Counter[str] = Counter({"schemas in the collection": len(twins), "twin pairs": len(pairs),
                                    "rows left unpaired": len(left)})
    lines = []
    for number, (first, second) in enumerate(pairs):
        found = key_words(first, second)
        if isinstance(found, str):
            counts[f"pairs dropped: {found}"] += 1
            continue
        concepts = [analyse(first, found, wn), analyse(second, found, wn)]
        reasons = [c for c in concepts if isinstance(c, str)]
        if reasons:
            counts[f"pairs dropped: {reasons[0]}"] += 1
            continue
        counts["pairs kept"] += 1
        for twin_number, (twin, concept) in enumerate(zip((first, second), concepts, strict=True), start=1):
            assert isinstance(concept, Concept)
            counts[f"twins tagged {concept.tag}"] += 1
            lines.append({
                "id": f"{number}-{twin_number}", "schema": number, "twin": twin_number, "wsc_index": twin.index,
                "sentence": twin.sentence, "pronoun": twin.pronoun, "pronoun_at": twin.pronoun_at,
                "options": list(twin.answers), "label": twin.label, "answer": twin.answers[twin.label],
                "word": concept.word, "word_at": concept.word_at, "lemma": concept.lemma, "tag": concept.tag,
                "pos": concept.pos, "synset": concept.synset, "definition": concept.definition,
                "synonym": concept.synonym, "source": twin.source,
            })
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "concepts.jsonl", "w", encoding="utf-8", newline="\n") as handle:
        for line in lines:
            handle.write(json.dumps(line, ensure_ascii=False) + "\n")
    for name in ("original_words.tsv", "morph_rules.txt"):
        shutil.copyfile(seed_data / "WinoDict" / name, out / name)
    known = set()
    with open(seed_data / "WinoDict" / "original_words.tsv", encoding="utf-8") as handle:
        for line in handle:
            root, _score, morph = line.rstrip("\n").split("\t")
            forms = dict(part.split(":", 1) for part in morph.split(","))
            if any(wn.known(forms[tag]) for tag in ("VB", "JJ", "NN")):
                known.add(root)
    (out / "wordnet_known.txt").write_text("".join(f"{root}\n" for root in sorted(known)), encoding="utf-8")
    counts["synthetic words known to WordNet"] = len(known)
    counts["concept rows"] = len(lines)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Prepare WinoDict's key concepts (data/winodict/concepts.jsonl).")
    parser.add_argument("--seed-data", type=Path, default=ROOT.parent / "shared" / "seed-data")
    parser.add_argument("--wordnet", type=Path, default=Path("/usr/share/wordnet"))
    parser.add_argument("--out", type=Path, default=ROOT / "data" / "winodict")
    args = parser.parse_args(argv)
    if not (args.wordnet / "index.noun").exists():
        print(f"no WordNet 3.0 in {args.wordnet}: apt-get install wordnet-base", file=sys.stderr)
        return 1
    for key, value in sorted(build(args.seed_data, args.wordnet, args.out).items()):
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
