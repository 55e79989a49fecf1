"""bench/gpu/decode.py's layout names: the split-count and append suffixes, and the refusals."""
import pytest

from gpu_scripts import load_gpu_script


def test_layout_suffixes_give_splits_and_append():
    m = load_gpu_script("decode")
    assert m.parse_layout("contiguous") == ("contiguous", 0, False)
    assert m.parse_layout("contiguous:s2") == ("contiguous", 2, False)
    assert m.parse_layout("page16:a") == ("page16", 0, True)
    assert m.parse_layout("page256:s3:a") == ("page256", 3, True)
    assert m.parse_layout("page256:a:s12") == ("page256", 12, True)


@pytest.mark.parametrize("layout", ["contiguous:x", "contiguous:s", "page16:sa"])
def test_unknown_suffix_is_refused(layout):
    with pytest.raises(ValueError, match="unknown suffix"):
        load_gpu_script("decode").parse_layout(layout)


@pytest.mark.parametrize("layout", ["cudnn:a", "func:a", "func-forward:a", "packed:a"])
def test_sdpa_and_func_layouts_refuse_append(layout):
    with pytest.raises(ValueError, match="only tileattn"):
        load_gpu_script("decode").calls(layout, None, [(None, None)], None)


def test_func_layouts_refuse_splits():
    with pytest.raises(ValueError, match="no :sN"):
        load_gpu_script("decode").calls("func:s2", None, [(None, None)], None)


@pytest.mark.parametrize("layout", ["varlen16:a", "varlen256:s2"])
def test_varlen_layouts_refuse_append_and_splits(layout):
    with pytest.raises(ValueError, match="neither"):
        load_gpu_script("decode").calls(layout, None, [(None, None)], None)


@pytest.mark.parametrize("layout", ["varlen", "varlen16-copy", "varlenx"])
def test_varlen_layout_names_are_checked(layout):
    with pytest.raises(ValueError, match="varlenN"):
        load_gpu_script("decode").varlen_call(layout, None, None, None, None)
