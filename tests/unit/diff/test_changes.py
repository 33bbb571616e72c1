"""`npubuild.diff.changes`: every changed recipe field as a path with its whole old and new
value; list items added, removed, moved, or changed in place."""

from npubuild.diff.changes import changes

LONG_STEP = {"extract": {"outputs": ["/model.22/Concat_3_output_0", "/model.22/Concat_4_output_0",
                                     "/model.22/Concat_5_output_0"]}}


def lines(a, b):
    return [c.line() for c in changes(a, b)]


def test_an_added_surgery_step_is_shown_whole():
    a = {"surgery": [{"fold_constants": {}}]}
    b = {"surgery": [{"fold_constants": {}}, LONG_STEP]}
    assert lines(a, b) == ['surgery[1]: added {"extract": {"outputs": ["/model.22/Concat_3_output_0", '
                           '"/model.22/Concat_4_output_0", "/model.22/Concat_5_output_0"]}}']


def test_a_removed_step_and_a_changed_argument_of_a_kept_step():
    a = {"surgery": [{"fold_constants": {"tolerance": None}}, LONG_STEP]}
    b = {"surgery": [{"fold_constants": {"tolerance": 0.001}}]}
    found = changes(a, b)
    assert [(c.path, c.kind) for c in found] == [("surgery[0].fold_constants.tolerance", "changed"),
                                                 ("surgery[1]", "removed")]
    assert found[0].line() == "surgery[0].fold_constants.tolerance: null -> 0.001"


def test_a_reordered_step_is_one_move_not_a_removal_and_an_addition():
    a = {"fusion": ["conv_bn", "conv_silu", "silu"]}
    b = {"fusion": ["conv_silu", "silu", "conv_bn"]}
    assert lines(a, b) == ['fusion[0] -> fusion[2]: moved "conv_bn"']


def test_equal_length_runs_compare_item_by_item():
    assert lines({"shape": [1, 3, 8, 8]}, {"shape": [1, 3, 16, 16]}) == ["shape[2]: 8 -> 16",
                                                                         "shape[3]: 8 -> 16"]


def test_a_key_only_one_side_has_is_added_or_removed_and_nulls_inside_values_are_left_out():
    assert lines({"split": {"policy": "npu_first"}},
                 {"split": {"policy": "npu_first", "placement": {"a": "cpu", "b": None}}}) == [
        'split.placement: added {"a": "cpu"}']
    assert lines({"x": 1, "y": 2}, {"x": 1}) == ["y: removed 2"]


def test_identical_values_have_no_changes():
    assert changes({"surgery": [LONG_STEP], "n": 1.5}, {"surgery": [LONG_STEP], "n": 1.5}) == []
