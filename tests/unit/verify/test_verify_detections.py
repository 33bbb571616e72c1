"""The detection picture draws every verify sample: an image file, or a sample read from an
array file (its input tensor as the model sees it)."""

from __future__ import annotations

import numpy as np
from PIL import Image

from npubuild.verify.detections import boxes, draw, tensor_picture, yolov8_output0


def test_an_nchw_or_nhwc_tensor_becomes_a_picture_of_its_height_and_width():
    x = np.random.default_rng(0).normal(size=(1, 3, 12, 20)).astype(np.float32)
    picture = tensor_picture(x, "NCHW")
    assert picture.size == (20, 12) and picture.mode == "RGB"
    assert np.asarray(picture).min() == 0 and np.asarray(picture).max() == 255
    assert tensor_picture(x.transpose(0, 2, 3, 1), "NHWC").size == (20, 12)
    assert tensor_picture(np.zeros((1, 1, 8, 8)), "any").mode == "L"  # a constant input: black


def test_files_and_tensors_are_drawn_side_by_side_with_their_captions(tmp_path):
    image = tmp_path / "a.png"
    Image.new("RGB", (40, 30), "white").save(image)
    tensor = tensor_picture(np.ones((1, 3, 16, 16)) * np.arange(16), "NCHW")
    boxes = [(2.0, 2.0, 10.0, 10.0, 0, 0.9)]
    out = draw([("a.png", image), ("stack.npy[1]", tensor)], (16, 16),
               [(boxes, boxes), ([], boxes)], ["cat"], tmp_path / "detections.png")
    with Image.open(out) as sheet:
        assert sheet.size[0] == 2 * 300


def test_boxes_and_class_scores_cut_before_the_final_concat_join_into_output0():
    rng = np.random.default_rng(0)
    output0 = np.concatenate([rng.uniform(0, 320, (1, 4, 50)), rng.uniform(0, 1, (1, 3, 50))], 1)
    joined = yolov8_output0({"scores": output0[:, 4:], "boxes": output0[:, :4]}, (320, 320))
    np.testing.assert_array_equal(joined, output0[0])
    assert boxes(joined) == boxes(output0[0]) and boxes(joined)
