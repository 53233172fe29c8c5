"""LocalCorpus on its own: English stop words do not count (in the documents' lengths or the queries), blank lines
are skipped anywhere, each hit keeps its document's id and a positive score, and nothing is printed."""
import json

import pytest

from mindspeed_rl.tools.utils.search_corpus import LocalCorpus


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "c.jsonl"
    docs = [{"id": "padded", "contents": "the the the the cat"}, {"id": "two", "contents": "cat dog"},
            {"id": "far", "contents": "Zürich lake"}]
    path.write_text(json.dumps(docs[0]) + "\n\n   \n" + json.dumps(docs[1]) + "\n\n" + json.dumps(docs[2]) + "\n",
                    encoding="utf-8")
    return str(path)


def test_stop_words_do_not_lengthen_a_document(corpus):
    # without stop words 'padded' is one word long, shorter than 'two': BM25 ranks it first for 'cat'
    hits = LocalCorpus(corpus).search(["cat"], 3)[0]
    assert [h["document"]["id"] for h in hits] == ["padded", "two"]
    assert hits[0]["score"] > hits[1]["score"] > 0


def test_a_query_of_stop_words_finds_nothing(corpus):
    assert LocalCorpus(corpus).search(["the", "of the"], 3) == [[], []]


def test_blank_lines_are_skipped_and_each_hit_keeps_its_document(corpus):
    index = LocalCorpus(corpus)
    assert [d["id"] for d in index.documents] == ["padded", "two", "far"]
    (hit,) = index.search(["zürich"], 3)[0]
    assert set(hit) == {"document", "score"}
    assert hit["document"] == {"id": "far", "contents": "Zürich lake"} and hit["score"] > 0


def test_indexing_and_searching_print_nothing(corpus, capfd):
    LocalCorpus(corpus).search(["cat dog"], 2)
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")
