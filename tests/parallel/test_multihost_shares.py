"""How evaluation splits a batch of questions over processes (`share_bounds`), checked by brute force."""

from __future__ import annotations

import pytest

from aepo_jax.parallel.multihost import gather_objects, share_bounds


@pytest.mark.parametrize("parts", [1, 2, 3, 8])
@pytest.mark.parametrize("count", [0, 1, 5, 8, 13])
def test_shares_tile_the_batch_in_order_with_sizes_within_one(count, parts):
    bounds = [share_bounds(count, part, parts) for part in range(parts)]
    covered = [i for start, stop in bounds for i in range(start, stop)]
    assert covered == list(range(count))  # contiguous, in process order, nothing twice
    sizes = [stop - start for start, stop in bounds]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_a_share_that_does_not_exist_is_refused():
    for part, parts in [(2, 2), (-1, 2), (0, 0)]:
        with pytest.raises(ValueError, match="does not exist"):
            share_bounds(4, part, parts)


def test_one_process_gathers_its_own_object():
    obj = {"a": [1, 2]}
    assert gather_objects(obj) == [obj]


def test_mesh_specs_parse_and_bad_ones_name_the_problem():
    from aepo_jax.parallel.mesh import parse_mesh_shape

    assert parse_mesh_shape("data=-1, tensor=2") == {"data": -1, "tensor": 2}
    assert parse_mesh_shape("fsdp=8") == {"fsdp": 8}
    for spec, problem in [("fsdp=2,fsdp=4", "named twice"), ("dp=8", "the axes are"), ("=4", "the axes are"),
                          ("fsdp", "axis=size"), ("fsdp=x", "axis=size"), ("", "axis=size")]:
        with pytest.raises(ValueError, match=problem):
            parse_mesh_shape(spec)
