"""The runtime table (issue 48): per device runtime, the cuts calibration found it can run and why
not the others, from the artifact's ``cuts[i].runtimes_refused``; shown in ``/v2/models/{m}``'s
``runtimes`` parameter."""

from __future__ import annotations

import json
import shutil

from qpart.server.catalog import Catalog
from qpart.server.routes_oip import card_parameters
from qpart.server.segment_index import runtime_table


def test_a_cut_refused_to_a_runtime_is_left_out_of_its_cuts_with_the_reason(cnn_only, tmp_path):
    root = tmp_path / "artifacts"
    shutil.copytree(cnn_only, root)
    path = root / "fmnist-cnn" / "artifact.json"
    doc = json.loads(path.read_text())
    doc["cuts"][5]["runtimes_refused"] = {"onnx": "operator 'Resize' is not in the allow-list"}
    path.write_text(json.dumps(doc))
    model = Catalog.load(root).get("fmnist-cnn")
    table = runtime_table(model)
    assert table["torch"] == {"cuts": list(range(9)), "refused": {}}
    assert table["onnx"] == {"cuts": [0, 1, 2, 3, 4, 6, 7, 8],
                             "refused": {"5": "operator 'Resize' is not in the allow-list"}}
    assert json.loads(card_parameters(model)["runtimes"]) == table
    assert "runtimes" not in card_parameters(model, images=False)  # a tail has no device runtimes
