"""build_series' text helpers on hand-made input: a top-level function's block, the per-file sections of a
patch that starts with one, and the counts of a binary, an empty and a plain file section."""
import sys
from pathlib import Path

import pytest

PATCHES = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PATCHES))
import build_series  # noqa: E402

SOURCE = "import os\n\ndef one(): return X\ndef two():\n    y = 1\n\n\n    return y\n\n\nCONST = 2\n"


def test_top_level_block_ends_at_the_next_top_level_statement():
    assert build_series.top_level_block(SOURCE, "one", "src.py") == "def one(): return X\n"
    assert build_series.top_level_block(SOURCE, "two", "src.py") == "def two():\n    y = 1\n\n\n    return y\n"
    with pytest.raises(build_series.BuildError, match=r"^src.py: upstream has no top-level function 'three'$"):
        build_series.top_level_block(SOURCE, "three", "src.py")


def test_sections_of_a_patch_that_starts_with_a_diff():
    text = "diff --git a/x.py b/x.py\n+a\ndiff --git a/y.py b/y.py\n+b\n"
    assert build_series.split_sections(text) == {"x.py": "diff --git a/x.py b/x.py\n+a\n",
                                                 "y.py": "diff --git a/y.py b/y.py\n+b\n"}
    assert build_series.split_sections("no diff here") == {}


def test_section_stats_of_binary_empty_and_plain_sections():
    binary = ("diff --git a/b.bin b/b.bin\nindex 1..2 100644\nGIT binary patch\nliteral 300\nzcmX\n\n"
              "literal 1200\nzcmY\n")
    assert build_series.section_stats(binary, "b.bin") == (0, 0, (1200, 300), False)
    with pytest.raises(build_series.BuildError, match=r"^b.bin: binary diff must hold two literal hunks$"):
        build_series.section_stats(binary.split("literal 1200")[0], "b.bin")
    empty = "diff --git a/e.py b/e.py\nnew file mode 100644\nindex 0000000..e69de29\n"
    assert build_series.section_stats(empty, "e.py") == (0, 0, None, True)
    plain = "diff --git a/p.py b/p.py\n--- a/p.py\n+++ b/p.py\n@@ -1,2 +1,2 @@\n-a\n+b\n c\n"
    assert build_series.section_stats(plain, "p.py") == (1, 1, None, False)


def test_section_stats_counts_changed_lines_that_look_like_file_headers():
    # an added line whose text is '++ x' and a removed one whose text is '-- y': git counts both
    section = ("diff --git a/m.py b/m.py\nindex 1111111..2222222 100644\n--- a/m.py\n+++ b/m.py\n"
               "@@ -1,2 +1,2 @@\n keep\n--- y\n+++ x\n")
    assert build_series.section_stats(section, "m.py") == (1, 1, None, False)
