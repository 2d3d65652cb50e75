"""The hf engine's KV-cache pool and prefix cache (launcher/hf/blocks.py): blocks handed out and given back, reference
counts, the chained keys of full blocks, the longest cached prefix, and least-recently-freed eviction."""

from __future__ import annotations

import pytest

from launcher.hf.blocks import NULL_BLOCK, BlockPool, block_hashes


def test_blocks_are_handed_out_and_given_back_and_the_null_block_never():
    pool = BlockPool(num_blocks=5, block_size=4)
    assert pool.capacity == 4 and pool.num_free == 4
    a = pool.allocate(3)
    assert len(a) == 3 and NULL_BLOCK not in a and pool.num_free == 1
    assert pool.allocate(2) is None and pool.num_free == 1  # not enough: nothing taken
    b = pool.allocate(1)
    assert sorted(a + b) == [1, 2, 3, 4] and pool.num_free == 0 and pool.usage() == 1.0
    pool.free(a)
    assert pool.num_free == 3
    with pytest.raises(ValueError, match="at least 2 blocks"):
        BlockPool(num_blocks=1, block_size=4)


def test_a_keys_chain_covers_every_token_before_its_block():
    same = block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    assert len(same) == 2  # the partial third block has no key
    assert block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4) == same
    other_first = block_hashes([9, 2, 3, 4, 5, 6, 7, 8], 4)
    assert other_first[1] != same[1]  # block 2 has the same tokens but another prefix: another key
    assert block_hashes([5, 6, 7, 8], 4, 0, same[0]) == same[1:]  # continued from a parent key


def test_the_longest_cached_prefix_is_found_and_shared():
    pool = BlockPool(num_blocks=10, block_size=4)
    system = list(range(100, 108))  # two full blocks
    first = pool.allocate(3)
    pool.publish(first[:2], block_hashes(system, 4))
    blocks, keys = pool.match(system + [1, 2, 3, 4, 5], limit=3)
    assert blocks == first[:2] and keys == block_hashes(system, 4)  # the third block differs: not cached
    assert pool.match([0] + system, limit=3) == ([], [])
    shorter, _ = pool.match(system[:4] + [0, 0, 0, 0], limit=3)
    assert shorter == first[:1]  # a shorter shared prefix
    assert pool.match(system, limit=1)[0] == first[:1]  # no more than the limit
    pool.free(blocks), pool.free(shorter), pool.free(first[:1])  # the matching requests end
    assert pool.num_free == 6  # 9 less the first request's 3, which it still holds
    pool.free(first)  # the first request ends: its cached blocks stay findable, its partial one is free again
    assert pool.num_free == 9 and pool.num_cached == 2
    assert pool.match(system, limit=2)[0] == first[:2]


def test_unreferenced_cached_blocks_are_evicted_least_recently_freed_first():
    pool = BlockPool(num_blocks=5, block_size=2)
    a, b = pool.allocate(2), pool.allocate(2)
    pool.publish(a, block_hashes([1, 2, 3, 4], 2))
    pool.publish(b, block_hashes([5, 6, 7, 8], 2))
    assert pool.num_cached == 4
    pool.free(a)  # freed first: evicted first, its last block before its first
    pool.free(b)
    assert pool.num_free == 4 and pool.num_cached == 4  # nothing is forgotten until the pool needs the blocks
    got = pool.allocate(1)
    assert got == [a[1]] and pool.match([1, 2, 3, 4], limit=2)[0] == [a[0]]  # a's prefix head is still there
    pool.free([a[0]])
    assert pool.match([5, 6, 7, 8], limit=2)[0] == b  # b untouched
    pool.free(b)


def test_a_block_in_use_is_not_evicted_and_a_matched_one_is_referenced():
    pool = BlockPool(num_blocks=3, block_size=2)
    a = pool.allocate(1)
    pool.publish(a, block_hashes([1, 2], 2))
    pool.free(a)
    hit, _ = pool.match([1, 2, 3], limit=1)
    assert hit == a and pool.num_free == 1  # referenced again: out of the evictable set
    assert pool.allocate(2) is None
    pool.free(hit)
    assert pool.num_free == 2


def test_without_prefix_caching_nothing_is_found():
    pool = BlockPool(num_blocks=4, block_size=2, prefix_caching=False)
    a = pool.allocate(1)
    pool.publish(a, block_hashes([1, 2], 2))
    assert pool.match([1, 2, 3], limit=1) == ([], []) and pool.num_cached == 0


def test_a_key_another_block_holds_stays_with_it():
    """Two requests that computed the same prefix at once: the first published block is the one found."""
    pool = BlockPool(num_blocks=4, block_size=2)
    a, b = pool.allocate(1), pool.allocate(1)
    keys = block_hashes([1, 2], 2)
    pool.publish(a, keys)
    pool.publish(b, keys)
    pool.free(b)
    assert pool.match([1, 2, 3], limit=1)[0] == a


def test_the_pool_records_what_becomes_findable_and_what_is_evicted_as_kv_cache_events():
    """serve.routing=kv: the engine publishes these after each step (launcher.kv_events); the front end's index
    (launcher.frontend.kv_index) keys them by their tokens, which chain to the same keys as block_hashes."""
    from launcher.frontend.kv_index import KvIndex

    pool = BlockPool(num_blocks=4, block_size=4, events=[])
    a = pool.allocate(2)
    tokens = list(range(8))
    keys = block_hashes(tokens, 4)
    pool.publish(a[:1], keys[:1], tokens[:4], None)
    pool.publish(a[1:], keys[1:], tokens[4:], keys[0])  # a later step: the next block, its parent named
    assert [e["type"] for e in pool.events] == ["BlockStored", "BlockStored"]
    assert pool.events[1]["parent_block_hash"] == keys[0] and pool.events[1]["token_ids"] == tokens[4:]
    index = KvIndex(1)
    index.apply(0, 0, [0.0, pool.events, None])
    assert index.holders == {keys[0]: 1, keys[1]: 1}
    pool.events.clear()
    pool.free(a)
    pool.allocate(3)  # the free block, then both cached ones, least recently freed first
    assert pool.events == [
        {"type": "BlockRemoved", "block_hashes": [keys[1]], "medium": "GPU"},
        {"type": "BlockRemoved", "block_hashes": [keys[0]], "medium": "GPU"},
    ]
    index.apply(0, 1, [0.0, pool.events, None])
    assert index.holders == {}
    # a block whose key another block holds is said once, when that block stored it: the events around it part
    pool = BlockPool(num_blocks=8, block_size=4, events=[])
    tokens = list(range(12))
    keys = block_hashes(tokens, 4)
    pool.publish(pool.allocate(1), keys[:1], tokens[:4])
    other = pool.allocate(3)
    pool.publish(other, keys, tokens)  # keys[0] is held already: only keys[1:] became findable here
    assert [(e["block_hashes"], e["parent_block_hash"]) for e in pool.events] == [
        (keys[:1], None),
        (keys[1:], keys[0]),
    ]
    assert pool.events[1]["token_ids"] == tokens[4:]
    off = BlockPool(num_blocks=4, block_size=4, prefix_caching=False, events=[])
    off.publish(off.allocate(1), keys[:1], tokens[:4])
    assert off.events == []  # no prefix cache: nothing findable, nothing to say


def test_take_holds_each_cached_key_it_finds_past_a_missing_one():
    """A prefix moved here from another engine may find some of its blocks cached already, not only a leading run:
    take holds every one it finds (so storing the rest cannot evict them) and says None for the others."""
    pool = BlockPool(num_blocks=8, block_size=2)
    keys = block_hashes([1, 2, 3, 4, 5, 6], 2)
    blocks = pool.allocate(3)
    pool.publish(blocks, keys)
    pool.free(blocks)
    b0, _, b2 = blocks
    pool.allocate(4)  # the free blocks first: the cached ones stay
    assert pool.take([keys[0], 12345, keys[2]]) == [b0, None, b2]
    assert pool.allocate(1) == [blocks[1]]  # the one not held is evicted
    assert pool.allocate(1) is None  # the held ones are not
    pool.free([b0, b2])
    assert pool.num_free == 2 and pool.take([keys[0]]) == [b0]  # let go, still cached and findable


def test_a_hold_takes_the_leading_cached_blocks_only_and_gives_back_every_reference():
    """ExportPins.hold on a prompt whose first block was evicted but whose second is still cached holds nothing and
    references nothing (a block past the gap is no prefix); a whole prefix is held until dropped, then evictable."""
    from launcher.hf.blocks import ExportPins

    pool = BlockPool(8, 2)
    prompt = [1, 2, 3, 4, 5]
    keys = block_hashes(prompt[:4], 2)
    a, b = pool.allocate(2)
    pool.publish([a, b], keys, prompt[:4])
    pool.free([a, b])
    pins = ExportPins(pool)
    assert pins.hold(prompt) == 2 and pins and pool.num_free == 5
    pins.drop(keys[-1])
    assert not pins and pool.num_free == 7
    pool.free(pool.take([keys[1]]))  # the second block freed last: the first is evicted first
    pool.allocate(6)  # the 5 free ones and the first block
    assert pool.match(prompt, 2)[0] == [] and pins.hold(prompt) == 0
    assert pool.num_free == 1  # the block still cached past the gap was not referenced
