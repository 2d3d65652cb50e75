"""The wire form of a moved prefix (launcher/hf/kv_transfer.py's KVPrefix): what crosses a socket between a prefill
engine and a decode engine comes back as it left, in every dtype the pool takes, and a pool of another shape is
told why it cannot take it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from launcher.hf.blocks import block_hashes  # noqa: E402
from launcher.hf.kv_transfer import KVPrefix  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_wire_form_gives_back_the_tokens_keys_and_values(dtype):
    data = torch.randn(3, 2, 2, 4, 2, 8).to(dtype)  # 3 layers, keys and values, 2 blocks of 4, 2 heads x 8
    prefix = KVPrefix(tuple(range(10, 18)), 4, data)
    back = KVPrefix.from_bytes(prefix.to_bytes())
    assert back.tokens == prefix.tokens and back.block_size == 4 and back.data.dtype == dtype
    assert torch.equal(back.data, data) and back.nbytes == data.numel() * data.element_size()
    assert back.keys == block_hashes(list(range(10, 18)), 4) and back.num_blocks == 2
    assert back.shape_problem(3, 2, 8, 4, dtype) == ""


def test_an_empty_prefix_travels_too():
    empty = KVPrefix((), 16, torch.empty(2, 2, 0, 16, 1, 4))
    back = KVPrefix.from_bytes(empty.to_bytes())
    assert back.tokens == () and back.num_blocks == 0 and tuple(back.data.shape) == (2, 2, 0, 16, 1, 4)


def test_a_pool_of_another_shape_is_told_why():
    prefix = KVPrefix(tuple(range(8)), 4, torch.zeros(3, 2, 2, 4, 2, 8))
    assert "both engines must serve one model at one tensor-parallel size" in prefix.shape_problem(
        3, 1, 8, 4, torch.float32
    )
    assert "give both one block_size" in prefix.shape_problem(3, 2, 8, 8, torch.float32)
    assert "give both one dtype" in prefix.shape_problem(3, 2, 8, 4, torch.bfloat16)
