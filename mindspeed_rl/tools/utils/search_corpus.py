"""A local search corpus: a JSONL file of ``{"id": ..., "contents": "<title>\\n<text>"}`` (the format of
upstream's retriever corpus), searched with BM25 (``bm25s``, the ``agent`` extra). Hits are returned in the
retrieval server's form, ``{"document": {"id", "contents"}, "score"}``; documents sharing no word with the
query (score 0) are left out."""
import json
from typing import List


def _bm25s():
    try:
        import bm25s
    except ImportError:
        raise ValueError("corpus_path needs the bm25s package: pip install 'mindspeed_rl[agent]'") from None
    return bm25s


class LocalCorpus:
    def __init__(self, path: str) -> None:
        bm25s = _bm25s()
        self.documents = self._load(path)
        tokens = bm25s.tokenize([d["contents"] for d in self.documents], stopwords="en", show_progress=False)
        self.retriever = bm25s.BM25()
        self.retriever.index(tokens, show_progress=False)

    @staticmethod
    def _load(path: str) -> List[dict]:
        documents = []
        try:
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, start=1):
                    if not line.strip():
                        continue
                    try:
                        doc = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise ValueError(f"corpus_path {path} line {number}: not valid JSON ({e.msg})") from None
                    if not isinstance(doc, dict) or not isinstance(doc.get("contents"), str):
                        raise ValueError(f"corpus_path {path} line {number}: needs a string 'contents'")
                    documents.append({"id": doc.get("id"), "contents": doc["contents"]})
        except OSError as e:
            raise ValueError(f"corpus_path {path}: cannot be read ({e.strerror})") from None
        if not documents:
            raise ValueError(f"corpus_path {path}: holds no documents")
        return documents

    def search(self, queries: List[str], topk: int) -> List[List[dict]]:
        """Per query, up to ``topk`` hits, best first."""
        bm25s = _bm25s()
        k = min(topk, len(self.documents))
        out = []
        for tokens in bm25s.tokenize(queries, stopwords="en", return_ids=False, show_progress=False):
            indices, scores = self.retriever.retrieve([tokens], k=k, show_progress=False)
            out.append([{"document": self.documents[int(i)], "score": float(s)}
                        for i, s in zip(indices[0], scores[0]) if s > 0])
        return out
