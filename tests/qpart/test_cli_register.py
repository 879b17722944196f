"""``qpart models register``'s warnings of the cuts a device runtime cannot run (issue 48): every
distinct reason, up to five, with the cuts each keeps off that runtime."""

from __future__ import annotations

from qpart.cli import _warn_runtimes


def test_every_distinct_reason_is_warned_with_its_cuts(capsys):
    onnx = {c: "ONNX segment uses operator 'Resize', which is not in the allow-list" for c in (3, 4, 9)}
    onnx |= {5: "ONNX segment uses operator 'Pad', which is not in the allow-list",
             7: "ONNX segment node 2 (Einsum -> 'c'): ..."}
    _warn_runtimes({"torch": {}, "onnx": onnx}, 12)
    out, err = capsys.readouterr()
    assert out == "  torch devices: every cut\n"
    assert err.splitlines() == [
        "  warning: onnx devices: 7 of 12 cuts (cut 0 always); 5 refused:",
        "    3 cuts (3, 4, 9): ONNX segment uses operator 'Resize', which is not in the allow-list",
        "    1 cut (5): ONNX segment uses operator 'Pad', which is not in the allow-list",
        "    1 cut (7): ONNX segment Einsum: ...",
    ]


def test_more_than_five_reasons_are_counted(capsys):
    _warn_runtimes({"onnx": {c: f"reason {c}" for c in range(1, 9)}}, 9)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 7 and err[-1].startswith("    and 3 more reasons")
