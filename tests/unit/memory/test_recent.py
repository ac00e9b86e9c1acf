"""RecentCache: the least recently used records go first, by count and by size."""

from kope_mcp.memory.recent import RecentCache


def test_the_least_recently_used_value_goes_first_when_the_count_is_reached():
    cache: RecentCache[str, str] = RecentCache(2)
    cache.put("a", "1")
    cache.put("b", "2")
    assert cache.get("a") == "1"  # now b is the least recently used
    cache.put("c", "3")
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == ("1", None, "3")


def test_values_are_evicted_until_their_total_size_fits():
    cache: RecentCache[str, str] = RecentCache(100, max_size=10, size=len)
    cache.put("a", "xxxx")
    cache.put("b", "yyyy")
    cache.put("c", "zzzz")  # 12 > 10: a goes
    assert cache.get("a") is None and cache.get("b") == "yyyy" and cache.get("c") == "zzzz"
    cache.put("b", "y")  # replacing a value counts its new size only
    cache.put("d", "wwww")
    assert cache.get("b") == "y" and cache.get("c") == "zzzz" and cache.get("d") == "wwww"


def test_a_value_larger_than_the_whole_cache_is_not_kept_and_evicts_nothing():
    cache: RecentCache[str, str] = RecentCache(100, max_size=10, size=len)
    cache.put("a", "xxxx")
    cache.put("big", "x" * 11)
    assert cache.get("big") is None and cache.get("a") == "xxxx"
    cache.clear()
    assert cache.get("a") is None
