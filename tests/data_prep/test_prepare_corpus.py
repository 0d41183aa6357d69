"""The raw-corpus converter and the committed sample corpus it made."""

import os

from data_prep.corpus.sample import convert_text, format_documents, split_sentences
from tests.data_prep.helpers import SAMPLE

PLAY = """HAMLET

by William Shakespeare


PERSONS REPRESENTED.

HAMLET, Prince of Denmark.


ACT I.

SCENE 1. Elsinore. A platform before the Castle.

[Francisco at his post. Enter to him Bernardo.]

Ber.
Who's there?

Fran.
Nay, answer me: stand, and unfold yourself. Long live the king!

SCENE 2. Elsinore. A room of state in the Castle.

HAMLET.
O, that this too too solid flesh would melt,
Thaw, and resolve itself into a dew! Or that the Everlasting had not fix'd
His canon 'gainst self-slaughter!
"""

ARTICLE = """## A title line
### START: page_0.txt ###
#### Source: http://example.org/x.tif

p.772:0

First paragraph of the entry. It has two sentences.

Second paragraph. Dr Bradley said so.
### END: page_0.txt ###
"""


def test_play_scenes_become_documents_without_labels_or_directions():
    docs = convert_text(PLAY)
    assert docs == [
        ["Who's there?", "Nay, answer me: stand, and unfold yourself.", "Long live the king!"],
        ["O, that this too too solid flesh would melt, Thaw, and resolve itself into a dew!",
         "Or that the Everlasting had not fix'd His canon 'gainst self-slaughter!"],
    ]


def test_article_markers_removed_and_paragraphs_grouped():
    docs = convert_text(ARTICLE, paragraphs_per_doc=1)
    assert docs == [["First paragraph of the entry.", "It has two sentences."],
                    ["Second paragraph.", "Dr Bradley said so."]]
    assert format_documents(docs) == ("First paragraph of the entry.\nIt has two sentences.\n\n"
                                      "Second paragraph.\nDr Bradley said so.\n\n")
    assert split_sentences("One.  Two!\nthree? Four") == ["One.", "Two! three?", "Four"]


def test_sample_corpus_is_in_the_input_format():
    total = sum(os.path.getsize(p) for p in SAMPLE)
    assert 500_000 < total <= 1_000_000
    docs = 0
    for path in SAMPLE:
        text = open(path, encoding="utf-8").read()
        assert text.endswith("\n\n") and "\n\n\n" not in text
        for line in text.split("\n"):
            assert line == line.strip()
            assert not line.startswith("#") and not line.startswith("p.77")
        docs += text.count("\n\n")
    assert docs == 269
