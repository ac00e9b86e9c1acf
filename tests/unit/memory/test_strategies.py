from kope_mcp.memory.strategies import SAME_STRATEGY_JACCARD, jaccard, strategy_key


def test_near_identical_names_share_a_key():
    assert strategy_key("OpenMP over rows") == strategy_key("omp over the rows")
    assert strategy_key("Tiling for L1") == strategy_key("blocking for l1")


def test_different_strategies_stay_apart():
    assert jaccard(strategy_key("unroll by 4"), strategy_key("OpenMP over rows")) < SAME_STRATEGY_JACCARD
