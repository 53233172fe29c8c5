"""The balance report's lengths files (reports/report_inputs.py read_lengths): the format by extension (any case)
or by content, the values and prompt ids read, and each bad input's one-line message naming file, row and field."""
import pytest

from mindspeed_rl.reports.report_inputs import ReportError, read_lengths

JSONL = '{"prompt_length": 3, "response_length": 5, "prompt_id": {"b": 1, "a": 2}}\n\n' \
        '{"prompt_length": 4.5, "response_length": 0, "prompt_id": " p2 "}\n'
CSV = "prompt_length, response_length ,prompt_id\n3,5,p1\n\n4.5,0, p2 \n"


@pytest.mark.parametrize("name, text", [("a.jsonl", JSONL), ("a.JSON", JSONL), ("a.ndjson", JSONL), ("a.NDJSON", JSONL),
                                        ("a.JSONL", JSONL), ("a.json", JSONL), ("a.txt", "  \n" + JSONL),
                                        ("a.csv", CSV), ("a.CSV", CSV), ("lengths", CSV)])
def test_the_format_comes_from_the_extension_in_any_case_else_from_the_content(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    lengths = read_lengths(str(path))
    assert lengths.prompt.tolist() == [3.0, 4.5] and lengths.response.tolist() == [5.0, 0.0]
    assert lengths.source == str(path)
    first = '{"a": 2, "b": 1}' if "{" in text else "p1"  # a JSON id is its sorted JSON text
    assert lengths.prompt_ids == [first, "p2"]


@pytest.mark.parametrize("name", ["a.csv", "a.jsonl"])
def test_a_json_looking_file_named_otherwise_is_read_as_named(tmp_path, name):
    path = tmp_path / name
    path.write_text(JSONL if name.endswith("csv") else CSV)
    with pytest.raises(ReportError) as err:
        read_lengths(str(path))
    assert str(path) in str(err.value)


@pytest.mark.parametrize("text, message", [
    ('{"prompt_length": true, "response_length": 1}', "row 1 (line 1): prompt_length must be a number, got true"),
    ('{"prompt_length": 1, "response_length": null}', "row 1 (line 1): response_length must be a number, got null"),
    ('{"prompt_length": [1], "response_length": 1}', "row 1 (line 1): prompt_length must be a number, got [1]"),
    ('{"prompt_length": 1, "response_length": -2}', "row 1 (line 1): negative response_length -2"),
    ('{"prompt_length": "inf", "response_length": 1}', "row 1 (line 1): prompt_length must be finite, got inf"),
    ('[1, 2]', "line 1: expected a JSON object, got list"),
    ('{"x": 1}', "line 1: missing prompt_length, response_length"),
    ('{"prompt_length": 1, "response_length": 1, "prompt_id": "a"}\n{"prompt_length": 1, "response_length": 1}',
     "row 2 (line 2): no prompt_id while other rows have one"),
    ('{"prompt_length": 1, "response_length": 1}\n{"prompt_length": 1, "response_length": 1, "prompt_id": "a"}',
     "row 1 (line 1): no prompt_id while other rows have one"),
])
def test_bad_jsonl_rows_are_named(tmp_path, text, message):
    path = tmp_path / "l.jsonl"
    path.write_text(text)
    with pytest.raises(ReportError) as err:
        read_lengths(str(path))
    assert str(err.value) == f"{path} {message}" or str(err.value) == f"{path}: {message}"


@pytest.mark.parametrize("text, message", [
    ("prompt_length,response_length\n1,\n", " row 1 (line 2): empty response_length"),
    ("prompt_length,response_length\n,1\n", " row 1 (line 2): empty prompt_length"),
    ("prompt_length,response_length\n1,x\n", " row 1 (line 2): response_length must be a number, got 'x'"),
    ("prompt_id,other\n1,2\n", " line 1: CSV header lacks column prompt_length, response_length (found: prompt_id, other)"),
    ("prompt_length,response_length\n\n", " has no rows"),
    ("", " has no rows"),
])
def test_bad_csv_rows_are_named(tmp_path, text, message):
    path = tmp_path / "l.csv"
    path.write_text(text)
    with pytest.raises(ReportError) as err:
        read_lengths(str(path))
    assert str(err.value) == f"{path}{message}"


def test_an_empty_csv_id_cell_is_no_id_and_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "l.csv"
    path.write_text("prompt_length,response_length,prompt_id\n1,2, \n\n3,4,\n5,6,\n")
    lengths = read_lengths(str(path))
    assert lengths.prompt.tolist() == [1, 3, 5] and lengths.prompt_ids is None
    path.write_text("prompt_length,response_length,prompt_id\n1,2,a\n3,4, \n")
    with pytest.raises(ReportError, match=r"row 2 \(line 3\): no prompt_id while other rows have one"):
        read_lengths(str(path))


def test_a_json_file_is_read_as_jsonl_whatever_it_starts_with(tmp_path):
    path = tmp_path / "l.json"
    path.write_text('[{"prompt_length": 1, "response_length": 1}]\n')
    with pytest.raises(ReportError, match=r"l.json line 1: expected a JSON object, got list$"):
        read_lengths(str(path))
    path = tmp_path / "l.NDJSON"
    path.write_text('7\n')
    with pytest.raises(ReportError, match=r"l.NDJSON line 1: expected a JSON object, got int$"):
        read_lengths(str(path))


def test_csv_rows_of_empty_cells_are_skipped_not_the_end(tmp_path):
    path = tmp_path / "l.csv"
    path.write_text("prompt_length,response_length\n1,2\n,\n3,4\n")
    assert read_lengths(str(path)).prompt.tolist() == [1, 3]


def test_a_byte_order_mark_a_folder_and_a_binary_file(tmp_path):
    path = tmp_path / "l.csv"
    path.write_bytes("\ufeffprompt_length,response_length\n1,2\n".encode("utf-8"))
    assert read_lengths(str(path)).response.tolist() == [2]
    with pytest.raises(ReportError) as err:
        read_lengths(str(tmp_path))
    assert str(err.value) == f"{tmp_path} is a folder, expected a file"
    path.write_bytes(b"prompt_length,response_length\n1,\xff\n")
    with pytest.raises(ReportError) as err:
        read_lengths(str(path))
    assert str(err.value) == f"{path} is not a UTF-8 text file"
