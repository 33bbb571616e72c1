"""Calibration data: images and tensors become input samples; bad files name themselves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from npubuild.errors import UserError
from npubuild.quant.data import InputInfo, State, load_samples, sources_and_samples
from npubuild.recipe.model import Preprocess

NCHW = InputInfo("images", (1, 3, 16, 20), "float32", "NCHW",
                 Preprocess(resize=(16, 20), scale=1 / 255, mean=[0.5, 0.5, 0.5], std=0.25))


def png(tmp_path: Path, name="a.png", mode="RGB", size=(40, 30), color=(255, 0, 128)) -> Path:
    path = tmp_path / name
    Image.new(mode, size, color if mode != "L" else 200).save(path)
    return path


def test_image_is_resized_scaled_normalised_and_laid_out(tmp_path):
    (sample,) = load_samples([png(tmp_path)], [NCHW])
    x = sample["images"]
    assert x.shape == (1, 3, 16, 20) and x.dtype == np.float32
    assert np.allclose(x[0, :, 5, 5], [(1 - 0.5) / 0.25, (0 - 0.5) / 0.25, (128 / 255 - 0.5) / 0.25], atol=1e-5)


def test_bgr_nhwc_and_gray(tmp_path):
    bgr = InputInfo("x", (1, 8, 8, 3), "float32", "NHWC", Preprocess(channel_order="BGR"))
    (s,) = load_samples([png(tmp_path)], [bgr])
    assert s["x"].shape == (1, 8, 8, 3) and list(s["x"][0, 0, 0]) == [128, 0, 255]
    gray = InputInfo("x", (1, 1, 8, 8), "float32", "any", Preprocess(channel_order="GRAY"))
    (s,) = load_samples([png(tmp_path, "g.png", "L")], [gray])
    assert s["x"].shape == (1, 1, 8, 8) and s["x"].max() == 200


def test_rgba_and_samples_limit(tmp_path):
    files = [png(tmp_path, f"{i}.png", "RGBA", color=(1, 2, 3, 4)) for i in range(5)]
    assert len(list(load_samples(files, [NCHW], 3))) == 3


def test_npy_and_npz_shapes(tmp_path):
    info = InputInfo("x", (1, 3, 4, 4))
    np.save(tmp_path / "one.npy", np.ones((1, 3, 4, 4)))
    np.save(tmp_path / "nobatch.npy", np.ones((3, 4, 4)))
    np.save(tmp_path / "stack.npy", np.ones((5, 3, 4, 4)))
    np.savez(tmp_path / "named.npz", x=np.zeros((2, 3, 4, 4)))
    files = [tmp_path / n for n in ("one.npy", "nobatch.npy", "stack.npy", "named.npz")]
    samples = list(load_samples(files, [info]))
    assert len(samples) == 1 + 1 + 5 + 2
    assert all(s["x"].shape == (1, 3, 4, 4) and s["x"].dtype == np.float32 for s in samples)


def test_each_sample_names_its_file_and_its_place_in_a_stack(tmp_path):
    info = InputInfo("x", (1, 3, 4, 4))
    np.save(tmp_path / "one.npy", np.ones((1, 3, 4, 4)))
    np.save(tmp_path / "stack.npy", np.ones((3, 3, 4, 4)))
    found = list(sources_and_samples([tmp_path / "one.npy", tmp_path / "stack.npy"], [info]))
    assert [s.label() for s, _ in found] == ["one.npy", "stack.npy[0]", "stack.npy[1]",
                                            "stack.npy[2]"]
    assert all(s.image is None for s, _ in found)


def test_a_batch_of_images_is_one_sample_of_several_files(tmp_path):
    batch = InputInfo("images", (2, 3, 16, 20), "float32", "NCHW", NCHW.preprocess)
    files = [png(tmp_path, f"{i}.png") for i in range(4)]
    found = list(sources_and_samples(files, [batch]))
    assert [s.label() for s, _ in found] == ["0.png + 1.png", "2.png + 3.png"]
    assert found[1][0].image == files[2] and found[1][1]["images"].shape == (2, 3, 16, 20)


def test_npz_for_two_inputs(tmp_path):
    infos = [InputInfo("a", (1, 2)), InputInfo("b", (1, 3))]
    np.savez(tmp_path / "s.npz", a=np.ones((1, 2)), b=np.ones((1, 3)))
    (s,) = load_samples([tmp_path / "s.npz"], infos)
    assert set(s) == {"a", "b"}
    np.savez(tmp_path / "bad.npz", a=np.ones((1, 2)))
    with pytest.raises(UserError, match="bad.npz.*no array for input.*'b'"):
        list(load_samples([tmp_path / "bad.npz"], infos))


@pytest.mark.parametrize("writer, message", [
    (lambda p: np.save(p / "d.npy", np.ones((1, 3, 5, 5))), r"d\.npy: array for 'x' has shape \[1, 3, 5, 5\]"),
    (lambda p: np.save(p / "d.npy", np.full((1, 3, 4, 4), np.nan)), r"d\.npy: 48 NaN or Inf"),
    (lambda p: np.save(p / "d.npy", np.array([{"a": 1}], dtype=object)), r"d\.npy: cannot read the array"),
    (lambda p: (p / "d.png").write_bytes(b"not a png"), r"d\.png: cannot read the image"),
    (lambda p: (p / "d.txt").write_text("x"), r"d\.txt: cannot use 'd\.txt' as calibration data"),
])
def test_bad_files_are_user_errors_naming_the_file(tmp_path, writer, message):
    writer(tmp_path)
    (path,) = sorted(tmp_path.iterdir())
    info = InputInfo("x", (1, 3, 4, 4), "float32", "NCHW", Preprocess())
    with pytest.raises(UserError, match=message) as exc:
        list(load_samples([path], [info]))
    assert exc.value.exit_code == 2


def test_channel_count_mismatch(tmp_path):
    one_channel = InputInfo("x", (1, 1, 8, 8), "float32", "NCHW", Preprocess(channel_order="RGB"))
    with pytest.raises(UserError, match=r"a\.png: input 'x' has 1 channels but images are decoded as RGB"):
        list(load_samples([png(tmp_path)], [one_channel]))


def test_images_need_a_single_input(tmp_path):
    with pytest.raises(UserError, match="one input"):
        list(load_samples([png(tmp_path)], [InputInfo("a", (1, 3, 8, 8)), InputInfo("b", (1, 3, 8, 8))]))


def test_no_files():
    with pytest.raises(UserError, match="no calibration files"):
        list(load_samples([], [NCHW]))


# --- a streaming model's states ------------------------------------------------------------


def ring_inputs(calls: list | None = None, output: str | None = "ring_out") -> list[InputInfo]:
    """A streaming model's inputs: ``x`` [1, 1, 2] and the state ``ring`` [1, 3, 2] (initially
    -1), which the model shifts ``x`` into; each step of the float model is logged in
    ``calls``."""
    def step(sample):
        if calls is not None:
            calls.append(sample["x"].ravel().tolist())
        return {"y": sample["x"].sum(), "ring_out": np.concatenate(
            [sample["ring"][:, 1:], sample["x"]], axis=1)}

    return [InputInfo("x", (1, 1, 2)),
            InputInfo("ring", (1, 3, 2), state=State(np.full((1, 3, 2), -1.0), output, step))]


def test_a_state_the_data_do_not_hold_is_stepped_over_each_files_calls(tmp_path):
    """microWakeWord's data as a user writes them hold the audio alone (the state inputs import
    made of its resource variables are the model's): they stopped on 'no array for input(s)
    'stream_6/states''. A file's samples are consecutive calls: the first from the initial
    state, each next from the state the model output on the call before; each file anew."""
    np.save(tmp_path / "a.npy", np.arange(8, dtype=np.float32).reshape(4, 1, 2))  # 4 calls
    np.savez(tmp_path / "b.npz", x=np.full((2, 1, 2), 9.0))  # another stream: 2 calls
    calls: list = []
    samples = list(load_samples([tmp_path / "a.npy", tmp_path / "b.npz"], ring_inputs(calls)))
    rings = [s["ring"][0, :, 0].tolist() for s in samples]
    assert rings == [[-1, -1, -1], [-1, -1, 0], [-1, 0, 2], [0, 2, 4], [-1, -1, -1], [-1, -1, 9]]
    assert all(s["ring"].dtype == np.float32 and s["ring"].shape == (1, 3, 2) for s in samples)
    assert calls == [[0, 1], [2, 3], [4, 5], [9, 9]]  # each call stepped once, none past the last
    assert len(list(load_samples([tmp_path / "a.npy"], ring_inputs(calls), 2))) == 2
    assert len(calls) == 5  # a limit steps no further than the samples it gives


def test_a_state_the_data_hold_is_used_as_given(tmp_path):
    given = np.arange(6, dtype=np.float32).reshape(1, 3, 2)
    np.savez(tmp_path / "s.npz", x=np.ones((2, 1, 2)), ring=np.stack([given, given + 1])[:, 0])
    calls: list = []
    samples = list(load_samples([tmp_path / "s.npz"], ring_inputs(calls)))
    assert [s["ring"].tolist() for s in samples] == [given.tolist(), (given + 1).tolist()]
    assert calls == []


def test_a_missing_input_without_an_initial_value_is_one_error_naming_it(tmp_path):
    np.savez(tmp_path / "s.npz", ring=np.zeros((1, 3, 2)))
    with pytest.raises(UserError, match=r"no array for input\(s\) 'x'; the file has 'ring'"):
        list(load_samples([tmp_path / "s.npz"], ring_inputs()))
    np.savez(tmp_path / "t.npz", y=np.zeros((1, 1, 2)), z=np.zeros((1, 1, 2)))
    with pytest.raises(UserError, match=r"no array for input\(s\) 'x'"):
        list(load_samples([tmp_path / "t.npz"], ring_inputs()))


def test_a_state_the_model_does_not_output_feeds_only_a_streams_first_call(tmp_path):
    """A state whose new value the model does not output (a cut left it out) cannot be stepped:
    one error naming it past the first call, not its initial value fed again silently."""
    np.save(tmp_path / "a.npy", np.zeros((3, 1, 2), np.float32))
    [first] = load_samples([tmp_path / "a.npy"], ring_inputs(output=None), 1)
    assert first["ring"].tolist() == np.full((1, 3, 2), -1.0).tolist()
    with pytest.raises(UserError, match=r"state input\(s\) 'ring' are not in the data and the "
                                        "model does not output their new value"):
        list(load_samples([tmp_path / "a.npy"], ring_inputs(output=None)))
