"""query_experience's weights come from one SelectionConfig: presets by name, any fields from a JSON file, and a
wrong KOPE_SELECTION is refused with what is valid."""

import json

import pytest

from kope_mcp.experience.config import PRESETS, InvalidSelectionError, SelectionConfig, load_selection


def test_the_default_is_the_evidence_preset_and_presets_load_by_name():
    assert load_selection(None) == load_selection("") == PRESETS["evidence"] == SelectionConfig()
    assert load_selection("recency").lessons_by == "recency"


def test_a_json_file_sets_some_fields_and_keeps_the_rest(tmp_path):
    path = tmp_path / "wide-mmr.json"
    path.write_text(json.dumps({"mmr_pool_per_item": 8, "hardware_weight": {"0": 0.1, "1": 0.5, "2": 0.7, "3": 1}}))
    config = load_selection(str(path))
    assert config.name == "wide-mmr" and config.mmr_pool_per_item == 8 and config.hardware_weight[0] == 0.1
    assert config.bm25_weight == SelectionConfig().bm25_weight


def test_a_wrong_selection_names_the_presets_or_the_field(tmp_path):
    with pytest.raises(InvalidSelectionError, match="evidence, recency, text"):
        load_selection("nope")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"no_such_weight": 1}))
    with pytest.raises(InvalidSelectionError, match="no_such_weight"):
        load_selection(str(bad))
