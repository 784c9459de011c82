"""What tells a disturbed walk of a set's elements (``readsets.walked``): a key listed twice,
told apart from what a set legitimately lists twice (an interval set's end element beside the
next range's start with the same key). A dynamic set in a whole-table read is not checked.

The kernel's side (a hash map's dump that meets its resize) is shown in
``tests/kernel/test_nft_read_walk.py``."""

from __future__ import annotations

import pytest

from nlproxy.nft.dump import Disturbed, Interrupted
from nlproxy.nft.ir import DataType, SetFlag
from nlproxy.nft.readsets import RawSet, _parse_elements, _walked_raw, walked
from nlproxy.nft.uapi import NFT_SET_ELEM_INTERVAL_END
from tests.unit.test_readsets_layouts import element, message

NO_FLAGS = SetFlag(0)
K1, K2, K3 = (bytes([10, 0, 0, i]) for i in (1, 2, 3))


def raw_set(flags: SetFlag = NO_FLAGS) -> RawSet:
    return RawSet(
        name="backends",
        flags=int(flags),
        key=(DataType.IPV4_ADDR,),
        key_len=4,
        data=(),
        timeout_ms=0,
        comment="",
    )


def test_a_repeated_key_is_a_disturbed_walk_that_names_the_set() -> None:
    with pytest.raises(Disturbed) as info:
        walked("backends", 100_000, 93_826)
    assert isinstance(info.value, Interrupted)  # the retries of an interrupted dump apply
    assert info.value.why == (
        "set backends: 6174 of 100000 elements listed twice (and as many left out):"
        " its hash table moved during the dump"
    )
    walked("backends", 100_000, 100_000)


@pytest.mark.parametrize(
    ("flags", "elements", "disturbed"),
    [
        pytest.param(SetFlag(0), [K1, K2, K3], False, id="distinct-keys"),
        pytest.param(SetFlag(0), [K1, K2, K1], True, id="key-twice"),
        pytest.param(SetFlag.EVAL, [K1, K2, K1], False, id="dynamic-set-not-checked"),
        pytest.param(SetFlag.TIMEOUT, [K1, K2, K1], False, id="timeout-set-not-checked"),
    ],
)
def test_keys_of_a_plain_set(flags: SetFlag, elements: list[bytes], disturbed: bool) -> None:
    raw = _parse_elements(message(*(element(k) for k in elements)))
    if disturbed:
        with pytest.raises(Disturbed):
            _walked_raw(raw_set(flags), raw)
    else:
        _walked_raw(raw_set(flags), raw)


def test_an_end_element_sharing_the_next_start_key_is_no_repeat() -> None:
    end = NFT_SET_ELEM_INTERVAL_END
    # 10.0.0.1-10.0.0.1 and 10.0.0.2-10.0.0.2: the first range's end has the second's start key
    ranges = [element(K1), element(K2, flags=end), element(K2), element(K3, flags=end)]
    interval = raw_set(SetFlag.INTERVAL)
    _walked_raw(interval, _parse_elements(message(*ranges)))
    with pytest.raises(Disturbed):
        _walked_raw(interval, _parse_elements(message(*ranges, element(K2))))


def test_a_concatenated_range_is_told_by_its_end_too() -> None:
    interval = raw_set(SetFlag.INTERVAL)
    ranges = [element(K1, key_end=K2), element(K1, key_end=K3)]
    _walked_raw(interval, _parse_elements(message(*ranges)))
    with pytest.raises(Disturbed):
        _walked_raw(interval, _parse_elements(message(*ranges, element(K1, key_end=K3))))
